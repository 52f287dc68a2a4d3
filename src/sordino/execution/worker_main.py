"""The worker process: one model instance, fed through the shared-memory arena.

Forked from multiprocessing's forkserver, which has imported this module and what it
needs but no model runtime (``execution/worker_spawn.py``; ``spawn`` where there is no
forkserver); it takes the server's environment and standard streams first. It
maps the arena, builds its backend (:func:`sordino.backends.registry.create_backend`
with the spec's ``backend`` kind), loads and warms up the model, and then serves the
pipe (binary frames on its fd) until told to stop: inputs are read in place from the
arena, outputs written back into blocks the server reserved. The messages and their order are in
``execution/messages.py``.

A decoupled model's worker (``ModelMetadata.decoupled``) reads its pipe on a thread of
its own (:meth:`WorkerLink.start_reader`): a :class:`Cancel` may come while the model runs,
and only a reader that is not the model's thread can turn ``is_cancelled()`` true then.
Its batches run through ``worker_loop._run_decoupled``; each response leaves as a
:class:`Respond` frame from whichever thread the model sent it on. No warm-up batches
run for it: a decoupled model's responses to made-up inputs would have nowhere to go.
A worker whose backend takes each request's facts but is not decoupled gets its
:class:`Cancel` frames too; it reads them when the model asks ``is_cancelled()``
(:meth:`WorkerLink.poll`), so the hot path keeps its single reader. A model that checks
its own readiness (Triton's ``is_ready()``) gets the pipe's reader thread too: a
:class:`ReadyCheck` may come while a batch runs, and is answered from a thread of its
own (``_check_ready``).

Here: the process's start (signals, the arena mapped, the model loaded and warmed up,
the heartbeat); the pipe's end is ``worker_link.py``, the run loop ``worker_loop.py``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from sordino.backends.base import (
    ModelRunOptions,
    ReadinessBackend,
    RequestBatchBackend,
    dummy_inputs,
    readiness_of,
)
from sordino.backends.calls import CallingBackend
from sordino.backends.decoupled import DecoupledBackend
from sordino.execution.lost_streams import keep_standard_streams
from sordino.execution.messages import (
    HEARTBEAT,
    FrameError,
    LoadFailed,
    Ready,
    ReadyAnswer,
    ReadyCheck,
)
from sordino.execution.worker_link import WorkerLink
from sordino.execution.worker_loop import Streams, serve
from sordino.execution.worker_spawn import (
    Inherited,
    fresh_random_state,
    lead_own_group,
    run_exit_handlers,
)
from sordino.telemetry.log_settings import configure_process_log

__all__ = ["MappedArena", "WorkerSpec", "worker_main"]

log = logging.getLogger("sordino.workers")


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything a worker needs to start (picklable).

    ``run`` is what the model's configuration tells its backend (its kind, arenas,
    session options, reshapes), ``target`` the device the backend loads onto (``cpu``,
    ``cuda:0``), ``arena`` the shared-memory segment's name.
    """

    model: str
    version: str
    index: int
    path: str
    run: ModelRunOptions
    providers: tuple[str, ...]
    target: str
    intra_op_threads: int | None
    arena: str
    heartbeat_s: float
    warmup_batches: int
    nice: int = 0
    """Added to the niceness of every thread of the worker, first thing (``workers.nice``)."""


def _heartbeat(link: WorkerLink, interval: float) -> None:
    while True:
        time.sleep(interval)
        try:
            link.send(HEARTBEAT)
        except OSError:
            return


def _check_ready(link: WorkerLink, backend: ReadinessBackend, check: ReadyCheck) -> None:
    """Run the model's readiness check on a thread of its own (the pipe's reader hands it
    over and goes on reading; a batch may be running); answer from there."""

    def answer() -> None:
        why = readiness_of(backend)
        with contextlib.suppress(OSError):  # the server is gone: nobody asks any more
            link.send(ReadyAnswer(check.check_id, why))

    threading.Thread(target=answer, daemon=True, name="is-ready").start()


def _lower_priority(by: int) -> None:
    """Add ``by`` to this process's niceness, for every thread it already runs.

    Linux keeps a niceness per thread, and ``setpriority`` on the process's own ID sets
    only the calling thread's; threads started later inherit their creator's. Those the
    imports before this point may have started (a BLAS pool) are set one by one.
    """
    try:
        target = min(19, os.getpriority(os.PRIO_PROCESS, 0) + by)
    except OSError:  # a sandbox that hides priorities: the worker runs as it is
        return
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: the call below sets the whole process
        threads = [0]
    for tid in threads:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.setpriority(os.PRIO_PROCESS, tid, target)


def worker_main(
    spec: WorkerSpec,
    conn: Connection,
    log_settings: dict[str, Any] | None = None,
    inherited: Inherited | None = None,
) -> None:
    """Entry point of the worker process; ``log_settings`` is the server's logging settings
    (``LogSettings.current()``), which its log follows from the start (None: Python's
    own, warnings only); ``inherited`` the server's environment and standard streams
    at the worker's start, taken before anything uses them (None: the process's own)."""
    # Ctrl-C and SIGTERM reach the whole process group; the server decides when its
    # workers stop (a Stop message, or end of file on the pipe when it is gone). They
    # arrive blocked (see worker_spawn.py); one already pending is discarded before they
    # are unblocked. SIGTERM is caught and dropped rather than ignored: an ignored signal
    # stays ignored in the processes a model starts, whose pool's terminate() (SIGTERM)
    # would then never end them; a handler is reset by exec, and by _own_children's
    # hook in a fork. Ctrl-C stays ignored in them too: the server decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _dropped)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    lead_own_group()
    _own_children()
    if inherited is not None:
        inherited.adopt()
    keep_standard_streams()  # a model's print must not fail once the server's pipe closes
    fresh_random_state()
    if log_settings is not None:
        configure_process_log(log_settings)
    if spec.nice:
        _lower_priority(spec.nice)
    try:
        _serve_model(spec, conn)
    finally:
        run_exit_handlers()


def _dropped(signum: int, frame: object) -> None:
    """SIGTERM in a worker: nothing (the server decides when it stops)."""


def _own_children() -> None:
    """Let the model start processes of its own, as Triton's Python stub does (a
    ``multiprocessing`` pool, a data loader's workers): the server starts the worker
    daemonic, so that its exit never waits for it, and multiprocessing refuses a daemonic
    process children. Those it forks get SIGTERM's default back."""
    multiprocessing.current_process().daemon = False
    os.register_at_fork(
        after_in_child=functools.partial(signal.signal, signal.SIGTERM, signal.SIG_DFL)
    )


def _serve_model(spec: WorkerSpec, conn: Connection) -> None:
    """Load the model, say so, serve the pipe until told to stop."""
    from sordino.backends.registry import backend_kind, create_backend

    link = WorkerLink(conn)
    mapped = MappedArena(spec.arena)
    try:
        started = time.perf_counter()
        backend = create_backend(
            spec.run,
            name=spec.model,
            version=spec.version,
            providers=spec.providers,
            intra_op_threads=spec.intra_op_threads,
            index=spec.index,
            own_process=True,
        )
        if isinstance(backend, CallingBackend):
            backend.set_caller(link)  # the model's BLS calls go over the pipe
        backend.load(Path(spec.path), spec.target)
        warm_up = backend_kind(spec.run.backend, model=spec.model).warm_up
        # A decoupled model's responses would have nowhere to go: never warmed up.
        for _ in range(spec.warmup_batches if warm_up and not backend.metadata.decoupled else 0):
            backend.infer(dummy_inputs(backend.metadata, 1))
    except Exception as exc:
        link.send(LoadFailed(f"{type(exc).__name__}: {exc}"))
        return
    threading.Thread(
        target=_heartbeat, args=(link, spec.heartbeat_s), daemon=True, name="heartbeat"
    ).start()
    per_request = isinstance(backend, RequestBatchBackend)
    streams = Streams(link) if per_request or isinstance(backend, DecoupledBackend) else None
    if streams is not None:  # read when the model asks (WorkerLink.poll), or by the reader
        link.watch_cancels(streams.cancel)
    checks = False
    if isinstance(backend, ReadinessBackend) and backend.checks_readiness:
        checks = True
        link.watch_ready_checks(functools.partial(_check_ready, link, backend))
    if checks or (streams is not None and backend.metadata.decoupled):
        link.start_reader()
    load_s = time.perf_counter() - started
    link.send(Ready(backend.metadata, os.getpid(), load_s, per_request, checks_ready=checks))
    try:
        serve(link, backend, mapped, streams)
    except FrameError as exc:
        # The server's end is broken (here or inside a batch's Alloc exchange): leave,
        # saying why (exit code 1); the server sees the pipe close: a lost worker.
        sys.exit(f"sordino worker {spec.model}/{spec.index}: {exc}")
    # Told to stop, or the server is gone: the model unloads (a Python model's finalize()).
    try:
        backend.unload()
    except Exception as exc:
        log.error("%s/%d: unloading raised %r", spec.model, spec.index, exc)


class MappedArena:
    """The arena segment this worker maps; replaced when the server resized the pool.

    The segment named at spawn may be gone by the time a replacement worker starts
    (the pool was resized since the instance was created): then nothing is mapped
    until the first batch names the current segment.
    """

    def __init__(self, name: str) -> None:
        from sordino.memory.segments import attach_segment

        self.segment: shared_memory.SharedMemory | None = None
        with contextlib.suppress(FileNotFoundError):
            self.segment = attach_segment(name)

    def follow(self, name: str) -> memoryview:
        """The buffer of segment ``name`` (the current one when empty), mapped once."""
        if name and (self.segment is None or name != self.segment.name):
            from sordino.memory.segments import attach_segment

            old, self.segment = self.segment, attach_segment(name)
            if old is not None:
                with contextlib.suppress(BufferError):  # a view still lives: unmapped later
                    old.close()
        if self.segment is None:
            raise FileNotFoundError("no shared-memory segment is mapped; the batch named none")
        buffer = self.segment.buf
        assert buffer is not None
        return buffer
