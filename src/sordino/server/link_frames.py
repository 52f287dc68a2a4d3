"""The wire of the engine link: the frames between a front-end process and the engine.

One frame per message, a fixed ``<IB>`` head (body length, kind) as in the worker pipe
(``execution/frames.py``), then a body laid out with ``struct`` — no pickle. The kinds:

``REQUEST`` (front end → engine)
    one ``POST …/infer``: its id on the connection, ``received_at`` (``time.monotonic``,
    one clock for every process on the machine), the model, version, path, client
    address, the request's headers that the engine reads and the body bytes.
``CANCEL`` (front end → engine)
    the client of request ``id`` left: the engine cancels it (no answer follows).
``ANSWER`` (engine → front end)
    request ``id``'s status, headers and payload: what ``fast_infer.answer_infer``
    returned, written by the front end in one write.
``CONNECTIONS`` (front end → engine)
    the front end's :class:`~sordino.records.ConnectionStatistics` (its connection
    guard's), sent when they change, at most once per :data:`CONNECTIONS_EVERY_S`
    (``server/connection_tally.py``).

:class:`FrameReader` takes reads of any size and returns every whole frame they
complete (reads are batched: one read may carry many frames).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterable
from dataclasses import astuple, dataclass

from sordino.records import ConnectionStatistics

__all__ = [
    "ANSWER",
    "CANCEL",
    "CONNECTIONS",
    "CONNECTIONS_EVERY_S",
    "HANDOVER_CHUNK",
    "HANDOVER_HEAD",
    "HELLO",
    "REQUEST",
    "SEND_BODY",
    "Answer",
    "BatchedWrites",
    "FrameError",
    "FrameReader",
    "LinkRequest",
    "decode_answer",
    "decode_connections",
    "decode_id",
    "decode_request",
    "encode_answer",
    "encode_cancel",
    "encode_connections",
    "encode_hello",
    "encode_request",
    "frame_head",
]

_HEAD = struct.Struct("<IB")  # body length, kind
REQUEST, CANCEL, ANSWER, HELLO = 1, 2, 3, 4
CONNECTIONS = 17  # 5-13: link_tensors.py, 14-16: link_arena.py
CONNECTIONS_EVERY_S = 0.25
"""How often a front end looks at its connection figures (and sends them if changed)."""
_CONNECTIONS = struct.Struct("<8Q")  # ConnectionStatistics' fields, in order
SEND_BODY = 0
"""An ``ANSWER`` status that is no answer: send the request's body (``REQUEST``) instead
of its decoded tensors (the engine's result cache for the model keys on the body)."""
_REQUEST_HEAD = struct.Struct("<QdHHHHH")  # id, received_at, lengths: model, version,
# path, client (0xFFFF: none), then the header count
_PAIR = struct.Struct("<HI")  # a header's name and value lengths
_ID = struct.Struct("<Q")
_ANSWER_HEAD = struct.Struct("<QHH")  # id, status, header count
_NONE = 0xFFFF
HANDOVER_HEAD = struct.Struct("<I")
"""A hand-over's first message begins with the total of the bytes already read."""
HANDOVER_CHUNK = 32768
"""Bytes per hand-over message (a seqpacket message must fit the socket's buffer)."""
MAX_FRAME = (1 << 32) - 1
"""Longest body a frame can carry (the head's length is 32 bits)."""


class FrameError(ValueError):
    """Bytes on the link that are not a well-formed frame (a broken peer)."""


@dataclass(slots=True)
class LinkRequest:
    """One inference request as it crosses the link (see the module's docstring)."""

    id: int
    received_at: float
    model: str
    version: str | None
    path: str
    client: str | None
    headers: list[tuple[bytes, bytes]]
    body: bytes


@dataclass(frozen=True, slots=True)
class Answer:
    """Request ``id``'s answer: ``answer_infer``'s status, payload and headers."""

    id: int
    status: int
    payload: bytes
    headers: dict[str, str]


def frame_head(size: int, kind: int) -> bytes:
    """The head of a frame of ``kind`` whose body is ``size`` bytes."""
    return _HEAD.pack(size, kind)


def _text(value: str | None) -> bytes:
    return b"" if value is None else value.encode("utf-8")


def encode_request(request: LinkRequest) -> list[bytes]:
    """The frame of ``request`` as parts to write in order (the body is not copied)."""
    model, version, path = _text(request.model), _text(request.version), _text(request.path)
    client = _text(request.client)
    parts = [
        b"",
        _REQUEST_HEAD.pack(
            request.id,
            request.received_at,
            len(model),
            _NONE if request.version is None else len(version),
            len(path),
            _NONE if request.client is None else len(client),
            len(request.headers),
        ),
        model,
        version,
        path,
        client,
    ]
    for name, value in request.headers:
        parts.append(_PAIR.pack(len(name), len(value)))
        parts.append(name)
        parts.append(value)
    parts.append(request.body)
    size = sum(map(len, parts))
    if size > MAX_FRAME:
        raise FrameError(f"a request of {size} bytes does not fit in one link frame")
    parts[0] = _HEAD.pack(size, REQUEST)
    return parts


def decode_request(body: bytes) -> LinkRequest:
    """The request a ``REQUEST`` frame's body holds; FrameError if it is not one."""
    try:
        ident, received, n_model, n_version, n_path, n_client, count = _REQUEST_HEAD.unpack_from(
            body
        )
        at = _REQUEST_HEAD.size
        model = body[at : at + n_model].decode("utf-8")
        at += n_model
        version: str | None = None
        if n_version != _NONE:
            version = body[at : at + n_version].decode("utf-8")
            at += n_version
        path = body[at : at + n_path].decode("utf-8")
        at += n_path
        client: str | None = None
        if n_client != _NONE:
            client = body[at : at + n_client].decode("utf-8")
            at += n_client
        headers: list[tuple[bytes, bytes]] = []
        for _ in range(count):
            n_name, n_value = _PAIR.unpack_from(body, at)
            at += _PAIR.size
            name = body[at : at + n_name]
            at += n_name
            headers.append((name, body[at : at + n_value]))
            at += n_value
    except (struct.error, UnicodeDecodeError) as exc:
        raise FrameError(f"a malformed request frame: {exc}") from None
    if at > len(body):
        raise FrameError("a request frame shorter than its lengths say")
    return LinkRequest(ident, received, model, version, path, client, headers, body[at:])


def encode_cancel(ident: int) -> bytes:
    """The frame that cancels request ``ident``."""
    return _HEAD.pack(_ID.size, CANCEL) + _ID.pack(ident)


def encode_hello(pid: int) -> bytes:
    """The first frame of a front end's connection: its process id."""
    return _HEAD.pack(_ID.size, HELLO) + _ID.pack(pid)


def decode_id(body: bytes) -> int:
    """The id a ``CANCEL`` or ``HELLO`` frame carries."""
    if len(body) != _ID.size:
        raise FrameError("a malformed id frame")
    return int(_ID.unpack(body)[0])


def encode_connections(stats: ConnectionStatistics) -> bytes:
    """The ``CONNECTIONS`` frame of a front end's connection figures."""
    return _HEAD.pack(_CONNECTIONS.size, CONNECTIONS) + _CONNECTIONS.pack(*astuple(stats))


def decode_connections(body: bytes) -> ConnectionStatistics:
    """The figures a ``CONNECTIONS`` frame's body holds; FrameError if it is not one."""
    if len(body) != _CONNECTIONS.size:
        raise FrameError("a malformed connections frame")
    return ConnectionStatistics(*_CONNECTIONS.unpack(body))


def encode_answer(ident: int, status: int, payload: bytes, headers: dict[str, str]) -> list[bytes]:
    """The frame of request ``ident``'s answer as parts to write in order."""
    parts = [b"", _ANSWER_HEAD.pack(ident, status, len(headers))]
    for name, value in headers.items():
        raw_name, raw_value = name.encode("latin-1"), value.encode("latin-1")
        parts.append(_PAIR.pack(len(raw_name), len(raw_value)))
        parts.append(raw_name)
        parts.append(raw_value)
    parts.append(payload)
    parts[0] = _HEAD.pack(sum(map(len, parts)), ANSWER)
    return parts


def decode_answer(body: bytes) -> Answer:
    """The answer an ``ANSWER`` frame's body holds; FrameError if it is not one."""
    try:
        ident, status, count = _ANSWER_HEAD.unpack_from(body)
        at = _ANSWER_HEAD.size
        headers: dict[str, str] = {}
        for _ in range(count):
            n_name, n_value = _PAIR.unpack_from(body, at)
            at += _PAIR.size
            name = body[at : at + n_name].decode("latin-1")
            at += n_name
            headers[name] = body[at : at + n_value].decode("latin-1")
            at += n_value
    except struct.error as exc:
        raise FrameError(f"a malformed answer frame: {exc}") from None
    if at > len(body):
        raise FrameError("an answer frame shorter than its lengths say")
    return Answer(ident, status, body[at:], headers)


class BatchedWrites:
    """Both ends of the link: the frames written in one loop turn go out in one
    ``writelines`` at its end (fewer syscalls under load); nothing is written to a
    transport that is gone or closing."""

    transport: asyncio.Transport | None
    out: list[bytes]

    def _write(self, parts: list[bytes]) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if not self.out:
            asyncio.get_running_loop().call_soon(self._flush)
        self.out += parts

    def _flush(self) -> None:
        out, self.out = self.out, []
        if self.transport is not None and not self.transport.is_closing():
            # No empty parts: asyncio's selector transport on Python 3.12 and 3.13 keeps
            # an empty part in its buffer for ever (its send of 0 bytes never pops it),
            # so the transport polls to write with nothing to send and never reaches a
            # write_eof's shutdown. (uvloop's transport is not affected.)
            self.transport.writelines([part for part in out if part])


class FrameReader:
    """Whole frames out of reads of any size."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterable[tuple[int, bytes]]:
        """Every ``(kind, body)`` that ``data`` completes, in order."""
        buffer = self._buffer
        if not buffer and len(data) >= _HEAD.size:
            # The common case: whole frames in one read, nothing left over from before.
            size, kind = _HEAD.unpack_from(data)
            if len(data) == _HEAD.size + size:
                return ((kind, data[_HEAD.size :]),)
        buffer += data
        frames: list[tuple[int, bytes]] = []
        at = 0
        end = len(buffer)
        while end - at >= _HEAD.size:
            size, kind = _HEAD.unpack_from(buffer, at)
            if end - at - _HEAD.size < size:
                break
            start = at + _HEAD.size
            frames.append((kind, bytes(buffer[start : start + size])))
            at = start + size
        del buffer[:at]
        return frames
