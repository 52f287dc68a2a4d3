"""The worker process: one model instance, fed through the shared-memory arena.

Started with the ``spawn`` method (fork after threads and onnxruntime is unsafe). It
maps the arena, builds its backend (:func:`sordino.backends.registry.create_backend`
with the spec's ``backend`` kind), loads and warms up the model, and then serves the
pipe (binary frames on its fd) until told to stop: inputs are read in place from the
arena, outputs written back into blocks the server reserved. The messages and their order are in
``execution/messages.py``.

A decoupled model's worker (``ModelMetadata.decoupled``) reads its pipe on a thread of
its own (:meth:`_Link.start_reader`): a :class:`Cancel` may come while the model runs,
and only a reader that is not the model's thread can turn ``is_cancelled()`` true then.
Its batches run through :func:`_run_decoupled`; each response leaves as a
:class:`Respond` frame from whichever thread the model sent it on. No warm-up batches
run for it: a decoupled model's responses to made-up inputs would have nowhere to go.
A worker whose backend takes each request's facts but is not decoupled gets its
:class:`Cancel` frames too; it reads them when the model asks ``is_cancelled()``
(:meth:`_Link.poll`), so the hot path keeps its single reader.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from sordino.backends.base import Backend, ProfilingBackend, RequestBatchBackend, dummy_inputs
from sordino.backends.calls import CallAnswer, CallingBackend, ModelCall, failed_answer
from sordino.backends.decoupled import DecoupledBackend
from sordino.config.memory import FrameworkMemoryConfig
from sordino.execution.faults import InjectedFault, perform
from sordino.execution.messages import (
    HEADER_SIZE,
    HEARTBEAT,
    MAX_BODY,
    Alloc,
    Allocated,
    Call,
    CallFailed,
    Cancel,
    Command,
    Done,
    FrameError,
    FrameReader,
    FromWorker,
    LoadFailed,
    ModelCallAnswer,
    ModelCallCancel,
    ModelCallStart,
    ProfileStart,
    ProfileStop,
    ProfileStopped,
    Ready,
    Reply,
    Respond,
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
    """The worker's end of the pipe; sends may come from any thread, and so may reads.

    ``conn`` only carries the fd (and keeps it open); frames are written and read on the
    fd directly, several frames per read when they have queued up.

    Reading is shared (leader/follower): whichever thread needs a message and finds
    nobody reading reads the fd and hands each message to its reader — answers to model
    calls to their callbacks, everything else to the main thread's inbox. The main
    thread reads for itself between batches (no hand-off on the hot path); while model
    calls are pending, a pump thread reads for them, so answers arrive while
    ``execute`` runs and the main thread does not read.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._fd = conn.fileno()
        self._lock = threading.Lock()
        self._frames = FrameReader()
        self._inbox: collections.deque[ToWorker] = collections.deque()
        self._state = threading.Condition()
        self._reading = False
        self._closed: BaseException | None = None
        self._calls: dict[int, Callable[[CallAnswer], None]] = {}
        self._call_ids = itertools.count(1)
        self._pump: threading.Thread | None = None
        self._on_cancel: Callable[[Cancel], None] | None = None

    def watch_cancels(self, on_cancel: Callable[[Cancel], None]) -> None:
        """Hand each :class:`Cancel` to ``on_cancel`` as it is read (never to :meth:`recv`,
        so none lands in a batch's ``Alloc`` exchange)."""
        self._on_cancel = on_cancel

    def start_reader(self, on_cancel: Callable[[Cancel], None]) -> None:
        """Read the pipe on a thread from now on (a decoupled model's worker): a
        :class:`Cancel` goes to ``on_cancel`` at once, even while ``execute`` runs; other
        messages wait for :meth:`recv` as before."""
        self.watch_cancels(on_cancel)
        threading.Thread(target=self._read_always, daemon=True, name="pipe-reader").start()

    def poll(self) -> None:
        """Hand out what the pipe holds now, without waiting, unless a thread reads it.

        A model that is not decoupled asks ``is_cancelled()`` while its batch runs on the
        thread that would read the pipe: asking reads what came meanwhile (one ``select``
        when nothing did), so a :class:`Cancel` needs no reader thread of its own.
        Another thread reading meanwhile may get to the bytes first; it hands them out.
        """
        if not _readable(self._fd):
            return  # nothing came: no lock taken (a model may ask in a tight loop)
        with self._state:
            if self._reading or self._closed is not None:
                return  # whoever reads hands the Cancel out
            self._reading = True
        messages: list[ToWorker] = []
        ended: BaseException | None = None
        try:
            # Again, as the reader: another may have read the bytes since (never block).
            if _readable(self._fd):
                data = os.read(self._fd, 1 << 16)
                if data:
                    messages = self._frames.feed(data)  # type: ignore[assignment]
                else:
                    ended = EOFError()
        except (OSError, FrameError) as exc:
            ended = exc
        finally:
            with self._state:
                self._reading = False
                for message in messages:
                    self._hand_out(message)
                if ended is not None:
                    self._closed = ended
                    self._fail_calls("the server closed the worker's pipe")
                self._state.notify_all()

    def _read_always(self) -> None:
        with self._state:
            self._read_until(lambda: False)

    def send(self, message: FromWorker) -> None:
        self.send_frame(encode(message))

    def send_frame(self, frame: bytes) -> None:
        """Write one encoded frame (whole, even when several threads send)."""
        data = memoryview(frame)
        with self._lock:
            while data:
                data = data[os.write(self._fd, data) :]

    def recv(self) -> ToWorker:
        """The next message from the server (blocking). Raises :class:`EOFError` when the
        server's end is closed, :class:`FrameError` for bytes that are not a frame."""
        with self._state:
            self._read_until(lambda: bool(self._inbox))
            if self._inbox:
                return self._inbox.popleft()
            assert self._closed is not None
            raise self._closed

    def _read_until(self, ready: Callable[[], bool]) -> None:
        """Read and hand out messages until ``ready()`` or the pipe ends (lock held)."""
        while not ready() and self._closed is None:
            if self._reading:
                self._state.wait()
                continue
            self._reading = True
            self._state.release()
            messages: list[ToWorker] = []
            ended: BaseException | None = None
            try:
                data = os.read(self._fd, 1 << 16)
                if data:
                    messages = self._frames.feed(data)  # type: ignore[assignment]
                else:
                    ended = EOFError()
            except (OSError, FrameError) as exc:
                ended = exc
            finally:
                self._state.acquire()
                self._reading = False
            for message in messages:
                self._hand_out(message)
            if ended is not None:
                self._closed = ended
                self._fail_calls("the server closed the worker's pipe")
            self._state.notify_all()

    def _hand_out(self, message: ToWorker) -> None:
        if isinstance(message, ModelCallAnswer):
            on_answer = self._calls.get(message.call_id)
            if message.answer.final:
                self._calls.pop(message.call_id, None)
            if on_answer is not None:
                on_answer(message.answer)
            return
        if isinstance(message, Cancel):
            if self._on_cancel is not None:
                self._on_cancel(message)
            return
        if isinstance(message, Stop):
            self._fail_calls("the server is stopping")
        self._inbox.append(message)

    def _fail_calls(self, cause: str) -> None:
        calls, self._calls = self._calls, {}
        for on_answer in calls.values():
            on_answer(failed_answer(f"BLS call ended: {cause}", "UNAVAILABLE"))

    # -- model calls (BLS): this link is the worker's ModelCaller -----------------------

    def start(self, call: ModelCall, on_answer: Callable[[CallAnswer], None]) -> Callable[[], None]:
        """Send ``call`` to the server; its answers go to ``on_answer`` (see ModelCaller)."""
        with self._state:
            call_id = next(self._call_ids)
        try:
            frame = encode(ModelCallStart(call_id, call))
        except Exception as exc:
            on_answer(failed_answer(f"BLS call to {call.model}: cannot send it ({exc})"))
            return _nothing
        if len(frame) - HEADER_SIZE > MAX_BODY:
            on_answer(
                failed_answer(
                    f"BLS call to {call.model}: its inputs take {len(frame)} bytes; a call "
                    f"carries at most {MAX_BODY} bytes",
                    "INVALID_ARG",
                )
            )
            return _nothing
        with self._state:
            if self._closed is not None:
                on_answer(failed_answer("BLS call: the server closed the worker's pipe"))
                return _nothing
            self._calls[call_id] = on_answer
            if self._pump is None:
                self._pump = threading.Thread(target=self._pump_calls, name="bls", daemon=True)
                self._pump.start()
            self._state.notify_all()
        try:
            self.send_frame(frame)
        except OSError as exc:
            with self._state:
                self._calls.pop(call_id, None)
            on_answer(failed_answer(f"BLS call: the server is gone ({exc})", "UNAVAILABLE"))
            return _nothing
        return lambda: self._give_up(call_id)

    def _give_up(self, call_id: int) -> None:
        with self._state:
            pending = call_id in self._calls
        if pending:
            with contextlib.suppress(OSError):
                self.send(ModelCallCancel(call_id))

    def _pump_calls(self) -> None:
        """Read the pipe while model calls wait for answers (and nobody else reads)."""
        with self._state:
            while self._closed is None:
                if not self._calls:
                    self._state.wait()
                    continue
                self._read_until(lambda: not self._calls)


def _readable(fd: int) -> bool:
    """Whether ``fd`` has bytes (or its end) to read now. (``select``, not a shared
    ``poll`` object: the model's threads may ask at once, which ``poll`` refuses.)"""
    return bool(select.select([fd], [], [], 0)[0])


def _nothing() -> None:
    """Giving up a call that was never sent."""


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
    from sordino.backends.registry import backend_kind, create_backend

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
        if isinstance(backend, CallingBackend):
            backend.set_caller(link)  # the model's BLS calls go over the pipe
        backend.load(Path(spec.path), spec.target)
        warm_up = backend_kind(spec.backend, model=spec.model).warm_up
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
    streams = _Streams(link) if per_request or isinstance(backend, DecoupledBackend) else None
    if streams is not None and backend.metadata.decoupled:
        link.start_reader(streams.cancel)
    elif streams is not None:
        link.watch_cancels(streams.cancel)  # read when the model asks (_Link.poll)
    link.send(Ready(backend.metadata, os.getpid(), time.perf_counter() - started, per_request))
    try:
        _serve(link, backend, mapped, streams)
    except FrameError as exc:
        # The server's end is broken (here or inside a batch's Alloc exchange): leave,
        # saying why (exit code 1); the server sees the pipe close: a lost worker.
        sys.exit(f"sordino worker {spec.model}/{spec.index}: {exc}")


def _serve(link: _Link, backend: Backend, mapped: _Mapped, streams: _Streams | None) -> None:
    """Serve the pipe until told to stop or the server's end closes."""
    decoupled = streams is not None and backend.metadata.decoupled
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
                if decoupled:
                    assert streams is not None and isinstance(backend, DecoupledBackend)
                    _run_decoupled(link, backend, buffer, message, streams)
                elif not _run(link, backend, buffer, message, streams):
                    return
            case Call(call_id=call_id, command=command):
                _call(link, backend, call_id, command)
            case Cancel():
                pass  # a worker whose model reads cancellations takes them in _Link


class _Streams:
    """The decoupled batches whose requests may still send, and their cancellations.

    A :class:`Cancel` may be read (on the reader thread) before the main thread has
    taken its batch's :class:`Run`: batch ids only grow, so a cancellation for a batch
    not opened yet is kept until it opens, and one for a batch already closed is dropped.
    """

    def __init__(self, link: _Link) -> None:
        self.link = link
        self._lock = threading.Lock()
        self._open: dict[int, tuple[set[int], set[int]]] = {}  # batch -> (live, cancelled)
        self._early: dict[int, set[int]] = {}
        self._last = 0

    def open(self, batch_id: int, count: int) -> None:
        with self._lock:
            self._last = max(self._last, batch_id)
            self._open[batch_id] = (set(range(count)), self._early.pop(batch_id, set()))

    def cancel(self, message: Cancel) -> None:
        with self._lock:
            entry = self._open.get(message.batch_id)
            if entry is not None:
                entry[1].add(message.index)
            elif message.batch_id > self._last:
                self._early.setdefault(message.batch_id, set()).add(message.index)

    def cancelled(self, batch_id: int, index: int) -> bool:
        with self._lock:
            entry = self._open.get(batch_id)
            return entry is not None and index in entry[1]

    def ended(self, batch_id: int, index: int) -> None:
        """Request ``index`` had its last response: forget the batch once all have."""
        with self._lock:
            entry = self._open.get(batch_id)
            if entry is not None:
                entry[0].discard(index)
                if not entry[0]:
                    del self._open[batch_id]

    def close(self, batch_id: int) -> None:
        with self._lock:
            self._open.pop(batch_id, None)


class _BatchResponder:
    """A decoupled batch's :class:`~sordino.backends.decoupled.Responder`: each response
    leaves as a :class:`Respond` frame at once, from the thread that sent it."""

    def __init__(self, streams: _Streams, batch_id: int) -> None:
        self._streams = streams
        self._batch_id = batch_id

    def respond(
        self,
        index: int,
        outputs: dict[str, np.ndarray] | None,
        final: bool,
        error: str | None = None,
    ) -> None:
        frame = encode(Respond(self._batch_id, index, final, outputs or {}, error))
        if len(frame) - HEADER_SIZE > MAX_BODY:
            # The model's send raises, naming the limit; the request is still open.
            raise ValueError(
                f"a response of {len(frame)} bytes is larger than a decoupled model's "
                f"response may be ({MAX_BODY} bytes); send it in smaller responses"
            )
        self._streams.link.send_frame(frame)
        if final:
            self._streams.ended(self._batch_id, index)

    def cancelled(self, index: int) -> bool:
        return self._streams.cancelled(self._batch_id, index)


def _run_decoupled(
    link: _Link, backend: DecoupledBackend, buffer: memoryview, run: Run, streams: _Streams
) -> None:
    """Run one decoupled batch: :class:`Done` once ``execute`` returned (its responses
    are :class:`Respond` frames, sent meanwhile or later), :class:`RunFailed` if it raised."""
    started = time.perf_counter()
    streams.open(run.batch_id, max(1, len(run.rows)))
    try:
        batch = {name: view_tensor(buffer, handle) for name, handle in run.inputs.items()}
        if run.fault is not None:
            perform(run.fault, in_process=False)
        responder = _BatchResponder(streams, run.batch_id)
        backend.infer_decoupled(batch, run.rows, responder, run.requests)
        del batch
    except MemoryError as exc:
        streams.close(run.batch_id)
        link.send(RunFailed(run.batch_id, "oom", f"MemoryError: {exc}"))
        return
    except InjectedFault as exc:
        streams.close(run.batch_id)
        link.send(RunFailed(run.batch_id, "fault", f"{type(exc).__name__}: {exc}"))
        return
    except Exception as exc:
        streams.close(run.batch_id)
        link.send(RunFailed(run.batch_id, "error", f"{type(exc).__name__}: {exc}"))
        return
    link.send(Done(run.batch_id, {}, time.perf_counter() - started))


class _Mapped:
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


def _asker(link: _Link, streams: _Streams, batch_id: int) -> Callable[[int], bool]:
    """``is_cancelled()`` of a batch's requests: read what came, then look."""

    def cancelled(index: int) -> bool:
        link.poll()
        return streams.cancelled(batch_id, index)

    return cancelled


def _run(
    link: _Link, backend: Backend, buffer: memoryview, run: Run, streams: _Streams | None = None
) -> bool:
    """Run one batch and answer it; False when the server said to stop meanwhile.

    With ``streams`` (a backend that takes each request's facts) the model may ask
    whether a request was cancelled: that reads the pipe (:meth:`_Link.poll`).
    """
    started = time.perf_counter()
    batch_id = run.batch_id
    try:
        batch = {name: view_tensor(buffer, handle) for name, handle in run.inputs.items()}
        if run.fault is not None:
            perform(run.fault, in_process=False)
        if (run.rows or run.requests) and isinstance(backend, RequestBatchBackend):
            cancelled = None
            if streams is not None:
                streams.open(batch_id, max(1, len(run.rows)))
                cancelled = _asker(link, streams, batch_id)
            try:
                results = backend.infer_requests(batch, run.rows, run.requests, cancelled)
            finally:
                if streams is not None:
                    streams.close(batch_id)
        else:
            results = backend.infer(batch)
        del batch
    except MemoryError as exc:
        link.send(RunFailed(batch_id, "oom", f"MemoryError: {exc}"))
        return True
    except InjectedFault as exc:
        link.send(RunFailed(batch_id, "fault", f"{type(exc).__name__}: {exc}"))
        return True
    except Exception as exc:
        link.send(RunFailed(batch_id, "error", f"{type(exc).__name__}: {exc}"))
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
