"""The engine's side of the link to its front-end processes (``server.frontends`` > 1).

Two Unix-domain sockets in a private directory:

``link`` (stream)
    each front end connects once and sends ``HELLO`` (its pid), then one ``REQUEST``
    frame per inference request and a ``CANCEL`` when that request's client leaves
    (``server/link_frames.py``). The engine runs ``fast_infer.answer_infer`` on the body
    it received — decode, the service, encode, exactly as for a request read by its own
    HTTP listener — and sends the ``ANSWER``. Many requests share the connection; each
    read may carry many frames, and the answers of one event-loop turn go in one write.
``handover`` (seqpacket)
    a connection whose next request is not inference moves to the engine: the front
    end sends the socket (``SCM_RIGHTS``) and the bytes it already read, and the engine
    adopts it into its own HTTP server (``HttpServer.adopt``), where Starlette answers
    that request and whatever follows on the connection.

gRPC calls a front end accepted arrive as ``GRPC_INFER`` and ``CALL`` frames and are
answered by ``server/grpc_link.py``: a ``RESULT``, or an ``ANSWER`` whose status is the
call's gRPC code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from sordino.errors import Cancelled
from sordino.server import link_frames, link_tensors
from sordino.server.fast_infer import Watch, answer_decoded, answer_error, answer_infer
from sordino.server.grpc_link import (
    GrpcStatus,
    StreamContext,
    answer_call,
    answer_grpc_infer,
    answer_stream,
    error_status,
    internal_status,
)
from sordino.server.link_frames import (
    HANDOVER_CHUNK,
    HANDOVER_HEAD,
    FrameError,
    FrameReader,
    LinkRequest,
)
from sordino.server.link_tensors import Call, Decoded
from sordino.server.runtime import Runtime

if TYPE_CHECKING:
    from sordino.server.grpc import InferenceServicer

__all__ = ["EngineLink"]

T = TypeVar("T")


class _Identified(Protocol):
    @property
    def id(self) -> int: ...


ItemT = TypeVar("ItemT", bound=_Identified)

log = logging.getLogger("sordino.frontends")

Adopt = Callable[[socket.socket, bytes], None]


class _Pending:
    """An inference request the engine is answering for a front end."""

    __slots__ = ("gone", "task", "working")

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self.working = False  # inside the service: a cancel cancels the task
        self.gone = False  # the front end's client left


class _LinkConnection(asyncio.Protocol):
    """One front end's link connection, on the engine."""

    def __init__(self, link: EngineLink) -> None:
        self.link = link
        self.runtime = link.runtime
        self.reader = FrameReader()
        self.pending: dict[int, _Pending] = {}
        self.streams: dict[int, StreamContext] = {}  # forwarded ModelStreamInfer calls
        self.out: list[bytes] = []
        self.pid: int | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        for pending in self.pending.values():
            self._cancel(pending)
        self.pending.clear()
        self.link.connections.discard(self)
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
            for kind, body in frames:
                if kind == link_tensors.INFER:
                    self._start_decoded(link_tensors.decode_infer(body))
                elif kind == link_tensors.GRPC_INFER:
                    self._begin(link_tensors.decode_infer(body), self._serve_grpc)
                elif kind == link_tensors.CALL:
                    self._begin(link_tensors.decode_call(body), self._call)
                elif kind == link_tensors.STREAM_OPEN:
                    self._open_stream(link_tensors.decode_call(body))
                elif kind == link_tensors.STREAM_MESSAGE:
                    ident, raw = link_tensors.decode_stream_message(body)
                    self._to_stream(ident, raw)
                elif kind == link_tensors.STREAM_END:
                    self._to_stream(link_frames.decode_id(body), grpc_aio_eof())
                elif kind == link_tensors.REFUSED:
                    self.runtime.service.refused_unread(*link_tensors.decode_refused(body))
                elif kind == link_frames.REQUEST:
                    self._start(link_frames.decode_request(body))
                elif kind == link_frames.CANCEL:
                    ident = link_frames.decode_id(body)
                    self.streams.pop(ident, None)  # a stream cancelled before its task ran
                    pending = self.pending.pop(ident, None)
                    if pending is not None:
                        self._cancel(pending)
                elif kind == link_frames.HELLO:
                    self.pid = link_frames.decode_id(body)
                    self.link.connections.add(self)
                    self.link.hello.set()
                else:
                    raise FrameError(f"an unknown frame kind {kind}")
        except FrameError as exc:
            log.error("a front end sent a broken frame (%s); its link is closed", exc)
            if self.transport is not None:
                self.transport.close()

    def _start(self, request: LinkRequest) -> None:
        pending = _Pending()
        self.pending[request.id] = pending
        pending.task = asyncio.get_running_loop().create_task(self._answer(request, pending))

    def _cancel(self, pending: _Pending) -> None:
        pending.gone = True
        if pending.working and pending.task is not None:
            pending.task.cancel()  # the service removes the request and counts it cancelled

    def _start_decoded(self, decoded: Decoded) -> None:
        pending = _Pending()
        self.pending[decoded.id] = pending
        pending.task = asyncio.get_running_loop().create_task(self._serve(decoded, pending))

    def _begin(
        self,
        item: ItemT,
        work: Callable[[ItemT, _Pending], Coroutine[Any, Any, None]],
    ) -> None:
        pending = _Pending()
        self.pending[item.id] = pending
        pending.task = asyncio.get_running_loop().create_task(work(item, pending))

    async def _serve_grpc(self, decoded: Decoded, pending: _Pending) -> None:
        """A ``ModelInfer`` a front end decoded: its response's tensors or its status."""
        ident = decoded.id
        try:
            result = await answer_grpc_infer(self.runtime, decoded, _watch(pending))
        except BaseException:
            self._fail(ident, pending)
            raise
        answering = self.pending.pop(ident, None) is not None and not pending.gone
        if isinstance(result, GrpcStatus):
            if answering:
                self._status(ident, result)
            return
        try:
            if answering:
                self._write(link_tensors.encode_result(ident, result, False))
        except Exception as exc:
            self._status(ident, error_status(exc))
        finally:
            result.release()

    async def _call(self, call: Call, pending: _Pending) -> None:
        """Another unary gRPC call: the servicer's answer (a cancel cancels it)."""
        pending.working = True
        try:
            status = await answer_call(self.link.servicer, call)
        except asyncio.CancelledError:
            if not pending.gone:
                self._fail(call.id, pending)
                raise
            return
        if self.pending.pop(call.id, None) is not None and not pending.gone:
            self._status(call.id, status)

    def _open_stream(self, call: Call) -> None:
        """Register a forwarded stream before its task runs: its first messages (and its
        end) may come in the same read as its opening, and must find it."""
        ident = call.id
        self.streams[ident] = StreamContext(
            call.peer,
            call.metadata,
            lambda raw: self._write(link_tensors.encode_stream_message(ident, raw)),
        )
        self._begin(call, self._stream)

    async def _stream(self, call: Call, pending: _Pending) -> None:
        """A ``ModelStreamInfer`` a front end forwards (a cancel cancels it)."""
        ident = call.id
        context = self.streams.get(ident)
        if context is None:  # cancelled before this task ran
            return
        pending.working = True
        try:
            status = await answer_stream(self.link.servicer, context)
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

    def _fail(self, ident: int, pending: _Pending) -> None:
        """A gRPC call's task ended without an answer (the engine is stopping): the
        front end still waiting gets INTERNAL rather than nothing."""
        if self.pending.pop(ident, None) is not None and not pending.gone:
            self._status(ident, internal_status("internal error: the engine stopped the call"))

    def _status(self, ident: int, status: GrpcStatus) -> None:
        self._write(link_frames.encode_answer(ident, status.code, status.payload, status.trailing))

    async def _serve(self, decoded: Decoded, pending: _Pending) -> None:
        """A request the front end decoded: its response's tensors, or its error, back."""
        ident = decoded.id
        try:
            result = await answer_decoded(
                self.runtime, decoded.request, decoded.read_s, decoded.size, _watch(pending)
            )
        except BaseException:
            self.pending.pop(ident, None)
            if not pending.gone:
                self._send(ident, 500, b'{"error":"internal error"}', {})
            raise
        answering = self.pending.pop(ident, None) is not None and not pending.gone
        if result is None:  # the result cache keys on the body: ask for it
            if answering:
                self._send(ident, link_frames.SEND_BODY, b"", {})
            return
        if isinstance(result, tuple):
            if answering:
                status, payload, headers = result
                if self.runtime.stopping:
                    headers["Connection"] = "close"
                self._send(ident, status, payload, headers)
            return
        try:
            if answering:
                parts = link_tensors.encode_result(ident, result, self.runtime.stopping)
                self._write(parts)
        except Exception as exc:
            self._send(ident, *answer_error(exc, f"/v2/models/{decoded.request.model}/infer"))
        finally:
            result.release()

    async def _answer(self, request: LinkRequest, pending: _Pending) -> None:
        body = request.body

        async def read_body() -> bytes:
            if pending.gone:
                raise Cancelled("the client disconnected while sending the request")
            return body

        watch = _watch(pending)

        try:
            status, payload, headers = await answer_infer(
                self.runtime,
                request.model,
                request.version,
                request.headers,
                read_body,
                watch,
                client=request.client,
                received_at=request.received_at,
                path=request.path,
            )
        except BaseException:
            self.pending.pop(request.id, None)
            if not pending.gone:  # the front end still waits: tell it
                self._send(request.id, 500, b'{"error":"internal error"}', {})
            raise
        if self.pending.pop(request.id, None) is not None and not pending.gone:
            self._send(request.id, status, payload, headers)

    def _send(self, ident: int, status: int, payload: bytes, headers: dict[str, str]) -> None:
        self._write(link_frames.encode_answer(ident, status, payload, headers))

    def _write(self, parts: list[bytes]) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if not self.out:
            asyncio.get_running_loop().call_soon(self._flush)
        self.out += parts

    def _flush(self) -> None:
        out, self.out = self.out, []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(out)


def grpc_aio_eof() -> object:
    """grpc.aio's end-of-stream marker (what ``context.read()`` returns at a half-close)."""
    import grpc

    eof: object = grpc.aio.EOF
    return eof


def _watch(pending: _Pending) -> Watch:
    """Runs the service's work for ``pending``: a cancel from the front end cancels it."""

    async def watch(work: Awaitable[T]) -> T:
        pending.working = True
        try:
            if pending.gone:
                raise Cancelled("the client disconnected before the response was ready")
            return await work
        except asyncio.CancelledError:
            if not pending.gone:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            raise Cancelled("the client disconnected before the response was ready") from None
        finally:
            pending.working = False

    return watch


class EngineLink:
    """The engine's two sockets for its front ends (see the module's docstring).

    ``adopt`` takes a handed-over connection and the bytes already read from it;
    ``servicer`` (the engine's gRPC servicer) answers the gRPC calls forwarded as
    ``CALL`` frames (None: they are answered UNIMPLEMENTED).
    :attr:`path` is the directory the front ends are told about.
    """

    def __init__(
        self, runtime: Runtime, adopt: Adopt, servicer: InferenceServicer | None = None
    ) -> None:
        self.runtime = runtime
        self.adopt = adopt
        self.servicer = servicer
        self.path = Path(tempfile.mkdtemp(prefix="sordino-link-"))
        self.connections: set[_LinkConnection] = set()
        self.hello = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None
        self._handover: socket.socket | None = None
        self._peers: dict[int, tuple[socket.socket, _Adopting]] = {}

    @property
    def link_path(self) -> str:
        return str(self.path / "link")

    @property
    def handover_path(self) -> str:
        return str(self.path / "handover")

    async def start(self) -> None:
        """Listen on both sockets."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(
            lambda: _LinkConnection(self), self.link_path, backlog=128
        )
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(self.handover_path)
        listener.listen(128)
        listener.setblocking(False)
        self._handover = listener
        loop.add_reader(listener.fileno(), self._accept_handover)

    def pids(self) -> set[int]:
        """The front ends connected now (their pids)."""
        return {c.pid for c in self.connections if c.pid is not None}

    def _accept_handover(self) -> None:
        assert self._handover is not None
        try:
            peer, _ = self._handover.accept()
        except (BlockingIOError, InterruptedError):
            return
        peer.setblocking(False)
        state = _Adopting()
        self._peers[peer.fileno()] = (peer, state)
        asyncio.get_running_loop().add_reader(peer.fileno(), self._read_handover, peer, state)

    def _read_handover(self, peer: socket.socket, state: _Adopting) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(peer, HANDOVER_HEAD.size + HANDOVER_CHUNK, 4)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            if not data and not fds:  # the front end went away
                loop.remove_reader(peer.fileno())
                self._peers.pop(peer.fileno(), None)
                state.drop()
                peer.close()
                return
            done = state.take(data, fds)
            if done is not None:
                sock, read = done
                try:
                    self.adopt(sock, read)
                except OSError as exc:  # the client is already gone
                    log.debug("a handed-over connection could not be adopted: %s", exc)
                    sock.close()

    async def close(self) -> None:
        """Stop listening and close every link (front ends see EOF and end)."""
        loop = asyncio.get_running_loop()
        if self._handover is not None:
            loop.remove_reader(self._handover.fileno())
            self._handover.close()
            self._handover = None
        for peer, state in list(self._peers.values()):
            loop.remove_reader(peer.fileno())
            state.drop()
            peer.close()
        self._peers.clear()
        if self._server is not None:
            self._server.close()
            for connection in list(self.connections):
                if connection.transport is not None:
                    connection.transport.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None
        shutil.rmtree(self.path, ignore_errors=True)


class _Adopting:
    """A hand-over being received: the socket, then its bytes in chunks."""

    __slots__ = ("left", "parts", "sock")

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.left = 0
        self.parts: list[bytes] = []

    def take(self, data: bytes, fds: list[int]) -> tuple[socket.socket, bytes] | None:
        """Add one message; return the socket and its bytes once they are all here."""
        if fds:
            self.drop()
            for extra in fds[1:]:
                os.close(extra)
            self.sock = socket.socket(fileno=fds[0])
            (self.left,) = HANDOVER_HEAD.unpack_from(data)
            data = data[HANDOVER_HEAD.size :]
        if self.sock is None:
            return None  # bytes with no socket before them: a broken peer, dropped
        self.parts.append(data)
        self.left -= len(data)
        if self.left > 0:
            return None
        sock, read = self.sock, b"".join(self.parts)
        self.sock, self.parts = None, []
        return sock, read

    def drop(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock, self.parts = None, []
