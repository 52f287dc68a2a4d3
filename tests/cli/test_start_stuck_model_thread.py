"""A model run in the server's own threads (``isolation: thread``) whose ``finalize``
never returns: unloading it answers once ``UNLOAD_WAIT_S`` passed, the server serving
meanwhile, and ``sordino start`` ends on a signal. Before, ``finalize`` ran on the event
loop: the unload never answered and the whole server stopped answering — liveness
included; and a model's thread left running kept the process from exiting after
"stopped" (Python waits for a ``ThreadPoolExecutor``'s threads at exit; the model's
thread is now a daemon)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.backends.python_models import write_python_model
from tests.cli.conftest import sordino_start
from tests.waiting import wait_for

TOKEN = "stuck-thread-test-token-0123456789"

MODEL = """import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]

    def finalize(self):
        time.sleep(3600)
"""


def _folder(root: Path) -> Path:
    write_python_model(root, "stuck", MODEL)
    (root / "runtime.yaml").write_text(
        "models:\n  - {name: stuck, path: stuck, backend: python, isolation: thread}\n"
    )
    return root


def test_a_finalize_that_never_returns_holds_neither_the_server_nor_its_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SORDINO_ADMIN_TOKEN", TOKEN)
    root = _folder(tmp_path)
    args = ["--config", str(root / "runtime.yaml"), "--model-control-mode", "explicit"]
    with sordino_start(args, tmp_path) as server:
        unloaded: list[httpx.Response] = []
        started = time.monotonic()

        def unload() -> None:
            unloaded.append(
                httpx.post(
                    f"{server.url}/v2/repository/models/stuck/unload",
                    headers={"Authorization": f"Bearer {TOKEN}"},
                    timeout=60,
                )
            )

        unloading = threading.Thread(target=unload)
        unloading.start()
        time.sleep(1.0)  # finalize is running now
        assert httpx.get(f"{server.url}/v2/health/live", timeout=5).status_code == 200
        unloading.join(60)
        assert unloaded and unloaded[0].status_code == 200, unloaded
        assert time.monotonic() - started < 30
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(timeout=60) == 0
        wait_for(lambda: any("stopped" in line for line in server.lines), "its last lines", 10)
        output = "\n".join(server.lines)
        assert "instance stuck/0 did not unload within 5 s" in output


HANGS_IN_INITIALIZE = MODEL.replace("    def finalize(self):", "    def initialize(self, args):")


def test_an_initialize_that_never_returns_fails_start_up_within_the_start_timeout(
    tmp_path: Path,
) -> None:
    """``workers.start_timeout`` bounds a thread instance's load as a worker's: start-up
    fails saying so, and the process exits (before: start-up waited forever)."""
    write_python_model(tmp_path, "stuck", HANGS_IN_INITIALIZE)
    (tmp_path / "runtime.yaml").write_text(
        "workers: {start_timeout: 2s}\n"
        "models:\n  - {name: stuck, path: stuck, backend: python, isolation: thread}\n"
    )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "sordino", "start", "--config", str(tmp_path / "runtime.yaml"),
         "--http-port", "0", "--grpc-port", "0", "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "stuck/0 did not load within 2 s in its thread" in result.stderr
    assert time.monotonic() - started < 60
