"""``ModelThread``: a thread instance's executor, one daemon thread (Python does not wait
for it at exit, as it waits for a ``ThreadPoolExecutor``'s)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from sordino.execution.model_thread import ModelThread


def test_work_runs_in_order_on_one_daemon_thread_and_its_errors_reach_the_caller() -> None:
    executor = ModelThread("sordino-test")
    seen: list[tuple[int, str]] = []
    futures = [
        executor.submit(lambda n=n: seen.append((n, threading.current_thread().name)))
        for n in range(5)
    ]
    for future in futures:
        future.result(10)
    assert seen == [(n, "sordino-test") for n in range(5)]
    assert executor._thread.daemon

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        executor.submit(interrupted).result(10)
    assert executor.submit(lambda: 7).result(10) == 7  # the thread serves on
    executor.shutdown(wait=True)
    assert not executor._thread.is_alive()
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.submit(lambda: None)


def test_a_thread_that_never_returns_does_not_hold_the_process_at_exit() -> None:
    program = (
        "import time\n"
        "from sordino.execution.model_thread import ModelThread\n"
        "ModelThread('stuck').submit(time.sleep, 3600)\n"
        "time.sleep(0.2)\n"
        "print('leaving')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout == "leaving\n", result.stderr
