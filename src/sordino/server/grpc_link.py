"""The engine's answers to the gRPC calls its front-end processes forward.

A front end (``server/grpc_frontend.py``) decodes ``ModelInfer`` itself and sends the
request as a ``GRPC_INFER`` frame; every other unary RPC crosses as a ``CALL`` frame
(the method's name, the peer, the call's text metadata, the serialized request). Here
the engine answers both as its own gRPC servicer (``server/grpc.py``) would:

- :func:`begin_grpc_infer` runs the checks the servicer's ``ModelInfer`` runs after its
  decode — the one model lookup, the model's bounds on the declared shapes
  (``decoded_infer.check_model_shapes``, the words the metadata-aware decode uses), the
  shared-memory inputs — inside ``service.receiving``; :func:`answer_grpc_infer` then
  the service and the shared-memory outputs, and returns the response (to send back
  as ``RESULT``) or the error's :class:`GrpcStatus`;
- :func:`answer_stream` serves a forwarded ``ModelStreamInfer`` with the servicer's
  own method, held against the per-client stream limit as the engine's server holds
  it, on a :class:`StreamContext` whose ``read`` takes the messages the front end
  forwards and whose ``write`` sends each response back;
- :func:`answer_call` calls the servicer's own method, wrapped as the engine's gRPC
  server wraps it (``grpc_guard.guard``), with a :class:`CallContext` that stands in
  for grpc.aio's and records the status the method ends the call with.

:class:`GrpcCalls` is the engine link's gRPC side: it starts each call's task on the
frames above (``server/engine_link.py`` hands them over), keeps the open streams, and
writes each answer back. A ``ModelInfer`` is checked and queued as its frame is read
and answered by callback (``InferenceService.infer_soon``: no task, no coroutine
chain), as the link's HTTP requests are; it takes a task only where the service must
wait (a generation, a sequence, a quota that may wait) or writes shared-memory outputs.
A forwarded stream's responses are flow-controlled: the engine
sends at most ``link_tensors.STREAM_WINDOW`` responses beyond the front end's credit
(:attr:`StreamContext.granted`), so a slow client holds the servicer back, not memory.

A status travels back in an ``ANSWER`` frame: the gRPC code as the status (0: OK), the
trailing metadata as its headers, the serialized response or the details as payload.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

import grpc

from sordino.errors import SordinoError
from sordino.inference import InferResponse
from sordino.protocol.status import grpc_code_name, retry_after_header
from sordino.server import link_frames, link_tensors
from sordino.server.decoded_infer import check_model_shapes
from sordino.server.fast_infer import Watch, serve
from sordino.server.grpc_guard import UNARY_RPCS, details, guard, serialize
from sordino.server.link_frames import FrameError
from sordino.server.link_pending import Forwarded, Pending, watch
from sordino.server.link_tensors import STREAM_WINDOW, Call, Decoded
from sordino.server.route import Route
from sordino.server.runtime import Runtime
from sordino.server.stream_window import StreamWindow
from sordino.server.streams import peer_address

if TYPE_CHECKING:
    from sordino.server.grpc import InferenceServicer

__all__ = [
    "CallContext",
    "GrpcCalls",
    "GrpcStatus",
    "StreamContext",
    "answer_call",
    "answer_grpc_infer",
    "answer_stream",
    "begin_grpc_infer",
    "error_status",
    "internal_status",
    "unhandled_status",
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


def begin_grpc_infer(runtime: Runtime, decoded: Decoded) -> tuple[Route, bool] | GrpcStatus:
    """The engine's checks of a ``ModelInfer`` a front end decoded, before the service
    (see the module's docstring): its route and whether it uses system shared memory,
    or the error's status (counted). Never waits."""
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
    except Exception as exc:
        return error_status(exc)
    return route, shared


async def answer_grpc_infer(
    runtime: Runtime, decoded: Decoded, watch: Watch
) -> InferResponse | GrpcStatus:
    """The engine's part of a ``ModelInfer`` a front end decoded (see the module's
    docstring); the caller releases the response."""
    begun = begin_grpc_infer(runtime, decoded)
    if isinstance(begun, GrpcStatus):
        return begun
    return await _serve_grpc(runtime, decoded, *begun, watch)


async def _serve_grpc(
    runtime: Runtime, decoded: Decoded, route: Route, shared: bool, watch: Watch
) -> InferResponse | GrpcStatus:
    try:
        return await serve(runtime.inference, decoded.request, route, shared, watch)
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
    through ``send`` (the message serialized) once the front end's credit allows it.

    :attr:`sent` counts the responses sent, :attr:`granted` the credit so far
    (``STREAM_WINDOW`` at open, plus each ``STREAM_CREDIT``): ``sent <= granted``
    always, and ``write`` waits while they are equal (:attr:`starved`). Each message
    ``read`` takes calls ``took``, which grants the front end one more message.
    """

    def __init__(
        self,
        peer: str,
        metadata: Sequence[tuple[str, str]],
        send: Callable[[bytes], None],
        took: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(peer, metadata)
        self.inbox: asyncio.Queue[bytes | object] = asyncio.Queue()
        self._send = send
        self._took = took
        self.sent = 0
        self.granted = STREAM_WINDOW
        self._room = StreamWindow(STREAM_WINDOW)

    @property
    def starved(self) -> bool:
        """Every response the credit allows has been sent: the next ``write`` waits."""
        return self._room.left <= 0  # sent == granted

    def grant(self, count: int) -> None:
        """The front end handed ``count`` more responses to gRPC: send as many more."""
        self.granted += count
        self._room.grant(count)

    async def read(self) -> bytes | object:
        """The client's next message; the front end may then forward one more."""
        item = await self.inbox.get()
        if isinstance(item, bytes):
            self._took()
        return item

    async def write(self, message: Any) -> None:
        await self._room.take()  # a cancel (the front end's client left) ends the wait
        self.sent += 1
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
        return unhandled_status(exc)
    return GrpcStatus(0, b"", dict(context.trailing))


def unhandled_status(exc: Exception) -> GrpcStatus:
    """What grpc.aio ends a call with when its handler raises ``exc`` (not an abort):
    UNKNOWN, ``Unexpected <class '…'>: …`` — as the engine's own ``ModelStreamInfer``,
    which no ``guard`` wraps, ends."""
    log.error("gRPC stream handler failed", exc_info=exc)
    message = details(f"Unexpected {type(exc)}: {exc}")
    return GrpcStatus(grpc.StatusCode.UNKNOWN.value[0], message.encode("utf-8"))


def grpc_aio_eof() -> object:
    """grpc.aio's end-of-stream marker (what ``context.read()`` returns at a half-close)."""
    eof: object = grpc.aio.EOF
    return eof


class _Identified(Protocol):
    @property
    def id(self) -> int: ...


ItemT = TypeVar("ItemT", bound=_Identified)


class GrpcCalls:
    """The gRPC calls one front end's link connection carries, on the engine.

    ``pending`` is the connection's table of work by frame id (shared with its HTTP
    requests: a ``CANCEL`` or the link's loss cancels through it); ``write`` queues
    frames on the connection. :meth:`received` takes each ``link_tensors.GRPC_KINDS``
    frame; :attr:`streams` holds the forwarded streams open now.
    """

    def __init__(
        self,
        runtime: Runtime,
        servicer: InferenceServicer | None,
        pending: dict[int, Pending],
        write: Callable[[list[bytes]], None],
    ) -> None:
        self.runtime = runtime
        self.servicer = servicer
        self.pending = pending
        self._write = write
        self.streams: dict[int, StreamContext] = {}

    def received(self, kind: int, body: bytes) -> None:
        """Act on one frame (FrameError for a broken one)."""
        if kind == link_tensors.GRPC_INFER:
            self._infer_frame(link_tensors.decode_infer(body))
        elif kind == link_tensors.CALL:
            self._begin(link_tensors.decode_call(body), self._call)
        elif kind == link_tensors.STREAM_OPEN:
            self._open(link_tensors.decode_call(body))
        elif kind == link_tensors.STREAM_MESSAGE:
            self._to_stream(*link_tensors.decode_stream_message(body))
        elif kind == link_tensors.STREAM_END:
            self._to_stream(link_frames.decode_id(body), grpc_aio_eof())
        elif kind == link_tensors.STREAM_CREDIT:
            ident, count = link_tensors.decode_stream_credit(body)
            context = self.streams.get(ident)
            if context is not None:
                context.grant(count)
        else:
            raise FrameError(f"not a gRPC frame kind: {kind}")

    def _begin(
        self, item: ItemT, work: Callable[[ItemT, Pending], Coroutine[Any, Any, None]]
    ) -> None:
        pending = Pending()
        self.pending[item.id] = pending
        pending.task = asyncio.get_running_loop().create_task(work(item, pending))

    def _infer_frame(self, decoded: Decoded) -> None:
        """A ``ModelInfer`` a front end decoded: checked and queued now, answered by
        callback (:meth:`_done`), or by a task where the service must wait."""
        ident = decoded.id
        begun = begin_grpc_infer(self.runtime, decoded)
        if isinstance(begun, GrpcStatus):
            self._status(ident, begun)
            return
        route, shared = begun
        if not shared:  # shared-memory outputs are written in the task
            request = decoded.request
            pending = Forwarded(request.inputs)
            try:
                pending.soon = self.runtime.inference.service.infer_soon(
                    request, route, partial(self._done, ident)
                )
            except Exception as exc:  # refused (counted by the service)
                self._status(ident, error_status(exc))
                return
            if pending.soon is not None:
                self.pending[ident] = pending
                return

        async def infer(decoded: Decoded, pending: Pending) -> None:
            await self._infer(decoded, route, shared, pending)

        self._begin(decoded, infer)

    def _done(self, ident: int, answer: InferResponse | Exception) -> None:
        """The service's answer to call ``ident`` (``InferenceService.infer_soon``)."""
        if self.pending.pop(ident, None) is None:  # the link is gone
            if not isinstance(answer, Exception):
                answer.release()
            return
        if isinstance(answer, Exception):
            self._status(ident, error_status(answer))
        else:
            self._result(ident, answer)

    def _result(self, ident: int, response: InferResponse) -> None:
        """Send ``response``'s tensors back (an output the frame cannot carry: its error's
        status); the response is released."""
        try:
            self._write(link_tensors.encode_result(ident, response, False))
        except Exception as exc:
            self._status(ident, error_status(exc))
        finally:
            response.release()

    async def _infer(self, decoded: Decoded, route: Route, shared: bool, pending: Pending) -> None:
        """A checked ``ModelInfer`` the service answers in a task (it may wait)."""
        ident = decoded.id
        try:
            result = await _serve_grpc(self.runtime, decoded, route, shared, watch(pending))
        except BaseException:
            self._fail(ident, pending)
            raise
        answering = self.pending.pop(ident, None) is not None and not pending.gone
        if isinstance(result, GrpcStatus):
            if answering:
                self._status(ident, result)
        elif answering:
            self._result(ident, result)
        else:
            result.release()

    async def _call(self, call: Call, pending: Pending) -> None:
        """Another unary gRPC call: the servicer's answer (a cancel cancels it)."""
        pending.working = True
        try:
            status = await answer_call(self.servicer, call)
        except asyncio.CancelledError:
            if not pending.gone:
                self._fail(call.id, pending)
                raise
            return
        if self.pending.pop(call.id, None) is not None and not pending.gone:
            self._status(call.id, status)

    def _open(self, call: Call) -> None:
        """Open a forwarded stream now, so that the messages that follow in the same
        read (before its task first runs) find it."""
        ident = call.id
        context = StreamContext(
            call.peer,
            call.metadata,
            lambda raw: self._write(link_tensors.encode_stream_message(ident, raw)),
            lambda: self._write([link_tensors.encode_stream_credit(ident, 1)]),
        )
        self.streams[ident] = context

        async def serve(call: Call, pending: Pending) -> None:
            await self._stream(call, pending, context)

        self._begin(call, serve)

    async def _stream(self, call: Call, pending: Pending, context: StreamContext) -> None:
        """A ``ModelStreamInfer`` a front end forwards (a cancel cancels it)."""
        ident = call.id
        if pending.gone:  # cancelled before its task first ran
            self.streams.pop(ident, None)
            return
        pending.working = True
        try:
            status = await answer_stream(self.servicer, context)
        except asyncio.CancelledError:
            if not pending.gone:
                self._fail(ident, pending)
                raise
            return
        finally:
            self.streams.pop(ident, None)
        if self.pending.pop(ident, None) is not None and not pending.gone:
            self._status(ident, status)

    def _to_stream(self, ident: int, item: bytes | object) -> None:
        context = self.streams.get(ident)
        if context is not None:  # else the stream has ended: nobody reads it
            context.inbox.put_nowait(item)

    def _fail(self, ident: int, pending: Pending) -> None:
        """A call's task ended without an answer (the engine is stopping): the front end
        still waiting gets INTERNAL rather than nothing."""
        if self.pending.pop(ident, None) is not None and not pending.gone:
            self._status(ident, internal_status("internal error: the engine stopped the call"))

    def _status(self, ident: int, status: GrpcStatus) -> None:
        self._write(link_frames.encode_answer(ident, status.code, status.payload, status.trailing))
