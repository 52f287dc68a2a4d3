"""Starting a worker process apart from the embedding program, and killing what is left.

Workers start from multiprocessing's ``forkserver`` where the platform has one
(:data:`WORKER_CONTEXT`; ``spawn`` elsewhere): one server process per sordino process,
started with the first worker, that has already imported what every worker imports
(:data:`PRELOAD`: sordino's worker side, numpy, pydantic) and forks a worker from
itself for each start. A worker so skips its interpreter's start-up and those imports —
measured, the built-in models' five workers took 3.5–4.2 s of CPU to start with
``spawn`` and 0.9–1.1 s from the forkserver, its own start included
(``python -m bench.bench_worker_start``). Model runtimes (onnxruntime,
torch) are not preloaded: onnxruntime starts a thread at import, and a process that
forks must not have threads that may hold a lock. A forked worker keeps the environment
the forkserver started with, and its standard output and error, so each worker is
handed the server's as they are at the worker's start (:class:`Inherited`), as
``spawn`` would give them; it draws numpy's global random state afresh
(:func:`fresh_random_state`) and runs its ``atexit`` handlers as it ends
(:func:`run_exit_handlers`), which a forked process would otherwise share and skip.

Both re-import the parent's ``__main__`` and pass on the signal mask: a worker is
started with the main script hidden and SIGINT/SIGTERM blocked
(:func:`start_apart_from_main`; the forkserver itself is started by the first worker's
start, so it and every worker forked from it begin with them blocked); the pids of live
workers are kept so that the ones left at exit are killed (see ``execution/worker.py``);
and a worker's exit code is read even when another thread's start of a process reaped
it (:func:`join_exit_code`).
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from multiprocessing import reduction
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:  # ForkServerContext exists only where the platform has a forkserver
    from multiprocessing.context import ForkServerContext, SpawnContext

__all__ = [
    "LIVE_PIDS",
    "PRELOAD",
    "WORKER_CONTEXT",
    "WORKER_IGNORED_SIGNALS",
    "Inherited",
    "describe_exit",
    "end_group",
    "fresh_random_state",
    "join_exit_code",
    "kill_tree",
    "lead_own_group",
    "run_exit_handlers",
    "start_apart_from_main",
]

PRELOAD = ["sordino.execution.worker_main", "sordino.backends.registry", "sordino.backends.onnx"]
"""What the forkserver imports once for every worker. None of it starts a thread but
numpy's BLAS pool, which OpenBLAS shuts down before a fork and starts again after it,
as for any numpy program that forks (tests/execution/test_worker_start.py checks that
nothing here starts a Python thread or imports a model runtime)."""


def _worker_context() -> ForkServerContext | SpawnContext:
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # multiprocessing's one forkserver, shared with the embedding program: the preload
    # counts only if it is not running yet, and is the program's too if it uses one.
    context.set_forkserver_preload(PRELOAD)
    return context


WORKER_CONTEXT = _worker_context()
"""The multiprocessing context workers start from: ``forkserver``, else ``spawn``."""


class Inherited:
    """What a spawned worker would inherit from the server at its start, and a forked one
    is handed instead of the forkserver's: the environment, and the standard output and
    error (the server's may have been redirected since the forkserver started, as
    pytest's capture does). Pickled into the worker's start; :meth:`adopt` there."""

    def __init__(self, environment: dict[str, str], streams: dict[int, int]) -> None:
        self.environment = environment
        self.streams = streams  # {1 or 2: the descriptor it should become}

    @classmethod
    def now(cls) -> Inherited:
        """The server's, as they are now."""
        return cls(dict(os.environ), {1: 1, 2: 2})

    def __reduce__(self) -> tuple[Any, ...]:
        # Only while a process starts: DupFd hands the descriptor to the child.
        carried = {target: reduction.DupFd(fd) for target, fd in self.streams.items() if _open(fd)}
        return (_rebuilt, (self.environment, carried))

    def adopt(self) -> None:
        """In the worker: take the environment and the streams, before anything uses them."""
        os.environ.clear()
        os.environ.update(self.environment)
        for target, fd in self.streams.items():
            if fd != target:  # spawn passes the same descriptor; nothing to do
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(Exception):
                        stream.flush()
                os.dup2(fd, target)
                os.close(fd)


def fresh_random_state() -> None:
    """In a worker: numpy's global random state drawn afresh from the OS, as a spawned
    process has its own. A forked worker starts with the forkserver's, the same in every
    worker, so unseeded ``np.random`` draws would repeat across a model's instances
    (Python's ``random`` reseeds itself after a fork; numpy's global state does not)."""
    import numpy

    numpy.random.seed()


def run_exit_handlers() -> None:
    """In a worker, as it ends: its ``atexit`` handlers (a Python model's among them), which
    a spawned process runs at interpreter exit but a forked one, ended by multiprocessing
    with ``os._exit``, would not."""
    if WORKER_CONTEXT.get_start_method() == "forkserver":
        atexit._run_exitfuncs()


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _rebuilt(environment: dict[str, str], carried: dict[int, Any]) -> Inherited:
    return Inherited(environment, {target: dup.detach() for target, dup in carried.items()})


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
        kill_tree(pid)


def kill_tree(pid: int) -> None:
    """SIGKILL worker ``pid`` and the processes its model started (a ``multiprocessing``
    pool, a data loader's workers): a worker leads a process group of its own, which
    they join (:func:`lead_own_group`)."""
    end_group(pid)
    with contextlib.suppress(ProcessLookupError):  # killed before it made its group
        os.kill(pid, signal.SIGKILL)


def end_group(pid: int) -> None:
    """SIGKILL worker ``pid``'s process group: once the worker has exited, what its model
    started and left running (after a crash, or the kernel's OOM killer, nobody else
    would end it)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def lead_own_group() -> None:
    """In a worker: a process group of its own, which the processes its model starts
    join, so that :func:`kill_tree` and :func:`end_group` reach them even once the
    worker is gone (a dead process's children are handed to init, out of reach)."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)


def _forkserver_pid() -> int | None:
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    pid: int | None = getattr(server, "_forkserver_pid", None)
    return pid


def forkserver_running() -> bool:
    """Whether multiprocessing's forkserver is up (launched, alive): a start then is a
    fork request it answers in milliseconds. Otherwise the start launches one first
    (its imports: seconds on a busy machine)."""
    if WORKER_CONTEXT.get_start_method() != "forkserver":
        return False
    pid = _forkserver_pid()
    if pid is None:
        return False
    try:  # not waitpid: that would reap it under multiprocessing's feet
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def end_stuck_forkserver() -> int | None:
    """SIGKILL multiprocessing's forkserver; return its pid (None: there is none).

    Called when a worker's start waited on it past its bound: a forkserver that is
    stopped or hung (``SIGSTOP``, a debugger, swapped out) never answers, and every
    start after it waits too (they start one at a time). Workers it forked before go on:
    they are its children, not its threads. The next start launches a new forkserver
    (``multiprocessing`` reaps the dead one), and the start that waited gets end of file.
    """
    if WORKER_CONTEXT.get_start_method() != "forkserver":
        return None
    pid = _forkserver_pid()
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pid


class SpawnClock:
    """When a start began asking a running forkserver to fork (None: not yet — queued
    for a thread, waiting for another start, or launching the forkserver first). Only
    that part is bounded: it takes milliseconds when the forkserver answers."""

    def __init__(self) -> None:
        self.forking_since: float | None = None


def start_apart_from_main(process: Any, clock: SpawnClock | None = None) -> None:
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
        _start_without_main(process, main, clock)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _start_without_main(process: Any, main: Any, clock: SpawnClock | None) -> None:
    with _MAIN_LOCK:
        if clock is not None and forkserver_running():
            clock.forking_since = time.monotonic()
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
