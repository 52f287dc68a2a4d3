"""Helpers of the brief's replay: the CLI as a user types it, a webhook receiver, the
brief's model file (an ONNX file where the brief has an Ascend ``.om``)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sordino.cli.main import cli
from tests.webhook import Receiver

BUILTIN = Path(str(resources.files("sordino.models.builtin")))


def run_cli(*args: str) -> Result:
    """``sordino ARGS`` in this process; never a traceback, whatever the exit status."""
    result = CliRunner().invoke(cli, list(args))
    assert "Traceback" not in result.output, result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    hook = Receiver()
    try:
        yield hook
    finally:
        hook.close()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A ``$HOME`` of the module's own (so ``~/.sordino`` is the replay's) and the
    working directory the brief's relative file names are written in."""
    root = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(root))
        patch.chdir(root)
        yield root


def brief_model(folder: Path, name: str) -> Path:
    """The brief's model as an ONNX file in ``folder`` (the built-in digits classifier:
    the brief's ``sd3_deploy.om`` is an Ascend file only CANN runs)."""
    path = folder / name
    shutil.copyfile(BUILTIN / "digits-classifier.onnx", path)
    return path
