"""The engine's answers to the gRPC calls its front-end processes forward.

A front end (``server/grpc_frontend.py``) decodes ``ModelInfer`` itself and sends the
request as a ``GRPC_INFER`` frame; every other unary RPC crosses as a ``CALL`` frame
(the method's name, the peer, the call's text metadata, the serialized request). Here
the engine answers both as its own gRPC servicer (``server/grpc.py``) would:

- :func:`answer_grpc_infer` runs the steps the servicer's ``ModelInfer`` runs after its
  decode — the one model lookup, the model's bounds on the declared shapes
  (``fast_infer.check_model_shapes``, the words the metadata-aware decode uses), the
  shared-memory inputs, the service, the shared-memory outputs — inside
  ``service.receiving``, and returns the response (to send back as ``RESULT``) or the
  error's :class:`GrpcStatus`;
- :func:`answer_stream` serves a forwarded ``ModelStreamInfer`` with the servicer's
  own method, held against the per-client stream limit as the engine's server holds
  it, on a :class:`StreamContext` whose ``read`` takes the messages the front end
  forwards and whose ``write`` sends each response back;
- :func:`answer_call` calls the servicer's own method, wrapped as the engine's gRPC
  server wraps it (``grpc_guard.guard``), with a :class:`CallContext` that stands in
  for grpc.aio's and records the status the method ends the call with.

A status travels back in an ``ANSWER`` frame: the gRPC code as the status (0: OK), the
trailing metadata as its headers, the serialized response or the details as payload.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

from sordino.errors import SordinoError
from sordino.inference import InferResponse
from sordino.protocol.status import grpc_code_name, retry_after_header
from sordino.server.fast_infer import Watch, check_model_shapes, serve
from sordino.server.grpc_guard import UNARY_RPCS, details, guard, serialize
from sordino.server.link_tensors import Call, Decoded
from sordino.server.runtime import Runtime
from sordino.server.streams import peer_address

if TYPE_CHECKING:
    from sordino.server.grpc import InferenceServicer

__all__ = [
    "CallContext",
    "GrpcStatus",
    "StreamContext",
    "answer_call",
    "answer_grpc_infer",
    "answer_stream",
    "error_status",
    "internal_status",
]

log = logging.getLogger("sordino.grpc")

_FORWARDED = frozenset(UNARY_RPCS)


@dataclass(slots=True)
class GrpcStatus:
    """How a call ends: its code (0: OK), the payload (the serialized response when OK,
    else the status details as UTF-8) and the trailing metadata."""

    code: int
    payload: bytes
    trailing: dict[str, str] = field(default_factory=dict)


def error_status(exc: Exception) -> GrpcStatus:
    """The status the engine's gRPC server ends a call with for ``exc`` (as ``guard``)."""
    if isinstance(exc, SordinoError):
        code = getattr(grpc.StatusCode, grpc_code_name(exc))
        retry = retry_after_header(exc)
        level = logging.ERROR if code == grpc.StatusCode.INTERNAL else logging.DEBUG
        log.log(level, "%s %s", code.name, exc)
        trailing = {"retry-after": retry} if retry is not None else {}
        return GrpcStatus(code.value[0], details(str(exc)).encode("utf-8"), trailing)
    log.error("gRPC handler failed", exc_info=exc)
    message = details(f"{type(exc).__name__}: {exc}")
    return GrpcStatus(grpc.StatusCode.INTERNAL.value[0], message.encode("utf-8"))


def internal_status(message: str) -> GrpcStatus:
    """INTERNAL with ``message``: a call the engine ended without its answer."""
    return GrpcStatus(grpc.StatusCode.INTERNAL.value[0], details(message).encode("utf-8"))


async def answer_grpc_infer(
    runtime: Runtime, decoded: Decoded, watch: Watch
) -> InferResponse | GrpcStatus:
    """The engine's part of a ``ModelInfer`` a front end decoded (see the module's
    docstring); the caller releases the response."""
    parts = runtime.inference
    request = decoded.request
    try:
        with parts.service.receiving() as arrival:
            arrival.model, arrival.version = request.model, request.version
            route = parts.registry.route(request.model, request.version)
            check_model_shapes(request, route, decoded.size)
            shared = parts.shared_memory.uses(request)
            if shared:
                parts.shared_memory.attach(request, parts.service.tenant_of(request))
        return await serve(parts, request, route, shared, watch)
    except Exception as exc:
        return error_status(exc)


class _Aborted(grpc.aio.AbortError):  # type: ignore[misc]
    """Raised by :meth:`CallContext.abort`, as grpc.aio raises ``AbortError`` (which
    ``guard`` lets through)."""


class CallContext:
    """What the servicer's methods use of grpc.aio's call context, for a forwarded call:
    the caller's metadata and peer; ``abort`` and ``set_trailing_metadata`` record the
    status the method ends the call with."""

    def __init__(self, peer: str, metadata: Sequence[tuple[str, str]]) -> None:
        self._peer = peer
        self._metadata = tuple(metadata)
        self.code = grpc.StatusCode.OK
        self.details = ""
        self.trailing: dict[str, str] = {}

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str]]) -> None:
        self.trailing.update(metadata)

    async def abort(self, code: grpc.StatusCode, details: str = "", *_: Any) -> NoReturn:
        self.code, self.details = code, details
        raise _Aborted


async def answer_call(servicer: InferenceServicer | None, call: Call) -> GrpcStatus:
    """Answer a forwarded unary call as the engine's gRPC server would."""
    if servicer is None or call.method not in _FORWARDED:
        message = f"{call.method}: not served by this server's engine over the link"
        return GrpcStatus(grpc.StatusCode.UNIMPLEMENTED.value[0], message.encode("utf-8"))
    context = CallContext(call.peer, call.metadata)
    try:
        response = await guard(getattr(servicer, call.method))(call.raw, context)
    except _Aborted:
        return GrpcStatus(
            context.code.value[0], context.details.encode("utf-8"), dict(context.trailing)
        )
    payload = serialize(response)
    return GrpcStatus(0, payload, dict(context.trailing))


class StreamContext(CallContext):
    """:class:`CallContext` for a forwarded stream: ``read`` returns the client's next
    message (``grpc.aio.EOF`` once it half-closed), ``write`` sends a response back
    through ``send`` (the message serialized)."""

    def __init__(
        self, peer: str, metadata: Sequence[tuple[str, str]], send: Callable[[bytes], None]
    ) -> None:
        super().__init__(peer, metadata)
        self.inbox: asyncio.Queue[bytes | object] = asyncio.Queue()
        self._send = send

    async def read(self) -> bytes | object:
        return await self.inbox.get()

    async def write(self, message: Any) -> None:
        self._send(serialize(message))


async def answer_stream(servicer: InferenceServicer | None, context: StreamContext) -> GrpcStatus:
    """Serve a forwarded ``ModelStreamInfer`` as the engine's gRPC server does; its end
    status (cancellation propagates: no status is then sent)."""
    if servicer is None:
        return GrpcStatus(
            grpc.StatusCode.UNIMPLEMENTED.value[0],
            b"ModelStreamInfer: not served by this server's engine over the link",
        )
    try:
        with servicer.streams.hold(peer_address(context.peer() or "")):
            await servicer.ModelStreamInfer(context)
    except SordinoError as exc:
        return error_status(exc)
    except _Aborted:
        return GrpcStatus(context.code.value[0], context.details.encode("utf-8"))
    except Exception as exc:
        return error_status(exc)
    return GrpcStatus(0, b"", dict(context.trailing))
