"""Spawning a worker process apart from the embedding program, and killing what is left.

``spawn`` re-imports the parent's ``__main__`` and passes on the signal mask: a worker
is started with the main script hidden and SIGINT/SIGTERM blocked
(:func:`start_apart_from_main`); the pids of live workers are kept so that the ones
left at exit are killed (see ``execution/worker.py``); and a worker's exit code is
read even when another thread's start of a process reaped it (:func:`join_exit_code`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any

__all__ = [
    "LIVE_PIDS",
    "WORKER_IGNORED_SIGNALS",
    "describe_exit",
    "join_exit_code",
    "start_apart_from_main",
]


def describe_exit(code: int | None) -> str:
    """``exited with code 3`` / ``killed by SIGKILL``."""
    if code is None:
        return "exited"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def join_exit_code(process: Any, timeout_s: float, settle_s: float = 1.0) -> int | None:
    """Wait up to ``timeout_s`` for ``process`` to end; its exit code (None: still running).

    Every ``Process.start()`` first polls all the children multiprocessing knows of
    (its ``_cleanup``), so a worker restarted in another thread can reap this one
    between our ``waitpid`` and its own store of the code: our ``waitpid`` then fails
    with ECHILD and ``join`` returns with no code, which would read as a plain
    "exited" instead of "killed by SIGKILL". The other thread stores the code moments
    later: wait up to ``settle_s`` for it.
    """
    process.join(timeout_s)
    deadline = time.monotonic() + settle_s
    code: int | None = process.exitcode
    while code is None and time.monotonic() < deadline:
        time.sleep(0.005)
        code = process.exitcode
    return code


_MAIN_LOCK = threading.Lock()

# Workers ignore SIGINT and SIGTERM (a terminal's Ctrl-C reaches the whole process
# group; the server decides when they stop). Should the server exit without stopping
# them, this kills what is left, before multiprocessing's own exit hook waits for them.
LIVE_PIDS: set[int] = set()

# Blocked in the thread that spawns a worker, so the child starts with them blocked
# (a blocked mask survives fork and exec): a Ctrl-C during the child's interpreter
# start-up and imports stays pending instead of raising KeyboardInterrupt there, and
# is discarded when worker_main ignores these signals and unblocks them.
WORKER_IGNORED_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


@atexit.register
def _kill_leftover_workers() -> None:
    for pid in list(LIVE_PIDS):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start_apart_from_main(process: Any) -> None:
    """Start ``process`` without re-running the embedding program's main script in it.

    ``spawn`` re-imports the parent's ``__main__`` in every child, so a script that
    embeds sordino without an ``if __name__ == "__main__"`` guard would start itself
    again in each worker. A worker needs only sordino, so the main module's path is
    hidden for the moment of the start. SIGINT and SIGTERM are blocked in this thread
    meanwhile, so the child starts with them blocked (see ``WORKER_IGNORED_SIGNALS``).
    """
    main = sys.modules.get("__main__")
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_IGNORED_SIGNALS)
    try:
        _start_without_main(process, main)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _start_without_main(process: Any, main: Any) -> None:
    with _MAIN_LOCK:
        saved = {
            name: main.__dict__.pop(name)
            for name in ("__file__",)
            if main and name in main.__dict__
        }
        spec = getattr(main, "__spec__", None)
        if main is not None and spec is not None and not spec.name.endswith("__main__"):
            main.__spec__ = None
        try:
            process.start()
        finally:
            if main is not None:
                main.__dict__.update(saved)
                if spec is not None:
                    main.__spec__ = spec
