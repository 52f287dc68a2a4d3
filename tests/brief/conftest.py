"""Helpers of the brief's replay: the CLI as a user types it, a webhook receiver, the
brief's model file (an ONNX file where the brief has an Ascend ``.om``)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from importlib import resources
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sordino.cli.main import cli

BUILTIN = Path(str(resources.files("sordino.models.builtin")))


def run_cli(*args: str) -> Result:
    """``sordino ARGS`` in this process; never a traceback, whatever the exit status."""
    result = CliRunner().invoke(cli, list(args))
    assert "Traceback" not in result.output, result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


class Receiver:
    """A local webhook receiver standing in for Slack: each JSON body with the wall
    time (``time.time()``) it arrived."""

    def __init__(self) -> None:
        arrived = self.arrived = []  # type: list[tuple[float, dict[str, Any]]]

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                arrived.append((time.time(), body))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self._server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}/hook"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


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
