"""The worker's run loop: serve the pipe, run each batch (plain or decoupled) and command.

Entered from :func:`~sordino.execution.worker_main.worker_main` once the model is
loaded; a decoupled model's batches and the cancellations of requests are tracked by
:class:`Streams` (see ``execution/worker_main.py``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from sordino.backends.base import Backend, ProfilingBackend, RequestBatchBackend
from sordino.backends.decoupled import DecoupledBackend
from sordino.execution.faults import InjectedFault, perform
from sordino.execution.messages import (
    HEADER_SIZE,
    MAX_BODY,
    Alloc,
    Allocated,
    Call,
    CallFailed,
    Cancel,
    Command,
    Done,
    LogChange,
    ProfileStart,
    ProfileStop,
    ProfileStopped,
    Reply,
    Respond,
    Run,
    RunFailed,
    Stop,
    encode,
)
from sordino.execution.worker_link import WorkerLink
from sordino.inference import Tensor
from sordino.memory.tensors import TensorHandle, tensor_nbytes, view_tensor, write_tensor
from sordino.telemetry.log_settings import process_log_settings

if TYPE_CHECKING:
    from sordino.execution.worker_main import MappedArena

__all__ = ["Streams", "serve"]


def serve(link: WorkerLink, backend: Backend, mapped: MappedArena, streams: Streams | None) -> None:
    """Serve the pipe until told to stop or the server's end closes."""
    decoupled = streams is not None and backend.metadata.decoupled
    # Once: a Protocol's isinstance check costs tens of microseconds (it showed per batch).
    per_request = isinstance(backend, RequestBatchBackend)
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
                elif not _run(link, backend, buffer, message, streams, per_request):
                    return
            case Call(call_id=call_id, command=command):
                _call(link, backend, call_id, command)
            case Cancel():
                pass  # a worker whose model reads cancellations takes them in WorkerLink


class Streams:
    """The decoupled batches whose requests may still send, and their cancellations.

    A :class:`Cancel` may be read (on the reader thread) before the main thread has
    taken its batch's :class:`Run`: batch ids only grow, so a cancellation for a batch
    not opened yet is kept until it opens, and one for a batch already closed is dropped.
    """

    def __init__(self, link: WorkerLink) -> None:
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

    def __init__(self, streams: Streams, batch_id: int) -> None:
        self._streams = streams
        self._batch_id = batch_id

    def respond(
        self,
        index: int,
        outputs: dict[str, np.ndarray] | None,
        final: bool,
        error: str | None = None,
        code: int = 1,
    ) -> None:
        frame = encode(Respond(self._batch_id, index, final, outputs or {}, error, code))
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
    link: WorkerLink, backend: DecoupledBackend, buffer: memoryview, run: Run, streams: Streams
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


def _call(link: WorkerLink, backend: Backend, call_id: int, command: Command) -> None:
    try:
        value: ProfileStopped | None = None
        if isinstance(command, LogChange):
            process_log_settings().update(dict(command.settings))
            link.send(Reply(call_id, None))
            return
        if not isinstance(backend, ProfilingBackend):
            raise RuntimeError(f"the {type(backend).__name__} backend cannot profile")
        match command:
            case ProfileStart(prefix=prefix):
                backend.start_profiling(prefix)
            case ProfileStop():
                value = ProfileStopped(*backend.stop_profiling())
    except Exception as exc:
        link.send(CallFailed(call_id, f"{command.name}: {type(exc).__name__}: {exc}"))
        return
    link.send(Reply(call_id, value))


def _asker(link: WorkerLink, streams: Streams, batch_id: int) -> Callable[[int], bool]:
    """``is_cancelled()`` of a batch's requests: read what came, then look."""

    def cancelled(index: int) -> bool:
        link.poll()
        return streams.cancelled(batch_id, index)

    return cancelled


class _Stopping(Exception):
    """The server said Stop (or went away) while the worker asked it for output space."""


class _Unsendable(Exception):
    """An output the model gave cannot be written into the arena (a string tensor of
    other objects): the batch fails saying why, the worker serves on."""


class _Refused(Exception):
    """The server has no room for the batch's outputs (larger than the arena): the
    batch fails, the worker serves on."""


class _Outputs:
    """Where a batch's outputs go in the arena: the space the server reserved with the
    batch, and more asked for with :class:`Alloc` (one exchange each time) when short."""

    def __init__(self, link: WorkerLink, buffer: memoryview, run: Run) -> None:
        self._link = link
        self._buffer = buffer
        self._run = run
        self.space = dict(run.space)
        self.placed: dict[str, tuple[np.ndarray, TensorHandle]] = {}

    def reserve(self, sizes: dict[str, int]) -> None:
        """Make sure each output named has ``sizes[name]`` bytes of space."""
        short = {
            name: size
            for name, size in sizes.items()
            if name not in self.space or self.space[name].capacity < size
        }
        if not short:
            return
        self._link.send(Alloc(self._run.batch_id, short))
        try:
            reply = self._link.recv()  # the only message the server sends in this exchange
        except (EOFError, OSError):
            raise _Stopping from None  # the server is gone
        if not isinstance(reply, Allocated):
            raise _Stopping  # Stop: the server is going away
        if reply.refused:
            raise _Refused(f"cannot place outputs: {reply.refused}")
        self.space.update(reply.space)

    def place(self, layouts: dict[str, tuple[np.dtype[Any], tuple[int, ...]]]) -> dict[str, Tensor]:
        """The backend's :data:`~sordino.backends.base.OutputPlacer`: an array in the
        arena for each output, of the dtype and shape asked for."""
        sizes = {name: math.prod(shape) * dt.itemsize for name, (dt, shape) in layouts.items()}
        self.reserve(sizes)
        arrays: dict[str, Tensor] = {}
        for name, (dtype, shape) in layouts.items():
            space = self.space[name]
            array: Tensor = np.ndarray(shape, dtype, self._buffer, space.offset)
            handle = TensorHandle(space.offset, sizes[name], dtype.str, shape, space.capacity)
            self.placed[name] = (array, handle)
            arrays[name] = array
        return arrays

    def written(self, results: dict[str, Tensor]) -> dict[str, TensorHandle]:
        """The handles of ``results``: those placed as they lie, the others copied in."""
        handles: dict[str, TensorHandle] = {}
        rest: dict[str, Tensor] = {}
        for name, array in results.items():
            placed = self.placed.get(name)
            if placed is not None and placed[0] is array:
                handles[name] = placed[1]
            else:
                rest[name] = array
        if not rest:
            return handles
        try:
            sizes = {name: tensor_nbytes(array) for name, array in rest.items()}
        except Exception as exc:  # an output the model made that cannot be sent
            raise _Unsendable(f"cannot send the outputs: {exc}") from exc
        self.reserve(sizes)
        for name, array in rest.items():
            space = self.space[name]
            try:
                handles[name] = write_tensor(self._buffer, space.offset, space.capacity, array)
            except Exception as exc:
                raise _Unsendable(f"cannot send the outputs: {exc}") from exc
        return {name: handles[name] for name in results}  # in the model's order


def _run(
    link: WorkerLink,
    backend: Backend,
    buffer: memoryview,
    run: Run,
    streams: Streams | None = None,
    per_request: bool = False,
) -> bool:
    """Run one batch and answer it; False when the server said to stop meanwhile.

    With ``streams`` (a backend that takes each request's facts) the model may ask
    whether a request was cancelled: that reads the pipe (:meth:`WorkerLink.poll`).
    Such a backend writes its outputs into the arena itself (``place``); other
    outputs are copied in once the backend returned them. ``per_request``: whether
    ``backend`` is a :class:`RequestBatchBackend` (checked once by :func:`serve`).
    """
    started = time.perf_counter()
    batch_id = run.batch_id
    outputs = _Outputs(link, buffer, run)
    try:
        batch = {name: view_tensor(buffer, handle) for name, handle in run.inputs.items()}
        if run.fault is not None:
            perform(run.fault, in_process=False)
        if (run.rows or run.requests) and per_request:
            cancelled = None
            if streams is not None:
                streams.open(batch_id, max(1, len(run.rows)))
                cancelled = _asker(link, streams, batch_id)
            try:
                results = cast(RequestBatchBackend, backend).infer_requests(
                    batch, run.rows, run.requests, cancelled, place=outputs.place
                )
            finally:
                if streams is not None:
                    streams.close(batch_id)
        else:
            results = backend.infer(batch)
        del batch
    except _Stopping:
        return False
    except _Refused as exc:
        link.send(RunFailed(batch_id, "error", str(exc)))
        return True
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
    try:
        written = outputs.written(results)
    except _Stopping:
        return False
    except _Refused as exc:
        link.send(RunFailed(batch_id, "error", str(exc)))
        return True
    except _Unsendable as exc:  # the batch's error, not the worker's end
        link.send(RunFailed(batch_id, "error", str(exc)))
        return True
    link.send(Done(run.batch_id, written, infer_s))
    return True
