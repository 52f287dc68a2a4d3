"""The ``sordino`` command itself: what ``--help`` imports and shows, and Ctrl-C at any moment.

Each case runs the real entry point in a subprocess, as a shell runs it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from sordino.cli.group import Group
from sordino.cli.main import cli

# What serving, reports and load tests need; none of it is needed to print help.
SERVING = (
    "numpy", "onnxruntime", "onnx", "matplotlib", "statsmodels", "PIL", "grpc",
    "google.protobuf", "starlette", "uvicorn", "aiohttp", "psutil", "sordino.server",
)  # fmt: skip

_RUN = """
import atexit, sys
heavy = {heavy!r}
atexit.register(lambda: print("IMPORTED", *sorted(m for m in heavy if m in sys.modules)))
from sordino.cli.entry import main
for args in {commands!r}:
    sys.argv = ["sordino", *args]
    try:
        main()
    except SystemExit as exc:
        assert exc.code in (0, None), (args, exc.code)
"""


def _imported(commands: list[list[str]], heavy: tuple[str, ...]) -> list[str]:
    code = _RUN.format(heavy=heavy, commands=commands)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("IMPORTED")]
    return line.split()[1:]


def test_help_imports_none_of_the_server() -> None:
    """Issue 27: `sordino --help` took 1.3-3.5 s importing numpy, ONNX Runtime, gRPC..."""
    assert _imported([["--help"]], SERVING) == []


def test_each_command_help_imports_none_of_the_server() -> None:
    commands = [[name, "--help"] for name in cli.commands]
    commands += [
        [name, sub, "--help"]
        for name, command in cli.commands.items()
        for sub in getattr(command, "commands", {})
    ]
    assert _imported(commands, SERVING) == []


def test_help_shows_every_command_summary_whole() -> None:
    """Issue 27: the generate line was cut at "(e.g." and others ended in "..."."""
    result = subprocess.run(
        [sys.executable, "-m", "sordino", "--help"], capture_output=True, text=True, timeout=60,
        env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    commands = result.stdout.partition("Commands:")[2]
    assert commands and "..." not in commands
    # The column is as wide as the longest command name (share-strategy).
    assert re.search(
        r"\n  generate +Generate an image for a prompt and write it as a PNG\.\n", commands
    )


def test_no_summary_is_cut_in_any_group() -> None:
    """Every group lists whole sentences ("(e.g." was where memory resize's ended)."""
    groups = [cli, *(c for c in cli.commands.values() if isinstance(c, click.Group))]
    for group in groups:
        assert isinstance(group, Group), group.name
        for name, command in group.commands.items():
            summary = command.get_short_help_str(limit=200)
            assert summary.endswith("."), (group.name, name, summary)
            assert summary.count("(") == summary.count(")"), (group.name, name, summary)


# Put on the path of the command's Python: Ctrl-C arrives while sordino.cli.main imports.
_SITECUSTOMIZE = """
import sys

class _CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "sordino.cli.main":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, _CtrlC())
"""


@pytest.mark.parametrize("how", ["console script", "python -m sordino"])
def test_ctrl_c_during_imports_exits_130_with_one_line(tmp_path: Path, how: str) -> None:
    """Issue 27: Ctrl-C while the command was still importing printed a traceback."""
    (tmp_path / "sitecustomize.py").write_text(_SITECUSTOMIZE, encoding="utf-8")
    script = Path(sys.executable).parent / "sordino"
    argv = [str(script)] if how == "console script" else [sys.executable, "-m", "sordino"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [*argv, "start", "--help"], capture_output=True, text=True, timeout=60, env=env
    )
    assert (result.returncode, result.stderr, result.stdout) == (130, "interrupted\n", "")
