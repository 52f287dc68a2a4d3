"""README.md works as written: ``tools/newcomer.sh`` replays it on a fresh copy.

The replay runs both set-up commands, then every fenced ``bash`` and ``python`` block of
the README in order (``tools/newcomer.py`` says how). A block the replay cannot run on
any machine (it needs a GPU, or the reader's own model file) is listed in
:data:`NOT_RUNNABLE` with the reason; a block that is neither replayed nor listed fails
:func:`test_every_readme_block_is_replayed_or_listed`.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests import readme_replay

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")

# The first line of a README block -> why the replay cannot run it. Empty: every block runs.
NOT_RUNNABLE: dict[str, str] = {}


def _load_newcomer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("newcomer", ROOT / "tools" / "newcomer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["newcomer"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


newcomer = _load_newcomer()


def test_every_readme_block_is_replayed_or_listed() -> None:
    """Each bash/python block is replayed unless listed (with a reason) as not runnable."""
    steps = newcomer.plan(README, set(NOT_RUNNABLE))
    assert all(reason.strip() for reason in NOT_RUNNABLE.values())
    for step in steps:
        if step.block.lang in ("bash", "python"):
            assert (step.action == "run") != (step.block.first_line in NOT_RUNNABLE), step
    assert sum(step.action == "run" for step in steps) >= 8


def test_a_block_of_another_kind_must_be_listed() -> None:
    """A new ```console (or ```sh ...) block fails the plan until it is listed."""
    text = "intro\n\n```console\n$ sordino start\n```\n"
    with pytest.raises(ValueError, match="neither replayed nor listed as not runnable"):
        newcomer.plan(text, set())
    (step,) = newcomer.plan(text, {"$ sordino start"})
    assert step.action == "skip"


def test_a_listed_block_that_is_gone_fails() -> None:
    with pytest.raises(ValueError, match="listed as not runnable but in no block: 'gone'"):
        newcomer.plan("```bash\necho hi\n```\n", {"gone"})


def test_a_yaml_block_named_by_its_first_line_is_saved() -> None:
    text = "```yaml\n# runtime_config.yaml\nserver: {}\n```\n```yaml\n# under server\n```\n"
    saved, fragment = newcomer.plan(text, set())
    assert (saved.action, saved.target) == ("save", "runtime_config.yaml")
    assert fragment.action == "skip"


def test_bash_blocks_split_into_commands_like_a_shell() -> None:
    """Continuations and multi-line quotes join; comments go, also ones with quotes in them."""
    block = (
        "sordino start --a 1 \\\n    --b 2 &   # it's a job\n"
        "curl -d '{\n  \"x\": 1 # not a comment\n}'\n"
        "# a whole-line comment\n"
        "echo a#b\n"
    )
    assert newcomer.commands(block) == [
        "sordino start --a 1      --b 2 &",
        "curl -d '{\n  \"x\": 1 # not a comment\n}'",
        "echo a#b",
    ]


def _setup_commands() -> list[str]:
    first = newcomer.readme_blocks(README)[0]
    return first.text.strip().splitlines()


def test_the_readme_starts_with_the_two_setup_commands() -> None:
    """Serve from .venv; test from a venv of its own, so it never replaces the served package."""
    serve, test = _setup_commands()
    assert README.index("```bash\n" + serve) < README.index("\n## ")
    assert serve == "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/sordino start"
    assert test.startswith("python3 -m venv .venv-test && .venv-test/bin/pip install -e")
    assert test.endswith("-m pytest")


def test_ci_runs_exactly_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert _setup_commands()[1] in ci


@pytest.mark.timeout(readme_replay.TIMEOUT_S + 100)
@pytest.mark.skipif(shutil.which("git") is None, reason="the replay copies the checkout with git")
def test_the_readme_replays_on_a_fresh_copy() -> None:
    """Both set-up commands and every example, in order, exit 0 without a traceback.

    A few minutes: two virtual environments are installed (pip may reuse its cache); the
    second, the test environment, as in its own terminal, beside the examples. The replay
    started when the session had collected this test and ran beside the suite since
    (tests/readme_replay.py); here its result is awaited.
    """
    code, output = readme_replay.result(list(NOT_RUNNABLE))
    assert code == 0, output[-12000:]
    assert "newcomer: README.md replayed in" in output


def test_the_readme_and_the_tour_run_every_command() -> None:
    """Issue 27: each command's happy path runs on the README's install (`pip install .`)."""
    from sordino.cli.main import cli

    readme = [
        newcomer.commands(step.block.text)
        for step in newcomer.plan(README, set(NOT_RUNNABLE))
        if step.action == "run" and step.block.lang == "bash"
    ]
    lines = [line for block in readme for line in block] + list(newcomer.TOUR)
    run = {words[1] for line in lines if (words := line.split())[0].endswith("sordino")}
    assert run >= set(cli.commands), sorted(set(cli.commands) - run)
