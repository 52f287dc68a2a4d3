"""The wire of the worker pipe: one frame per message (the layout is in ``execution/messages.py``).

:func:`encode` writes a message as one frame; :class:`FrameReader` reads frames back from
reads of any size, and raises :class:`FrameError` for bytes that are not a frame.
"""

from __future__ import annotations

import pickle
import struct
from typing import TYPE_CHECKING, Any

import numpy as np

from sordino.execution.call_messages import ModelCallAnswer, ModelCallCancel, ModelCallStart
from sordino.execution.decoupled_messages import Cancel, Respond
from sordino.execution.faults import FaultAction
from sordino.execution.run_messages import (
    HEARTBEAT,
    STOP,
    Alloc,
    Allocated,
    Call,
    CallFailed,
    Done,
    Heartbeat,
    LoadFailed,
    Ready,
    ReadyAnswer,
    ReadyCheck,
    Reply,
    Run,
    RunFailed,
    Stop,
)
from sordino.inference import RequestFacts
from sordino.memo import Memo
from sordino.memory.tensors import TensorHandle

if TYPE_CHECKING:
    from sordino.execution.messages import FromWorker, ToWorker

__all__ = ["HEADER_SIZE", "MAX_BODY", "FrameError", "FrameReader", "encode"]

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
_RESPOND_HEAD = struct.Struct("<QIBB")  # batch id, index, final, 0 or an error's code + 1
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
_SEEN_BYTES = 512  # the longest facts kept in _SEEN_FACTS
_SAME_BYTES = 1 << 16  # the most bytes compared at once with the first request's, repeated
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
            body = _ID.pack(message.batch_id) + _handles(message.space) + _text(message.refused)
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
                        message.batch_id,
                        message.index,
                        message.final,
                        0 if error is None else 1 + min(max(message.code, 0), 254),
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
        """A Run's request facts. Each request's bytes are first measured (lengths only);
        requests whose bytes were seen before get the same (frozen) record, and when the
        other requests' bytes are all the first's, one compare reads them: the requests
        of a batch mostly carry the same facts, and decoding them was a good share of a
        Python-backend worker's time a request."""
        count: int = self.unpack(_LEN)[0]
        data, at = self.data, self.at
        out: list[RequestFacts] = []
        chunk = b""
        record: RequestFacts | None = None
        for done in range(count):
            rest = len(chunk) * (count - 1) if done == 1 else 0
            if 0 < rest <= _SAME_BYTES and data.startswith(chunk * (count - 1), at):
                # Every other request's bytes are the first's (the common case): one compare.
                self.at = at + rest
                assert record is not None  # the first request's, read above
                return (record,) * count
            start = at
            bits = data[at]
            at += _FACTS_HEAD.size
            texts = 2 + bool(bits & _HAS_TENANT) + bool(bits & _TEXT_CORRID)
            for _ in range(texts):
                at += _LEN.size + _LEN.unpack_from(data, at)[0]
            (outputs,) = _COUNT.unpack_from(data, at)
            at += _COUNT.size
            for _ in range(outputs):
                at += _LEN.size + _LEN.unpack_from(data, at)[0]
            if at > len(data):
                raise FrameError("a frame ends in the middle of a field")
            chunk = data[start:at]
            record = _SEEN_FACTS[chunk] if len(chunk) <= _SEEN_BYTES else _facts_of(chunk)
            out.append(record)
        self.at = at
        return tuple(out)

    def one_facts(self) -> RequestFacts:
        """One request's facts, which are the whole body."""
        bits, priority, deadline, number, flags, timeout = self.unpack(_FACTS_HEAD)
        request_id, parameters = self.text(), self.text()
        tenant = self.text() if bits & _HAS_TENANT else None
        corrid: int | str = self.text() if bits & _TEXT_CORRID else number
        (outputs,) = self.unpack(_COUNT)
        facts = RequestFacts(
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
        if self.at != len(self.data):
            raise FrameError("a request's facts are shorter than their bytes")
        return facts

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
            message = Allocated(batch_id, body.handles(), body.text())
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
            batch_id, index, final, coded = body.unpack(_RESPOND_HEAD)
            error = body.text() if coded else None
            message = Respond(
                batch_id, index, bool(final), body.arrays(), error, coded - 1 if coded else 1
            )
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
    ReadyCheck,
    ReadyAnswer,
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


def _facts_of(chunk: bytes) -> RequestFacts:
    """One request's facts from their bytes alone."""
    return _Body(chunk).one_facts()


_SEEN_FACTS: Memo[bytes, RequestFacts] = Memo(_facts_of, 1024)
"""Request facts decoded lately, by their bytes (a reader meets the same ones again)."""
