"""The start command's on/off switches, written as the brief writes them or as plain flags."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.cli.start import start
from tests.cli.conftest import sordino_start


def _digits() -> Path:
    import sordino.models.builtin as builtin

    return Path(builtin.__file__).parent / "digits-classifier.onnx"


def test_the_brief_memory_command_starts_with_its_values(tmp_path: Path) -> None:
    """``--enable-memory-pool true`` as the brief writes it; the live configuration says so."""
    # runtime start --model sd3_deploy.om --memory-strategy "fragmentation_aware" \
    #   --enable-memory-pool true --pool-size "2GB" --defrag-interval "5m"
    args = ["--model", str(_digits()), "--memory-strategy", "fragmentation_aware",
            "--enable-memory-pool", "true", "--pool-size", "2GB",
            "--defrag-interval", "5m"]  # fmt: skip
    with sordino_start(args, tmp_path) as server:
        result = CliRunner().invoke(cli, ["config", "show", "--json", "--url", server.url])
        assert result.exit_code == 0, result.output
        memory = json.loads(result.output)["memory"]
    assert memory["enabled"] is True and memory["strategy"] == "fragmentation_aware"
    assert (memory["pool_size"], memory["defrag_interval"]) == (2 * 1024**3, 300.0)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], {"memory_pool": None, "guardian_mode": None, "quant_aware": None}),
        (["--enable-memory-pool", "true", "--guardian-mode", "true", "--quant-aware", "true"],
         {"memory_pool": True, "guardian_mode": True, "quant_aware": True}),
        (["--enable-memory-pool", "--guardian-mode", "--quant-aware"],
         {"memory_pool": True, "guardian_mode": True, "quant_aware": True}),
        (["--enable-memory-pool", "false", "--guardian-mode", "no", "--quant-aware", "off"],
         {"memory_pool": False, "guardian_mode": False, "quant_aware": False}),
        (["--quant-aware", "--enable-memory-pool", "--pool-size", "64MB"],
         {"memory_pool": True, "quant_aware": True, "pool_size": "64MB"}),
        (["--disable-memory-pool"], {"memory_pool": None, "no_memory_pool": True}),
    ],
)  # fmt: skip
def test_switches_take_an_optional_value(argv: list[str], expected: dict[str, object]) -> None:
    """Each switch means true alone, and takes true/false (yes/no, on/off) after it."""
    params = start.make_context("start", argv).params
    assert {key: params[key] for key in expected} == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--enable-memory-pool", "maybe"], "'maybe' is not a valid boolean"),
        (["--enable-memory-pool", "--disable-memory-pool"],
         "give --enable-memory-pool or --disable-memory-pool, not both"),
    ],
)  # fmt: skip
def test_switch_mistakes_are_usage_errors(tmp_path: Path, argv: list[str], message: str) -> None:
    """A value that is not a boolean, or both memory switches, exit 2 with one clear line."""
    done = subprocess.run(
        [sys.executable, "-m", "sordino", "start", *argv, "--data-dir", str(tmp_path / "d")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
