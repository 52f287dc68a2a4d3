"""Decoded requests and their results as engine-link frames (``server/link_frames.py``).

A front end decodes the KServe v2 body itself (``fast_infer.decode_body``) and sends the
engine only what the service reads; the engine sends back only the response's tensors,
and the front end encodes the answer (``fast_infer.encode_response``). Two kinds:

``INFER`` (front end → engine)
    ``<QI>`` (the id on the connection, the facts' length), the facts as one JSON
    object — model, version, request id, parameters, the forwarded header facts, client,
    ``received_at``, the time the body took to read, the requested outputs and their
    options, the input datatypes, the shared-memory inputs, and each tensor's name,
    datatype, shape, byte length and arena offset — then the bytes of the tensors sent
    inline, in that order: fixed-size datatypes little-endian, BYTES in Triton's
    length-prefixed layout. The engine's arrays are zero-copy, read-only views of the
    frame (BYTES: new object arrays). A tensor whose offset is set is not in the frame:
    the front end wrote it into the block of the arena the engine granted it
    (``GRANT``, ``server/link_arena.py``); the engine reads it in place, as arena
    tensors (``memory/grant.py``), and frees the range when the request is done with it.
``RESULT`` (engine → front end)
    ``<QI>``, the facts — model, version, id, response parameters, output datatypes,
    whether to close the connection, each output's name, datatype, shape, byte
    length and arena offset — then the bytes of the outputs sent inline. An output
    whose offset is set is read by the front end in place from the engine's arena
    (the segment named in the facts, ``a``; mapped read-only, ``memory/peer_view.py``);
    the engine keeps the response's hold until the front end's ``RELEASE``, and a
    link that drops releases every hold of that front end. Held blocks are pinned:
    defragmentation and compaction move only blocks whose every holder is parked, and
    a resize waits for every lease to be parked (``Arena.quiet``), which a held
    response never is.

Which tensors go by descriptor (``server/link_arena.py``): tensors larger than
``INLINE_MAX`` (16 KiB): numeric inputs that fit the front end's grant now; outputs in
the arena, C-contiguous, little-endian. The rest go as bytes: small tensors (a copy is
cheaper), ``BYTES`` tensors (serialized, no numpy buffer), inputs when the grant is
full or was never given, outputs not in the arena (thread isolation, another
executor's segment), and every gRPC
``ModelInfer`` (``GRPC_INFER`` and its ``RESULT`` carry bytes). The result cache and
system shared memory never use descriptors: a cached model's body crosses as a
``REQUEST`` and its answer as an ``ANSWER``; shared-memory inputs and outputs are
read and written by the engine in the client's region.

``GRPC_INFER`` (front end → engine)
    an ``INFER`` frame of a gRPC ``ModelInfer`` call (``server/grpc_frontend.py``), with
    ``n``: the message's size, which bounds its declared shapes; errors come back as
    ``ANSWER`` frames whose status is the gRPC code (``server/grpc_link.py``).
``CALL`` (front end → engine)
    any other unary gRPC call: ``<QI>``, the facts — the method's name, the peer, the
    call's text metadata — then the serialized request; answered ``ANSWER`` (the gRPC
    code, 0 for OK; the trailing metadata as headers; the serialized response, or the
    status details).

``STREAM_OPEN``, ``STREAM_MESSAGE``, ``STREAM_END`` (``ModelStreamInfer``)
    a stream opens as a ``CALL`` (no request bytes); then each message the client
    sends, and each the engine answers, is a ``STREAM_MESSAGE`` (``<Q>``: the id, then
    the serialized message) either way; the client's half-close is ``STREAM_END``
    (``<Q>``); the stream's status comes back as an ``ANSWER`` (as a ``CALL``'s).
    Responses are flow-controlled: the engine sends at most ``STREAM_WINDOW`` (16)
    more than the front end has granted; the front end grants one more
    (``STREAM_CREDIT``: ``<QI>``, the id and the count) each time gRPC has taken a
    response from it for the client. Messages too, the other way: the front end
    forwards at most ``STREAM_WINDOW`` the engine has not read, and the engine sends a
    ``STREAM_CREDIT`` for each its servicer reads.

``REFUSED`` (front end → engine)
    requests the front end answered with an error itself (a malformed body, one too
    large, a client gone while sending it, a refusal from the engine's load board):
    their model, version, tenant header, reason and how many, counted by the engine as
    its own early refusals are counted (no answer follows).

JSON (orjson) carries only what came from JSON on the wire; nothing is pickled. Errors
go back as ``ANSWER`` frames (status, ``{"error": …}`` body, headers).
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from sordino.datatypes import serialize_bytes_tensor, tensor_from_binary
from sordino.errors import SordinoError
from sordino.inference import InferRequest, InferResponse, RequestedOutput, SharedInput, Tensor
from sordino.memory.refs import TensorRef, Tensors
from sordino.protocol.encode import output_datatype
from sordino.server.link_arena import INLINE_MAX, Unreadable, arena_base, in_place
from sordino.server.link_frames import MAX_FRAME, FrameError, frame_head

if TYPE_CHECKING:
    from sordino.memory.arena import Arena
    from sordino.memory.grant import Grant, GrantSpace
    from sordino.memory.peer_view import ArenaView

__all__ = [
    "CALL",
    "GRPC_INFER",
    "GRPC_KINDS",
    "INFER",
    "REFUSED",
    "RESULT",
    "STREAM_CREDIT",
    "STREAM_END",
    "STREAM_MESSAGE",
    "STREAM_OPEN",
    "STREAM_WINDOW",
    "Call",
    "Decoded",
    "decode_call",
    "decode_infer",
    "decode_refused",
    "decode_result",
    "decode_stream_credit",
    "decode_stream_message",
    "encode_call",
    "encode_infer",
    "encode_refused",
    "encode_result",
    "encode_result_held",
    "encode_stream_credit",
    "encode_stream_end",
    "encode_stream_message",
]

INFER, RESULT, REFUSED, GRPC_INFER, CALL = 5, 6, 7, 8, 9
STREAM_OPEN, STREAM_MESSAGE, STREAM_END, STREAM_CREDIT = 10, 11, 12, 13
GRPC_KINDS = frozenset((GRPC_INFER, CALL, STREAM_OPEN, STREAM_MESSAGE, STREAM_END, STREAM_CREDIT))
"""The frames a front end sends for the gRPC calls it forwards (``server/grpc_link.py``)."""
STREAM_WINDOW = 16
"""How many responses of a forwarded stream the engine may send beyond those the front
end has handed to gRPC for its client: the credit a stream opens with; each
``STREAM_CREDIT`` adds to it. A client that reads slowly thus holds at most this many
responses in its front end's memory, and the engine's servicer waits (in its
``context.write``) as it would for a slow client of its own. The same bounds the
client's messages the front end forwards beyond those the engine has read."""
_CREDIT = struct.Struct("<QI")  # a stream's id, the responses granted
_STREAM_HEAD = struct.Struct("<Q")  # a stream message's id
_FACTS = struct.Struct("<QI")  # id, the facts' length
_NATIVE_LITTLE = sys.byteorder == "little"


class Decoded:
    """A decoded request as the engine rebuilt it: its id on the link, the request, the
    seconds its body took to read and the frame's size (bounds what shapes may declare)."""

    __slots__ = ("id", "read_s", "request", "size")

    def __init__(self, ident: int, request: InferRequest, read_s: float, size: int) -> None:
        self.id, self.request, self.read_s, self.size = ident, request, read_s, size


def _raw(datatype: str, array: Tensor) -> bytes | memoryview:
    if datatype == "BYTES":
        return serialize_bytes_tensor(array)
    little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return little.reshape(-1).view(np.uint8).data


def _tensors(
    entries: list[Any], body: bytes, at: int, grant: Grant | None = None
) -> tuple[Mapping[str, Tensor], int]:
    arrays: dict[str, Tensor] = {}
    view = memoryview(body)
    placed: dict[str, int] = {}
    for name, datatype, shape, size, offset in entries:
        if offset is None:
            data = view[at : at + size]
            at += size
        elif grant is None:
            raise ValueError("an arena descriptor from a front end that was granted nothing")
        else:
            placed[name] = offset
            data = grant.buffer[offset : offset + size]
        arrays[name] = tensor_from_binary(name, datatype, tuple(shape), data)
    if placed:
        assert grant is not None
        lease = grant.lease([(o, arrays[n].nbytes) for n, o in placed.items()])
        refs = {n: TensorRef(a, placed.get(n)) for n, a in arrays.items()}
        return Tensors(refs, (lease,)), at
    return arrays, at


def _frame(
    kind: int, ident: int, facts: dict[str, Any], chunks: list[bytes | memoryview]
) -> list[Any]:
    head = orjson.dumps(facts)
    size = _FACTS.size + len(head) + sum(len(c) for c in chunks)
    if size > MAX_FRAME:
        raise FrameError(f"a message of {size} bytes does not fit in one link frame")
    return [frame_head(size, kind), _FACTS.pack(ident, len(head)), head, *chunks]


def encode_infer(
    ident: int,
    request: InferRequest,
    read_s: float,
    *,
    kind: int = INFER,
    room: int | None = None,
    space: GrantSpace | None = None,
) -> tuple[list[Any], list[int]]:
    """The ``INFER`` (or ``GRPC_INFER``) frame of ``request`` as parts to write in order,
    and the offsets of the inputs it laid into ``space`` (the front end's grant; None:
    every input inline); ``room``: the bytes the declared shapes are bounded by (None:
    the frame's, counting the inputs laid into ``space``).

    Raises SordinoError (TensorError) for a tensor that cannot be serialized and
    FrameError for one too large; nothing stays in ``space`` then.
    """
    entries: list[Any] = []
    chunks: list[bytes | memoryview] = []
    placed: list[int] = []
    try:
        for name, array in request.inputs.items():
            datatype = request.input_datatypes[name]
            if space is not None and datatype != "BYTES" and array.nbytes > INLINE_MAX:
                offset = space.put(array)
                if offset is not None:
                    placed.append(offset)
                    entries.append((name, datatype, array.shape, array.nbytes, offset))
                    continue
            chunk = _raw(datatype, array)
            entries.append((name, datatype, array.shape, len(chunk), None))
            chunks.append(chunk)
        outputs = request.outputs
        facts = {
            "m": request.model,
            "v": request.version,
            "i": request.id,
            "p": request.parameters,
            "h": request.headers,
            "c": request.client,
            "t": request.received_at,
            "r": read_s,
            "o": None if outputs is None else [(o.name, o.binary, o.parameters) for o in outputs],
            "d": request.input_datatypes,
            "s": [
                (s.name, s.datatype, s.shape, s.region, s.byte_size, s.offset)
                for s in request.shared_inputs
            ],
            "x": entries,
        }
        if room is not None:
            facts["n"] = room
        elif placed:  # as if the placed tensors were in the frame
            facts["n"] = _FACTS.size + len(orjson.dumps(facts)) + sum(e[3] for e in entries)
        return _frame(kind, ident, facts, chunks), placed
    except BaseException:
        if space is not None:
            for offset in placed:
                space.free(offset)
        raise


def _facts(body: bytes) -> tuple[int, dict[str, Any], int]:
    try:
        ident, length = _FACTS.unpack_from(body)
        at = _FACTS.size + length
        facts = orjson.loads(memoryview(body)[_FACTS.size : at])
    except (struct.error, orjson.JSONDecodeError) as exc:
        raise FrameError(f"a malformed frame: {exc}") from None
    if not isinstance(facts, dict):
        raise FrameError("a frame whose facts are not an object")
    return ident, facts, at


def decode_infer(body: bytes, grant: Grant | None = None) -> Decoded:
    """The request an ``INFER`` frame's body holds; FrameError if it is not one.

    Inputs the front end laid into ``grant`` are arena tensors, read in place (a
    :class:`~sordino.memory.refs.Tensors` holding a lease of the grant: whoever
    releases the request frees them).
    """
    ident, facts, at = _facts(body)
    inputs: Mapping[str, Tensor] | None = None
    try:
        inputs, end = _tensors(facts["x"], body, at, grant)
        outputs = facts["o"]
        request = InferRequest(
            model=facts["m"],
            inputs=inputs,
            version=facts["v"],
            id=facts["i"],
            outputs=None if outputs is None else [RequestedOutput(n, b, p) for n, b, p in outputs],
            parameters=facts["p"],
            input_datatypes=facts["d"],
            headers=facts["h"],
            shared_inputs=[SharedInput(n, d, tuple(s), r, b, o) for n, d, s, r, b, o in facts["s"]],
            received_at=facts["t"],
            client=facts["c"],
        )
        read_s = float(facts["r"])
        room = int(facts.get("n", len(body)))
        if end != len(body):
            raise ValueError("its tensors do not fill it")
    except (KeyError, TypeError, ValueError, SordinoError) as exc:
        if isinstance(inputs, Tensors):
            inputs.release()
        raise FrameError(f"a malformed request frame: {exc}") from None
    return Decoded(ident, request, read_s, room)


def encode_result(ident: int, response: InferResponse, close: bool) -> list[Any]:
    """The ``RESULT`` frame of ``response``, every output inline, as parts to write in
    order; they hold no reference to the response's arrays (it may be released at once).

    Raises InferenceFailed for an output whose dtype contradicts the model's datatype
    (as the encoder would) and TensorError for a BYTES output it cannot serialize.
    """
    return encode_result_held(ident, response, close, None)[0]


def encode_result_held(
    ident: int, response: InferResponse, close: bool, arena: Arena | None
) -> tuple[list[Any], bool]:
    """The ``RESULT`` frame of ``response`` with its outputs in ``arena`` as descriptors,
    and whether any went so (see the module's docstring for which do not).

    When it says True the frame names the response's arena blocks: the caller keeps
    the response unreleased until the front end's ``RELEASE`` (or the link's end).
    When False the parts hold no reference to the response's arrays. Raises as
    :func:`encode_result`.
    """
    entries: list[Any] = []
    chunks: list[bytes | memoryview] = []
    base = arena_base(arena) if arena is not None else None
    outputs = response.outputs
    placed = outputs if base is not None and isinstance(outputs, Tensors) else None
    held = False
    for name, array in outputs.items():
        datatype = output_datatype(response, name, array)
        offset = placed.ref(name).offset if placed is not None else None
        if datatype != "BYTES" and in_place(array, offset, base):
            entries.append((name, datatype, array.shape, array.nbytes, offset))
            held = True
            continue
        chunk: bytes | memoryview
        if datatype != "BYTES" and _NATIVE_LITTLE and array.dtype.byteorder in "=|":
            chunk = array.tobytes()  # the copy, in C order
        else:
            chunk = _raw(datatype, array)
        entries.append((name, datatype, array.shape, len(chunk), None))
        chunks.append(chunk)
    # One copy: the outputs' blocks go back to the arena before the frame is written.
    if len(chunks) != 1 or not isinstance(chunks[0], bytes):
        chunks = [b"".join(chunks)]
    facts = {
        "m": response.model,
        "v": response.version,
        "i": response.id,
        "p": response.parameters,
        "d": response.output_datatypes,
        "k": close,
        "x": entries,
    }
    if held:
        assert arena is not None
        facts["a"] = arena.name
    return _frame(RESULT, ident, facts, chunks), held


def decode_result(
    body: bytes, arena: ArenaView | None = None
) -> tuple[int, InferResponse, bool, bool]:
    """The id, response and close flag a ``RESULT`` frame's body holds, and whether the
    engine holds its outputs (then read in place through ``arena``, and released with
    ``RELEASE`` once encoded: the arrays must not be used after).

    Raises FrameError for a malformed frame, OSError when the arena cannot be mapped.
    """
    ident, facts, at = _facts(body)
    view = memoryview(body)
    segment = facts.get("a")
    try:
        outputs: dict[str, Tensor] = {}
        for name, datatype, shape, size, offset in facts["x"]:
            if offset is None:
                data = view[at : at + size]
                at += size
            elif arena is None or not isinstance(segment, str):
                raise ValueError("an arena descriptor this end cannot read")
            else:
                try:
                    data = arena.bytes_at(segment, offset, size)
                except OSError as exc:
                    raise Unreadable(ident, f"{segment}: {exc}") from None
            outputs[name] = tensor_from_binary(name, datatype, tuple(shape), data)
        response = InferResponse(
            model=facts["m"],
            version=facts["v"],
            outputs=outputs,
            output_datatypes=facts["d"],
            id=facts["i"],
            parameters=facts["p"],
        )
        close = bool(facts["k"])
    except (KeyError, TypeError, ValueError, SordinoError) as exc:
        raise FrameError(f"a malformed result frame: {exc}") from None
    if at != len(body):
        raise FrameError("a result frame whose tensors do not fill it")
    return ident, response, close, segment is not None


def encode_refused(
    model: str, version: str | None, tenant: str | None, reason: str, count: int = 1
) -> bytes:
    """The ``REFUSED`` frame of ``count`` requests a front end answered with an error itself."""
    body = orjson.dumps([model, version, tenant, reason, count])
    return frame_head(len(body), REFUSED) + body


def decode_refused(body: bytes) -> tuple[str, str | None, str | None, str, int]:
    """The model, version, tenant, reason and count a ``REFUSED`` frame's body holds."""
    try:
        model, version, tenant, reason, count = orjson.loads(body)
    except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
        raise FrameError(f"a malformed refusal frame: {exc}") from None
    if not (
        isinstance(model, str)
        and isinstance(reason, str)
        and isinstance(version, str | None)
        and isinstance(tenant, str | None)
        and type(count) is int
        and count >= 1
    ):
        raise FrameError("a malformed refusal frame")
    return model, version, tenant, reason, count


class Call:
    """A unary gRPC call a front end forwards: its id on the link, the method's name,
    the peer string, the call's text metadata and the serialized request."""

    __slots__ = ("id", "metadata", "method", "peer", "raw")

    def __init__(
        self, ident: int, method: str, peer: str, metadata: list[tuple[str, str]], raw: bytes
    ) -> None:
        self.id, self.method, self.peer, self.metadata, self.raw = (
            ident,
            method,
            peer,
            metadata,
            raw,
        )


def encode_call(call: Call, kind: int = CALL) -> list[Any]:
    """The ``CALL`` (or ``STREAM_OPEN``) frame of ``call`` as parts to write in order."""
    facts = {"m": call.method, "p": call.peer, "h": call.metadata}
    return _frame(kind, call.id, facts, [call.raw])


def encode_stream_message(ident: int, raw: bytes) -> list[bytes]:
    """The ``STREAM_MESSAGE`` frame of stream ``ident``'s serialized message ``raw``."""
    if _STREAM_HEAD.size + len(raw) > MAX_FRAME:
        raise FrameError(f"a stream message of {len(raw)} bytes does not fit in one link frame")
    return [frame_head(_STREAM_HEAD.size + len(raw), STREAM_MESSAGE), _STREAM_HEAD.pack(ident), raw]


def decode_stream_message(body: bytes) -> tuple[int, bytes]:
    """The stream id and serialized message a ``STREAM_MESSAGE`` frame's body holds."""
    if len(body) < _STREAM_HEAD.size:
        raise FrameError("a malformed stream message frame")
    return int(_STREAM_HEAD.unpack_from(body)[0]), body[_STREAM_HEAD.size :]


def encode_stream_end(ident: int) -> bytes:
    """The ``STREAM_END`` frame: the client of stream ``ident`` sends no more."""
    return frame_head(_STREAM_HEAD.size, STREAM_END) + _STREAM_HEAD.pack(ident)


def encode_stream_credit(ident: int, count: int) -> bytes:
    """The ``STREAM_CREDIT`` frame: the engine may send ``count`` more responses."""
    return frame_head(_CREDIT.size, STREAM_CREDIT) + _CREDIT.pack(ident, count)


def decode_stream_credit(body: bytes) -> tuple[int, int]:
    """The stream id and count a ``STREAM_CREDIT`` frame's body holds."""
    if len(body) != _CREDIT.size:
        raise FrameError("a broken stream credit frame")
    ident, count = _CREDIT.unpack(body)
    return int(ident), int(count)


def decode_call(body: bytes) -> Call:
    """The call a ``CALL`` frame's body holds; FrameError if it is not one."""
    ident, facts, at = _facts(body)
    try:
        method, peer = facts["m"], facts["p"]
        metadata = [(str(key), str(value)) for key, value in facts["h"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise FrameError(f"a malformed call frame: {exc}") from None
    if not isinstance(method, str) or not isinstance(peer, str):
        raise FrameError("a malformed call frame")
    return Call(ident, method, peer, metadata, body[at:])
