"""The worker process: one model instance, fed through the shared-memory arena.

Started with the ``spawn`` method (fork after threads and onnxruntime is unsafe). It
maps the arena, builds its backend (:func:`sordino.backends.registry.create_backend`
with the spec's ``backend`` kind), loads and warms up the model, and then serves the
pipe (binary frames on its fd) until told to stop: inputs are read in place from the
arena, outputs written back into blocks the server reserved. The messages and their order are in
``execution/messages.py``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from pathlib import Path

from sordino.backends.base import Backend, ProfilingBackend, RequestBatchBackend, dummy_inputs
from sordino.config.memory import FrameworkMemoryConfig
from sordino.execution.faults import InjectedFault, perform
from sordino.execution.messages import (
    HEARTBEAT,
    Alloc,
    Allocated,
    Call,
    CallFailed,
    Command,
    Done,
    FrameError,
    FrameReader,
    FromWorker,
    LoadFailed,
    ProfileStart,
    ProfileStop,
    ProfileStopped,
    Ready,
    Reply,
    Run,
    RunFailed,
    Stop,
    ToWorker,
    encode,
)
from sordino.memory.tensors import tensor_nbytes, view_tensor, write_tensor

__all__ = ["WorkerSpec", "worker_main"]


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything a worker needs to start (picklable).

    ``backend`` is the backend kind (``ModelConfig.backend``), ``target`` the device
    the backend loads onto (``cpu``, ``cuda:0``), ``arena`` the shared-memory
    segment's name.
    """

    model: str
    version: str
    index: int
    path: str
    backend: str
    providers: tuple[str, ...]
    target: str
    intra_op_threads: int | None
    arena: str
    heartbeat_s: float
    warmup_batches: int
    framework_memory: FrameworkMemoryConfig | None = None
    """ONNX Runtime's arenas in this process (the model's ``framework_memory``)."""
    thread_spinning: bool = False
    """Let ONNX Runtime's threads busy-wait for work (the model's ``thread_spinning``)."""


class _Link:
    """The worker's end of the pipe; sends may come from two threads, reads from one.

    ``conn`` only carries the fd (and keeps it open); frames are written and read on the
    fd directly, several frames per read when they have queued up.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._fd = conn.fileno()
        self._lock = threading.Lock()
        self._frames = FrameReader()
        self._received: collections.deque[ToWorker | FromWorker] = collections.deque()

    def send(self, message: FromWorker) -> None:
        data = memoryview(encode(message))
        with self._lock:
            while data:
                data = data[os.write(self._fd, data) :]

    def recv(self) -> ToWorker:
        """The next message from the server (blocking). Raises :class:`EOFError` when the
        server's end is closed, :class:`FrameError` for bytes that are not a frame."""
        while not self._received:
            data = os.read(self._fd, 1 << 16)
            if not data:
                raise EOFError
            self._received.extend(self._frames.feed(data))
        return self._received.popleft()  # type: ignore[return-value]


def _heartbeat(link: _Link, interval: float) -> None:
    while True:
        time.sleep(interval)
        try:
            link.send(HEARTBEAT)
        except OSError:
            return


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Entry point of the worker process."""
    # Ctrl-C and SIGTERM reach the whole process group; the server decides when its
    # workers stop (a Stop message, or end of file on the pipe when it is gone). They
    # arrive blocked from the spawning thread (see worker.py); one already pending is
    # discarded by SIG_IGN before they are unblocked.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    from sordino.backends.registry import create_backend

    link = _Link(conn)
    mapped = _Mapped(spec.arena)
    try:
        started = time.perf_counter()
        backend = create_backend(
            spec.backend,
            name=spec.model,
            version=spec.version,
            providers=spec.providers,
            intra_op_threads=spec.intra_op_threads,
            memory=spec.framework_memory,
            thread_spinning=spec.thread_spinning,
            index=spec.index,
        )
        backend.load(Path(spec.path), spec.target)
        for _ in range(spec.warmup_batches):
            backend.infer(dummy_inputs(backend.metadata, 1))
    except Exception as exc:
        link.send(LoadFailed(f"{type(exc).__name__}: {exc}"))
        return
    threading.Thread(
        target=_heartbeat, args=(link, spec.heartbeat_s), daemon=True, name="heartbeat"
    ).start()
    per_request = isinstance(backend, RequestBatchBackend)
    link.send(Ready(backend.metadata, os.getpid(), time.perf_counter() - started, per_request))
    try:
        _serve(link, backend, mapped)
    except FrameError as exc:
        # The server's end is broken (here or inside a batch's Alloc exchange): leave,
        # saying why (exit code 1); the server sees the pipe close: a lost worker.
        sys.exit(f"sordino worker {spec.model}/{spec.index}: {exc}")


def _serve(link: _Link, backend: Backend, mapped: _Mapped) -> None:
    """Serve the pipe until told to stop or the server's end closes."""
    while True:
        try:
            message = link.recv()
        except (EOFError, OSError):
            return
        match message:
            case Stop():
                return
            case Run():
                try:
                    buffer = mapped.follow(message.segment)
                except OSError as exc:
                    link.send(RunFailed(message.batch_id, "error", f"shared memory: {exc}"))
                    continue
                if not _run(link, backend, buffer, message):
                    return
            case Call(call_id=call_id, command=command):
                _call(link, backend, call_id, command)


class _Mapped:
    """The arena segment this worker maps; replaced when the server resized the pool.

    The segment named at spawn may be gone by the time a replacement worker starts
    (the pool was resized since the instance was created): then nothing is mapped
    until the first batch names the current segment.
    """

    def __init__(self, name: str) -> None:
        from sordino.memory.arena import attach_segment

        self.segment: shared_memory.SharedMemory | None = None
        with contextlib.suppress(FileNotFoundError):
            self.segment = attach_segment(name)

    def follow(self, name: str) -> memoryview:
        """The buffer of segment ``name`` (the current one when empty), mapped once."""
        if name and (self.segment is None or name != self.segment.name):
            from sordino.memory.arena import attach_segment

            old, self.segment = self.segment, attach_segment(name)
            if old is not None:
                with contextlib.suppress(BufferError):  # a view still lives: unmapped later
                    old.close()
        if self.segment is None:
            raise FileNotFoundError("no shared-memory segment is mapped; the batch named none")
        buffer = self.segment.buf
        assert buffer is not None
        return buffer


def _call(link: _Link, backend: Backend, call_id: int, command: Command) -> None:
    try:
        if not isinstance(backend, ProfilingBackend):
            raise RuntimeError(f"the {type(backend).__name__} backend cannot profile")
        value: ProfileStopped | None = None
        match command:
            case ProfileStart(prefix=prefix):
                backend.start_profiling(prefix)
            case ProfileStop():
                value = ProfileStopped(*backend.stop_profiling())
    except Exception as exc:
        link.send(CallFailed(call_id, f"{command.name}: {type(exc).__name__}: {exc}"))
        return
    link.send(Reply(call_id, value))


def _run(link: _Link, backend: Backend, buffer: memoryview, run: Run) -> bool:
    """Run one batch and answer it; False when the server said to stop meanwhile."""
    started = time.perf_counter()
    try:
        batch = {name: view_tensor(buffer, handle) for name, handle in run.inputs.items()}
        if run.fault is not None:
            perform(run.fault, in_process=False)
        if (run.rows or run.requests) and isinstance(backend, RequestBatchBackend):
            results = backend.infer_requests(batch, run.rows, run.requests)
        else:
            results = backend.infer(batch)
        del batch
    except MemoryError as exc:
        link.send(RunFailed(run.batch_id, "oom", f"MemoryError: {exc}"))
        return True
    except InjectedFault as exc:
        link.send(RunFailed(run.batch_id, "fault", f"{type(exc).__name__}: {exc}"))
        return True
    except Exception as exc:
        link.send(RunFailed(run.batch_id, "error", f"{type(exc).__name__}: {exc}"))
        return True
    infer_s = time.perf_counter() - started
    space = run.space
    sizes = {name: tensor_nbytes(array) for name, array in results.items()}
    short = {
        name: size
        for name, size in sizes.items()
        if name not in space or space[name].capacity < size
    }
    if short:
        link.send(Alloc(run.batch_id, short))
        try:
            reply = link.recv()  # the only message the server sends in this exchange
        except (EOFError, OSError):
            return False  # the server is gone
        if not isinstance(reply, Allocated):
            return False  # Stop: the server is going away
        space = {**space, **reply.space}
    written = {
        name: write_tensor(buffer, space[name].offset, space[name].capacity, array)
        for name, array in results.items()
    }
    link.send(Done(run.batch_id, written, infer_s))
    return True
