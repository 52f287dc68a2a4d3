"""A worker's exit code survives another thread reaping it first (multiprocessing's race);
a worker reaped leaves nothing open."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
import threading
import time

import pytest

from sordino.execution.worker_spawn import describe_exit, join_exit_code
from tests.execution.load import only_instance


def _reaped_elsewhere(process: multiprocessing.process.BaseProcess) -> None:
    """Do what ``Process.start()``'s ``_cleanup`` does in another thread, slowly.

    It reaps the child, then stores its code a moment later: our own ``waitpid``
    meanwhile fails with ECHILD.
    """
    popen = process._popen  # type: ignore[attr-defined]
    _, status = os.waitpid(process.pid, 0)  # type: ignore[arg-type]
    time.sleep(0.3)
    popen.returncode = os.waitstatus_to_exitcode(status)


def _killed_and_reaped_elsewhere() -> tuple[multiprocessing.process.BaseProcess, threading.Thread]:
    process = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    process.start()
    os.kill(process.pid, signal.SIGKILL)  # type: ignore[arg-type]
    reaper = threading.Thread(target=_reaped_elsewhere, args=(process,))
    reaper.start()
    time.sleep(0.1)  # the other thread has reaped it, not yet stored the code
    return process, reaper


def test_a_code_stored_by_another_thread_is_waited_for() -> None:
    process, reaper = _killed_and_reaped_elsewhere()
    try:
        code = join_exit_code(process, 10)
    finally:
        reaper.join(10)
    assert describe_exit(code) == "killed by SIGKILL"


def test_without_waiting_the_race_reads_as_a_plain_exit() -> None:
    # What a bare ``join`` then ``exitcode`` read: the defect this guards against.
    process, reaper = _killed_and_reaped_elsewhere()
    try:
        code = join_exit_code(process, 10, settle_s=0)
    finally:
        reaper.join(10)
    assert describe_exit(code) == "exited"


def _pipes() -> int:
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            found += os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc")
def test_a_replaced_worker_leaves_no_pipe_open() -> None:
    """Each worker replaced (restart_worker, a crash, an unload) once left its process's
    sentinel pipe open until the collector found the object: hundreds of descriptors
    after a day of model loads and unloads. With the collector off, none may stay."""
    with only_instance(restart_backoff="0.05s") as one:

        async def replace_and_run() -> None:
            await one.replace()
            (await one.executor.run(one.key, [one.rows])).release()

        one.server.call(replace_and_run())  # whatever a first restart opens for good
        gc.collect()
        gc.disable()
        try:
            before = _pipes()
            for _ in range(6):
                one.server.call(replace_and_run())
            after = _pipes()
        finally:
            gc.enable()
    assert after - before <= 1, f"{after - before} pipes left open by 6 replaced workers"
