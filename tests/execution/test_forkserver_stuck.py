"""A forkserver that stops answering (``SIGSTOP``, a debugger, a machine swapping) while
a worker must be started again.

Workers start from multiprocessing's forkserver, one start at a time. A start waited on
a stopped forkserver for ever: the hung worker was killed and never replaced, so every
request for its model waited until the client gave up, and every later start of any
model waited behind it. The start is now bounded: the forkserver is ended, a new one
starts the worker, and the model serves again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.cli.conftest import ONE_MODEL, sordino_start

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs a forkserver")

BODY = {
    "inputs": [
        {"name": name, "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}
        for name in ("INPUT0", "INPUT1")
    ]
}


def test_a_stopped_forkserver_is_replaced_and_the_model_serves_again(tmp_path: Path) -> None:
    config = tmp_path / "runtime_config.yaml"
    config.write_text("workers:\n  heartbeat_timeout: 2s\n  start_timeout: 4s\n")
    with sordino_start([*ONE_MODEL, "--config", str(config)], tmp_path) as running:
        infer = f"{running.url}/v2/models/simple/infer"
        assert httpx.post(infer, json=BODY, timeout=30).status_code == 200
        server = psutil.Process(running.process.pid)
        forkserver = next(p for p in server.children() if "forkserver" in " ".join(p.cmdline()))
        (worker,) = forkserver.children()  # workers are forked from it
        forkserver.suspend()
        worker.suspend()  # its heartbeat stops: it is killed and must start again
        try:
            started = time.monotonic()
            answers = []
            while time.monotonic() - started < 60:
                answer = httpx.post(infer, json=BODY, timeout=60)
                answers.append(answer.status_code)
                if answer.status_code == 200:
                    break
            # Before: the first request waited for ever (here, the client's 60 s).
            assert answers[-1] == 200, answers
            assert not forkserver.is_running() or forkserver.status() == psutil.STATUS_ZOMBIE
        finally:
            for process in (forkserver, worker):
                if process.is_running():
                    process.resume()
    log = "\n".join(running.lines)
    assert "the forkserver (pid " in log and "did not answer (stopped or hung)" in log
    assert "Traceback" not in log
