"""The messages between the server and a worker process, one frozen dataclass each.

Both ends of the pipe (``execution/worker.py`` in the server, ``execution/worker_main.py``
in the worker) send these and ``match`` on their type. They are small: tensor data
never crosses the pipe, only :class:`TensorHandle` objects naming places in the
shared-memory arena.

On the wire (a socket pair) each message is one frame, :func:`encode` writes it and
:class:`FrameReader` reads it back from reads of any size: a 5-byte header (body length,
``uint32`` little-endian; kind, ``uint8``) and the body. The messages of every batch
(:class:`Run`, :class:`Done`, :class:`RunFailed`, :class:`Alloc`, :class:`Allocated`)
and :class:`Heartbeat`/:class:`Stop` have struct layouts of their own, no pickle: ids
``uint64``, ``infer_s`` a ``float64``, strings a ``uint32`` length and UTF-8, a handle
dict a ``uint16`` count then per handle (name length, dtype length, ndim as ``uint8``;
offset, nbytes, capacity as ``uint64``), the name, the dtype and the shape (``int64``
each). A :class:`Run`'s chaos fault (rare) is pickled at the end of its body. The rare
messages (:class:`Ready`, :class:`LoadFailed`, :class:`Call`, :class:`Reply`,
:class:`CallFailed`, the model calls') are pickled whole in a frame of their own kind.
A frame that does
not parse (unknown kind, a declared length over :data:`MAX_BODY`, a body too short or
too long, bad UTF-8, a pickle of anything else) raises :class:`FrameError`: the server
then kills the worker as lost, a worker exits (code 1).

Start-up. The worker maps the arena, loads its model and runs warm-up batches, then
says :class:`Ready` (or :class:`LoadFailed` and exits). From then on a heartbeat
thread sends :class:`Heartbeat` every ``heartbeat_s``.

The pipe carries one exchange at a time, and the server never starts a second one
before the first has ended:

- a batch: the server sends :class:`Run` with the input handles and output space it
  reserved for outputs of known size. If an output does not fit, the worker sends
  :class:`Alloc` with the sizes it needs and reads the pipe for the answer alone; the
  server replies :class:`Allocated` (or :class:`Stop` when it is going away). The
  batch ends with :class:`Done` (the output handles and the model's time) or
  :class:`RunFailed` (the model raised; ``kind`` is ``"oom"`` for a MemoryError).
- a command, between batches: the server sends :class:`Call` with a ``call_id`` and a
  :data:`Command`; the worker answers :class:`Reply` or :class:`CallFailed`. The
  commands are :class:`ProfileStart` (serve from a profiling session whose trace file
  starts with ``prefix``; replies None) and :class:`ProfileStop` (put the serving
  session back; replies :class:`ProfileStopped`).

Model calls (Triton's BLS), at any moment, beside the exchanges above: the worker
sends :class:`ModelCallStart` with a ``call_id`` of its own and a
:class:`~sordino.backends.calls.ModelCall` (the callee, inputs as numpy arrays,
the calling request's priority, deadline and tenant); the server runs it through its
request path and sends one :class:`ModelCallAnswer` per response, the last one final
(always one, whatever happens: an error answer when the call fails, is cancelled or
the server stops). :class:`ModelCallCancel` gives a call up. The tensors of a call
travel pickled in the frame (a copy each way, bounded by :data:`MAX_BODY`), not in
the arena: the server writes answers without blocking its loop, and the worker reads
them whichever of its threads waits (``worker_main._Link``).

A decoupled model's batch (``ModelMetadata.decoupled``) is the same :class:`Run`,
ended by :class:`Done` (no outputs) once ``execute`` returned; each response the model
sends, during the batch or after it, is a :class:`Respond` frame (the request's index
in the batch, its tensors inline, the final flag, or an error), from any thread of the
worker. The server may send :class:`Cancel` at any time for such a request whose client
went away; the worker of a decoupled model reads its pipe on a thread of its own, so it
sees the cancellation while the model runs, and ``is_cancelled()`` turns true.

:class:`Stop` asks the worker to exit. The server's end closing (end of file) means
the same; the worker's end closing tells the server the process is gone.
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from sordino.backends.calls import CallAnswer, ModelCall
from sordino.execution.faults import FaultAction
from sordino.inference import ModelMetadata, RequestFacts
from sordino.memory.tensors import TensorHandle

__all__ = [
    "HEADER_SIZE",
    "HEARTBEAT",
    "MAX_BODY",
    "STOP",
    "Alloc",
    "Allocated",
    "Call",
    "CallFailed",
    "Cancel",
    "Command",
    "Done",
    "FrameError",
    "FrameReader",
    "FromWorker",
    "Heartbeat",
    "LoadFailed",
    "ModelCallAnswer",
    "ModelCallCancel",
    "ModelCallStart",
    "ProfileStart",
    "ProfileStop",
    "ProfileStopped",
    "Ready",
    "Reply",
    "Respond",
    "Run",
    "RunFailed",
    "Stop",
    "ToWorker",
    "encode",
]

# -- server to worker ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Run:
    """Run one batch: inputs in the arena, and space reserved for outputs of known size."""

    batch_id: int
    inputs: dict[str, TensorHandle]
    space: dict[str, TensorHandle]
    fault: FaultAction | None
    segment: str = ""
    """The arena segment the handles name; when it is not the one the worker maps
    (the pool was resized), the worker maps this one first. Empty: unchanged."""
    rows: tuple[int, ...] = ()
    """The rows of each request in the batch, in order, for a backend that runs a batch
    as its requests (Triton's Python backend); empty when the batch is one part."""
    requests: tuple[RequestFacts, ...] = ()
    """Each request's facts (id, correlation ID, parameters, ...), in order, for a
    worker whose backend takes them (:attr:`Ready.per_request`); else empty."""


@dataclass(frozen=True, slots=True)
class Allocated:
    """The answer to :class:`Alloc`: space for each output that asked for it."""

    batch_id: int
    space: dict[str, TensorHandle]


@dataclass(frozen=True, slots=True)
class ProfileStart:
    """Serve later batches from a profiling session; its trace file starts with ``prefix``."""

    name: ClassVar[str] = "profile_start"
    prefix: str


@dataclass(frozen=True, slots=True)
class ProfileStop:
    """Put the serving session back; the reply is :class:`ProfileStopped`."""

    name: ClassVar[str] = "profile_stop"


Command = ProfileStart | ProfileStop
"""What :class:`Call` may carry."""


@dataclass(frozen=True, slots=True)
class ModelCallAnswer:
    """An answer to the worker's model call ``call_id``; ``answer.final`` ends the call."""

    call_id: int
    answer: CallAnswer


@dataclass(frozen=True, slots=True)
class Call:
    """Carry out ``command`` between batches; answered by :class:`Reply` or :class:`CallFailed`."""

    call_id: int
    command: Command


@dataclass(frozen=True, slots=True)
class Stop:
    """Exit now."""


STOP = Stop()


@dataclass(frozen=True, slots=True)
class Cancel:
    """The client of request ``index`` of decoupled batch ``batch_id`` cancelled it."""

    batch_id: int
    index: int


ToWorker = Run | Allocated | Call | Stop | Cancel | ModelCallAnswer

# -- worker to server ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """The model is loaded and warm: its metadata, the worker's pid and the load time."""

    metadata: ModelMetadata
    pid: int
    load_s: float
    per_request: bool = False
    """Whether the backend runs a batch as its requests and takes their facts
    (:class:`~sordino.backends.base.RequestBatchBackend`): only then do batches carry
    them (:attr:`Run.requests`), so the hop of other models costs nothing more."""


@dataclass(frozen=True, slots=True)
class LoadFailed:
    """The model could not be loaded or warmed up; the worker exits after this."""

    message: str


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The worker is alive (sent every ``heartbeat_s`` by a thread of its own)."""


HEARTBEAT = Heartbeat()


@dataclass(frozen=True, slots=True)
class Alloc:
    """Batch ``batch_id`` needs arena space of these sizes (bytes) for these outputs."""

    batch_id: int
    sizes: dict[str, int]


@dataclass(frozen=True, slots=True)
class Done:
    """Batch ``batch_id`` ran: its outputs' handles and the seconds the model took."""

    batch_id: int
    outputs: dict[str, TensorHandle]
    infer_s: float


@dataclass(frozen=True, slots=True)
class RunFailed:
    """Batch ``batch_id`` failed: ``kind`` is ``"oom"`` (a MemoryError), ``"fault"`` (an
    injected chaos fault) or ``"error"`` (the model raised)."""

    batch_id: int
    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class ProfileStopped:
    """The reply to :class:`ProfileStop`: the trace file and the batches it covers."""

    path: str
    batches: int


@dataclass(frozen=True, slots=True)
class Reply:
    """Command ``call_id`` succeeded with ``value`` (None, or a reply record above)."""

    call_id: int
    value: ProfileStopped | None


@dataclass(frozen=True, slots=True)
class CallFailed:
    """Command ``call_id`` raised; ``message`` names the command and the error."""

    call_id: int
    message: str


@dataclass(frozen=True, slots=True)
class ModelCallStart:
    """The model asks the server for an inference on another model (BLS): ``call``.

    ``call_id`` is the worker's own numbering; the answers name it.
    """

    call_id: int
    call: ModelCall


@dataclass(frozen=True, slots=True)
class ModelCallCancel:
    """The model gave call ``call_id`` up: the server cancels it (a final answer follows)."""

    call_id: int


@dataclass(frozen=True, slots=True)
class Respond:
    """A decoupled model's response to request ``index`` of batch ``batch_id``.

    ``outputs`` are the response's tensors (none with a bare final flag), carried in the
    frame: the model sends from any thread, at any time, so there is no arena exchange
    to place them. ``final``: the request's last response. ``error``: the model answered
    the request with an error, which ends it.
    """

    batch_id: int
    index: int
    final: bool
    outputs: dict[str, np.ndarray]
    error: str | None = None


FromWorker = (
    Ready
    | LoadFailed
    | Heartbeat
    | Alloc
    | Done
    | RunFailed
    | Reply
    | CallFailed
    | ModelCallStart
    | ModelCallCancel
    | Respond
)

# -- the wire: one frame per message --------------------------------------------------
#
# Hand-written rather than pickle: pickling these frozen dataclasses (and unpickling
# them through __setstate__) was most of the cost of the hop per batch; a fixed struct
# header and a compact handle layout are several times cheaper and need no import
# machinery on the receiving side. No library offers this for our own types (msgpack
# would still need the same per-type mapping and is not a dependency).

_HEADER = struct.Struct("<IB")  # body length, kind
HEADER_SIZE = _HEADER.size
MAX_BODY = 64 << 20
"""Longest body a frame may declare; a longer one is garbage (messages are small)."""

_RUN, _ALLOCATED, _STOP, _HEARTBEAT, _ALLOC, _DONE, _RUN_FAILED, _PICKLED = range(1, 9)
# A decoupled model's frames, numbered apart from the others (room for kinds between).
_RESPOND, _CANCEL = 20, 21
_RESPOND_HEAD = struct.Struct("<QIBB")  # batch id, index, final, has an error
_CANCEL_BODY = struct.Struct("<QI")  # batch id, index
_ARRAY = struct.Struct("<BBBQ")  # name length, dtype length, ndim, data bytes
_ID = struct.Struct("<Q")
_RUN_HEAD = struct.Struct("<QB")  # batch id, has a fault
_DONE_HEAD = struct.Struct("<Qd")  # batch id, infer_s
_COUNT = struct.Struct("<H")
_LEN = struct.Struct("<I")
_HANDLE = struct.Struct("<BBBQQQ")  # name length, dtype length, ndim, offset, nbytes, capacity
_SIZE = struct.Struct("<BQ")  # name length, size
# A Run's request facts follow its rows: a uint32 count, then per request this head
# (presence bits, priority, deadline, numeric correlation ID, flags, timeout in
# microseconds), the id and the parameters as strings, the tenant and a string
# correlation ID when the bits say so, and the requested outputs (uint16 count, strings).
_FACTS_HEAD = struct.Struct("<BqdQIQ")
_HAS_PRIORITY, _HAS_DEADLINE, _HAS_TENANT, _TEXT_CORRID = 1, 2, 4, 8
_HEARTBEAT_FRAME = _HEADER.pack(0, _HEARTBEAT)
_STOP_FRAME = _HEADER.pack(0, _STOP)


class FrameError(ValueError):
    """Bytes on the channel that are not a well-formed frame (a broken peer)."""


def _text(value: str) -> bytes:
    data = value.encode()
    return _LEN.pack(len(data)) + data


def _handles(handles: dict[str, TensorHandle]) -> bytes:
    parts = [_COUNT.pack(len(handles))]
    for name, h in handles.items():
        key, dtype = name.encode(), h.dtype.encode()
        ndim = len(h.shape)
        parts.append(_HANDLE.pack(len(key), len(dtype), ndim, h.offset, h.nbytes, h.capacity))
        parts.append(key + dtype + struct.pack(f"<{ndim}q", *h.shape))
    return b"".join(parts)


def _arrays(arrays: dict[str, np.ndarray]) -> bytes:
    """Tensors inline: per tensor its name, dtype, shape and data (BYTES as the KServe
    binary form: each element a ``uint32`` length and its bytes)."""
    parts = [_COUNT.pack(len(arrays))]
    for name, array in arrays.items():
        if array.dtype.kind in "OSU":
            items = [v if isinstance(v, bytes) else str(v).encode() for v in array.flat]
            data = b"".join(_LEN.pack(len(item)) + item for item in items)
            dtype = "object"
        else:
            data = np.ascontiguousarray(array).tobytes()
            dtype = array.dtype.str
        key, kind = name.encode(), dtype.encode()
        parts.append(_ARRAY.pack(len(key), len(kind), array.ndim, len(data)))
        parts.append(key + kind + struct.pack(f"<{array.ndim}q", *array.shape) + data)
    return b"".join(parts)


def _facts(requests: tuple[RequestFacts, ...]) -> bytes:
    parts = [_LEN.pack(len(requests))]
    for facts in requests:
        bits = 0
        if facts.priority is not None:
            bits |= _HAS_PRIORITY
        if facts.deadline is not None:
            bits |= _HAS_DEADLINE
        if facts.tenant is not None:
            bits |= _HAS_TENANT
        corrid = facts.correlation_id
        if isinstance(corrid, str):
            bits |= _TEXT_CORRID
        parts.append(
            _FACTS_HEAD.pack(
                bits,
                facts.priority or 0,
                facts.deadline or 0.0,
                0 if isinstance(corrid, str) else corrid,
                facts.flags,
                facts.timeout_us,
            )
        )
        parts.append(_text(facts.id))
        parts.append(_text(facts.parameters))
        if facts.tenant is not None:
            parts.append(_text(facts.tenant))
        if isinstance(corrid, str):
            parts.append(_text(corrid))
        parts.append(_COUNT.pack(len(facts.outputs)))
        parts.extend(_text(name) for name in facts.outputs)
    return b"".join(parts)


def encode(message: ToWorker | FromWorker) -> bytes:
    """One frame holding ``message`` (header and body)."""
    match message:
        case Heartbeat():
            return _HEARTBEAT_FRAME
        case Stop():
            return _STOP_FRAME
        case Run():
            fault = b"" if message.fault is None else pickle.dumps(message.fault)
            body = b"".join(
                (
                    _RUN_HEAD.pack(message.batch_id, bool(fault)),
                    _text(message.segment),
                    _handles(message.inputs),
                    _handles(message.space),
                    _LEN.pack(len(message.rows)),
                    struct.pack(f"<{len(message.rows)}q", *message.rows),
                    _facts(message.requests),
                    fault,
                )
            )
            kind = _RUN
        case Done():
            body = _DONE_HEAD.pack(message.batch_id, message.infer_s) + _handles(message.outputs)
            kind = _DONE
        case Allocated():
            body = _ID.pack(message.batch_id) + _handles(message.space)
            kind = _ALLOCATED
        case Alloc():
            parts = [_ID.pack(message.batch_id), _COUNT.pack(len(message.sizes))]
            for name, size in message.sizes.items():
                key = name.encode()
                parts.append(_SIZE.pack(len(key), size) + key)
            body, kind = b"".join(parts), _ALLOC
        case RunFailed():
            body = _ID.pack(message.batch_id) + _text(message.kind) + _text(message.message)
            kind = _RUN_FAILED
        case Respond():
            error = message.error
            body = b"".join(
                (
                    _RESPOND_HEAD.pack(
                        message.batch_id, message.index, message.final, error is not None
                    ),
                    _text(error) if error is not None else b"",
                    _arrays(message.outputs),
                )
            )
            kind = _RESPOND
        case Cancel():
            body, kind = _CANCEL_BODY.pack(message.batch_id, message.index), _CANCEL
        case _:
            body, kind = pickle.dumps(message, pickle.HIGHEST_PROTOCOL), _PICKLED
    return _HEADER.pack(len(body), kind) + body


class _Body:
    """A cursor over one frame's body; reading past its end is a :class:`FrameError`."""

    __slots__ = ("at", "data")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        end = self.at + n
        if end > len(self.data):
            raise FrameError("a frame ends in the middle of a field")
        chunk = self.data[self.at : end]
        self.at = end
        return chunk

    def unpack(self, layout: struct.Struct) -> tuple[Any, ...]:
        return layout.unpack(self.take(layout.size))

    def text(self) -> str:
        (n,) = self.unpack(_LEN)
        return self.take(n).decode()

    def handles(self) -> dict[str, TensorHandle]:
        (count,) = self.unpack(_COUNT)
        out = {}
        for _ in range(count):
            name_len, dtype_len, ndim, offset, nbytes, capacity = self.unpack(_HANDLE)
            name = self.take(name_len).decode()
            dtype = self.take(dtype_len).decode("ascii")
            shape = struct.unpack(f"<{ndim}q", self.take(8 * ndim))
            out[name] = TensorHandle(offset, nbytes, dtype, shape, capacity)
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        (count,) = self.unpack(_COUNT)
        out: dict[str, np.ndarray] = {}
        for _ in range(count):
            name_len, dtype_len, ndim, nbytes = self.unpack(_ARRAY)
            name = self.take(name_len).decode()
            dtype = self.take(dtype_len).decode("ascii")
            shape = struct.unpack(f"<{ndim}q", self.take(8 * ndim))
            data = self.take(nbytes)
            if dtype == "object":
                items = []
                inner = _Body(data)
                while inner.at < len(data):
                    (n,) = inner.unpack(_LEN)
                    items.append(inner.take(n))
                flat = np.empty(len(items), dtype=np.object_)
                flat[:] = items
                out[name] = flat.reshape(shape)
            else:
                out[name] = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)
        return out

    def facts(self) -> tuple[RequestFacts, ...]:
        (count,) = self.unpack(_LEN)
        out = []
        for _ in range(count):
            bits, priority, deadline, number, flags, timeout = self.unpack(_FACTS_HEAD)
            request_id, parameters = self.text(), self.text()
            tenant = self.text() if bits & _HAS_TENANT else None
            corrid: int | str = self.text() if bits & _TEXT_CORRID else number
            (outputs,) = self.unpack(_COUNT)
            out.append(
                RequestFacts(
                    id=request_id,
                    correlation_id=corrid,
                    parameters=parameters,
                    outputs=tuple(self.text() for _ in range(outputs)),
                    flags=flags,
                    timeout_us=timeout,
                    priority=priority if bits & _HAS_PRIORITY else None,
                    deadline=deadline if bits & _HAS_DEADLINE else None,
                    tenant=tenant,
                )
            )
        return tuple(out)

    def rest(self) -> bytes:
        return self.take(len(self.data) - self.at)


def _decode(kind: int, data: bytes) -> ToWorker | FromWorker:
    body = _Body(data)
    message: ToWorker | FromWorker
    match kind:
        case 4:  # _HEARTBEAT
            message = HEARTBEAT
        case 3:  # _STOP
            message = STOP
        case 1:  # _RUN
            batch_id, has_fault = body.unpack(_RUN_HEAD)
            segment = body.text()
            inputs, space = body.handles(), body.handles()
            (count,) = body.unpack(_LEN)
            rows = struct.unpack(f"<{count}q", body.take(8 * count))
            requests = body.facts()
            fault = pickle.loads(body.rest()) if has_fault else None
            if fault is not None and not isinstance(fault, FaultAction):
                raise FrameError("a Run frame carries something other than a fault")
            message = Run(batch_id, inputs, space, fault, segment, rows, requests)
        case 6:  # _DONE
            batch_id, infer_s = body.unpack(_DONE_HEAD)
            message = Done(batch_id, body.handles(), infer_s)
        case 2:  # _ALLOCATED
            (batch_id,) = body.unpack(_ID)
            message = Allocated(batch_id, body.handles())
        case 5:  # _ALLOC
            batch_id, count = body.unpack(_ID)[0], body.unpack(_COUNT)[0]
            sizes = {}
            for _ in range(count):
                name_len, size = body.unpack(_SIZE)
                sizes[str(body.take(name_len), "utf-8")] = size
            message = Alloc(batch_id, sizes)
        case 7:  # _RUN_FAILED
            (batch_id,) = body.unpack(_ID)
            message = RunFailed(batch_id, body.text(), body.text())
        case 20:  # _RESPOND
            batch_id, index, final, has_error = body.unpack(_RESPOND_HEAD)
            error = body.text() if has_error else None
            message = Respond(batch_id, index, bool(final), body.arrays(), error)
        case 21:  # _CANCEL
            batch_id, index = body.unpack(_CANCEL_BODY)
            message = Cancel(batch_id, index)
        case 8:  # _PICKLED
            message = pickle.loads(body.rest())
            if not isinstance(message, _PICKLED_TYPES):
                raise FrameError(f"a pickled frame holds a {type(message).__name__}")
        case _:
            raise FrameError(f"unknown frame kind {kind}")
    if body.at != len(data):
        raise FrameError("a frame has bytes after its message")
    return message


_PICKLED_TYPES = (
    Call,
    Ready,
    LoadFailed,
    Reply,
    CallFailed,
    ModelCallStart,
    ModelCallAnswer,
    ModelCallCancel,
)


class FrameReader:
    """Splits the bytes read from the channel into messages, whatever the read sizes."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    @property
    def pending(self) -> int:
        """Bytes received that do not yet make a whole frame."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[ToWorker | FromWorker]:
        """Take ``data``; return the messages it completes, in order.

        Raises :class:`FrameError` for bytes that cannot be a frame (an unknown kind, a
        declared length beyond :data:`MAX_BODY`, a body that does not parse).
        """
        buffer = self._buffer
        buffer += data
        messages: list[ToWorker | FromWorker] = []
        at, end = 0, len(buffer)
        while end - at >= HEADER_SIZE:
            length, kind = _HEADER.unpack_from(buffer, at)
            if length > MAX_BODY:
                raise FrameError(f"a frame declares {length} bytes (at most {MAX_BODY})")
            start = at + HEADER_SIZE
            if end - start < length:
                break
            try:
                messages.append(_decode(kind, bytes(buffer[start : start + length])))
            except FrameError:
                raise
            except Exception as exc:  # struct, unicode, pickle: all mean garbage
                raise FrameError(f"a garbled frame ({type(exc).__name__}: {exc})") from None
            at = start + length
        del buffer[:at]
        return messages
