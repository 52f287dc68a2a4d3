"""gRPC in a front-end process (``server.frontends`` > 1).

Every front end serves the server's gRPC port (``grpc.so_reuseport``; the engine only
holds the port and serves none of it), so the kernel spreads new HTTP/2 connections
over the front ends, and the one that accepted a connection answers every call on
it:

- ``ModelInfer`` is decoded here (``protocol/grpc_codec.py``, without the model's
  metadata: declared shapes are bounded by the message's size) and crosses the engine
  link as a ``GRPC_INFER`` frame — only the request's facts and tensors; the response's
  tensors come back (``RESULT``) and are encoded here as the engine's servicer encodes
  them, or the call ends with the status the engine's servicer would give (``ANSWER``).
  A call the client cancels is cancelled in the engine (``CANCEL``). A message this
  decode refuses is forwarded as it is (below), so that its error — and which error
  wins, an unknown model over a malformed message — is the engine's own.
- every other unary RPC (metadata, health, statistics, repository control, shared
  memory) is forwarded: its method's name, peer, text metadata and serialized request
  cross as a ``CALL`` frame and the engine's own servicer answers it
  (``server/grpc_link.py``); Triton's RPCs sordino does not implement are answered
  here as the engine answers them.
- ``ModelStreamInfer`` is forwarded message by message: the stream opens in the engine
  (``STREAM_OPEN``), each message the client sends crosses as it arrives
  (``STREAM_MESSAGE``), and so does each response the engine's servicer writes; the
  client's half-close is ``STREAM_END``, a cancel ``CANCEL``, and the stream ends with
  the engine's status (``ANSWER``). Each response gRPC takes for the client grants the
  engine one more (``STREAM_CREDIT``): at most ``link_tensors.STREAM_WINDOW`` wait
  here for a client that reads slowly. The other way the same: each message the
  engine's servicer reads grants the front end one more, so at most that many of a
  client's messages wait in the engine unread.

A decoded ``ModelInfer`` is first put to the engine's load board when the front end
has one (``server/board_shed.py``): the rule the HTTP front end applies to headers is
applied to the message's ``priority``, ``tag`` and ``timeout`` parameters, and a request
the engine would shed ends here with the engine's own status (UNAVAILABLE, its message
and ``retry-after``) without crossing the link; the refusal is counted in the engine's
metrics as the HTTP ones are.

When the engine is gone a call gets UNAVAILABLE with ``frontend_link.ENGINE_GONE``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import grpc

from sordino.errors import Shed, SordinoError
from sordino.inference import InferRequest
from sordino.protocol.grpc_codec import decode_infer_request, encode_infer_response, parse_message
from sordino.protocol.pb import kserve_v2_pb2 as pb
from sordino.server.early_shed import HeaderShed
from sordino.server.frontend_link import ENGINE_GONE, FrontendLink, Reply
from sordino.server.grpc import SERVICE, UNSUPPORTED_RPCS, Caller
from sordino.server.grpc_accept import open_server
from sordino.server.grpc_guard import (
    UNARY_RPCS,
    Unary,
    abort_with,
    guard,
    serialize,
    unsupported,
)
from sordino.server.link_frames import Answer

__all__ = ["board_refusal", "frontend_handler", "open_frontend_grpc"]

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _identity(data: bytes) -> bytes:
    return data


async def _end(context: Any, answer: Answer) -> NoReturn:
    """End the call with the status the engine sent (UNAVAILABLE when it is gone)."""
    code = _CODES.get(answer.status)
    if code is None or code == grpc.StatusCode.OK:
        await context.abort(grpc.StatusCode.UNAVAILABLE, ENGINE_GONE)
    if answer.headers:
        context.set_trailing_metadata(tuple(answer.headers.items()))
    await context.abort(code, answer.payload.decode("utf-8", "replace"))
    raise AssertionError("abort returned")  # pragma: no cover - abort always raises


async def _reply(link: FrontendLink, ident: int, future: asyncio.Future[Reply]) -> Reply:
    """The engine's reply; a cancelled call is cancelled in the engine too."""
    try:
        return await future
    except asyncio.CancelledError:
        link.cancel(ident)
        raise


def _forwarder(link: FrontendLink, method: str) -> Callable[[bytes, Any], Awaitable[bytes]]:
    async def forward(raw: bytes, context: Any) -> bytes:
        ident, future = link.call_unary(method, context.peer() or "", _metadata(context), raw)
        reply = await _reply(link, ident, future)
        if not isinstance(reply, Answer) or reply.status != 0:
            await _end(context, reply if isinstance(reply, Answer) else Answer(ident, 500, b"", {}))
        if reply.headers:
            context.set_trailing_metadata(tuple(reply.headers.items()))
        return reply.payload

    return forward


_PARAMETER_HEADERS = (
    ("priority", b"x-sordino-priority"),
    ("tag", b"x-sordino-tag"),
    ("timeout", b"x-sordino-timeout"),
)


def board_refusal(shed: HeaderShed, request: InferRequest) -> Shed | None:
    """The refusal the board gives ``request`` (a decoded ``ModelInfer``), or None.

    The message's ``priority``, ``tag`` and ``timeout`` parameters are what admission
    reads for a gRPC request, so they are put to the header rule as the headers that
    carry them over HTTP; the whole message is known here, so a stated priority counts
    as stated. A value the rule cannot take as it is (a bool, a float, a name outside
    ASCII) is not refused here: the engine says what is wrong with it.
    """
    try:
        model = request.model.encode("ascii")
        version = request.version.encode("ascii") if request.version else None
    except UnicodeEncodeError:
        return None
    target = (
        b"/v2/models/%s/infer" % model
        if version is None
        else b"/v2/models/%s/versions/%s/infer" % (model, version)
    )
    headers: list[tuple[bytes, bytes]] = []
    parameters = request.parameters
    for name, header in _PARAMETER_HEADERS:
        value = parameters.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | str):
            return None
        try:
            headers.append((header, str(value).encode("ascii")))
        except UnicodeEncodeError:
            return None
    tenant = request.headers.get("x-sordino-tenant")
    if tenant:
        try:
            headers.append((b"x-sordino-tenant", tenant.encode("latin-1")))
        except UnicodeEncodeError:
            return None
    refused = shed.refusal_of(target, headers)
    return None if refused is None else refused[0]


def _model_infer(link: FrontendLink, shed: HeaderShed | None) -> Unary:
    forward = _forwarder(link, "ModelInfer")

    async def model_infer(raw: bytes, context: Any) -> bytes:
        try:
            message = parse_message(pb.ModelInferRequest, raw)
            request = decode_infer_request(message)
        except SordinoError:
            # The engine's servicer answers it, in its own words and order.
            return await forward(raw, context)
        Caller.of(context).stamp(request)
        if shed is not None:
            refused = board_refusal(shed, request)
            if refused is not None:
                await abort_with(context, refused)
        await link.writable()
        try:
            ident, future = link.call_grpc(request, message.ByteSize())
        except SordinoError:
            return await forward(raw, context)
        reply = await _reply(link, ident, future)
        if isinstance(reply, Answer):
            await _end(context, reply)
        response, _ = reply
        return serialize(encode_infer_response(response, request))

    return model_infer


def _stream(link: FrontendLink) -> Callable[[Any, Any], Awaitable[None]]:
    async def stream(requests: Any, context: Any) -> None:
        """Forward the client's messages as they come; write the engine's responses as
        they come; end as the engine's stream ended."""
        ident, inbox = link.open_stream(context.peer() or "", _metadata(context))

        async def pump() -> None:
            async for raw in requests:
                # A client that sends faster than the engine reads waits here, its
                # messages unread by gRPC (HTTP/2 flow control), not in this memory
                # (the link's writes) nor in the engine's (the stream's window).
                await link.writable()
                await link.stream_room(ident)
                link.stream_message(ident, raw)
            link.stream_end(ident)

        pumping = asyncio.get_running_loop().create_task(pump())
        try:
            while True:
                item = await inbox.get()
                if isinstance(item, Answer):
                    if item.status != 0:
                        await _end(context, item)
                    if item.headers:
                        context.set_trailing_metadata(tuple(item.headers.items()))
                    return
                await context.write(item)
                link.stream_credit(ident)  # gRPC took it: the engine may send one more
        except asyncio.CancelledError:
            link.cancel_stream(ident)
            raise
        finally:
            pumping.cancel()

    return stream


def _metadata(context: Any) -> list[tuple[str, str]]:
    return [
        (str(key), value)
        for key, value in context.invocation_metadata() or ()
        if isinstance(value, str)
    ]


def frontend_handler(link: FrontendLink, shed: HeaderShed | None = None) -> Any:
    """The generic handler of ``inference.GRPCInferenceService`` in a front end;
    ``shed``: the engine's load board's rule (None: nothing is refused here)."""
    handlers: dict[str, Any] = {
        name: grpc.unary_unary_rpc_method_handler(
            guard(_forwarder(link, name)), response_serializer=_identity
        )
        for name in UNARY_RPCS
        if name != "ModelInfer"
    }
    # guard: an error here (an answer that cannot be encoded) ends the call as the
    # engine's own server would end it.
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        guard(_model_infer(link, shed)), response_serializer=_identity
    )

    handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        _stream(link), response_serializer=_identity
    )
    for name, message in UNSUPPORTED_RPCS.items():
        handlers[name] = grpc.unary_unary_rpc_method_handler(unsupported(name, message))
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


async def open_frontend_grpc(
    link: FrontendLink,
    host: str,
    port: int,
    options: dict[str, int],
    shed: HeaderShed | None = None,
) -> Any:
    """Bind ``host:port`` beside the other front ends (``SO_REUSEPORT``; the engine holds
    the port without listening) and start serving.

    ``options``: ``max_receive`` (bytes), ``handshake_ms``, ``accept_ahead``,
    ``max_connections``; ``shed``
    as :func:`frontend_handler` takes it. Raises OSError if the port cannot be bound.
    """
    server = open_server(
        [
            ("grpc.max_receive_message_length", options.get("max_receive", 4 << 20)),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 1),
            ("grpc.server_handshake_timeout_ms", options.get("handshake_ms", 10_000)),
            *(
                [("grpc.max_allowed_incoming_connections", options["max_connections"])]
                if "max_connections" in options
                else []
            ),
        ],
        options.get("accept_ahead", 1),
    )
    server.add_generic_rpc_handlers((frontend_handler(link, shed),))
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise OSError(f"a front end cannot listen for gRPC on {address}") from exc
    if not bound:
        raise OSError(f"a front end cannot listen for gRPC on {address}")
    await server.start()
    return server
