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

gRPC calls a front end accepted arrive as ``GRPC_INFER``, ``CALL`` and ``STREAM_*``
frames; this module hands them to ``server/grpc_link.py`` (:class:`GrpcCalls`), which
answers them on the same connection: a ``RESULT``, stream messages, or an ``ANSWER``
whose status is the call's gRPC code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from sordino.errors import Cancelled, OutOfMemory
from sordino.inference import InferRequest, InferResponse, Tensor, release_owned
from sordino.memory.grant import Grant, grant_size
from sordino.server import link_arena, link_frames, link_tensors
from sordino.server.connection_tally import ConnectionTally
from sordino.server.decoded_infer import Ready, begin_decoded
from sordino.server.fast_infer import answer_error, answer_infer, serve
from sordino.server.grpc_link import GrpcCalls
from sordino.server.link_frames import (
    HANDOVER_CHUNK,
    HANDOVER_HEAD,
    FrameError,
    FrameReader,
    LinkRequest,
)
from sordino.server.link_pending import Forwarded, Pending, watch
from sordino.server.runtime import Runtime

if TYPE_CHECKING:
    from sordino.server.grpc import InferenceServicer

__all__ = ["EngineLink"]

log = logging.getLogger("sordino.frontends")

Adopt = Callable[[socket.socket, bytes], None]


class _LinkConnection(link_frames.BatchedWrites, asyncio.Protocol):
    """One front end's link connection, on the engine."""

    def __init__(self, link: EngineLink) -> None:
        self.link = link
        self.runtime = link.runtime
        self.parts = link.runtime.inference
        self.reader = FrameReader()
        self.pending: dict[int, Pending] = {}
        self.out: list[bytes] = []
        self.grpc = GrpcCalls(link.runtime, link.servicer, self.pending, self._write)
        self.pid: int | None = None
        self.transport: asyncio.Transport | None = None
        self.held: dict[int, InferResponse] = {}
        """Responses whose outputs the front end reads in place (``RESULT`` descriptors),
        held until its ``RELEASE``, or until the link ends."""
        self.grant: Grant | None = None
        """The block of the arena the front end lays its inputs into (``GRANT``)."""
        self._freed: list[int] = []  # granted ranges let go of this turn: the next FREED
        self.heard = time.monotonic()
        """When the front end's last beat came (its connection figures, sent at least
        once a second: the request path does not touch it)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        for pending in self.pending.values():
            pending.cancel()
        self.pending.clear()
        # The front end closed its end (or died): it reads none of these any more.
        held, self.held = self.held, {}
        for response in held.values():
            response.release()
        if self.grant is not None:  # back to the arena once running requests let go
            self.grant.close()
        self.link.connections.discard(self)
        self.link.tally.gone(self)  # its open connections leave the sum, not its counters
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
            for kind, body in frames:
                if kind == link_tensors.INFER:
                    self._infer(body)
                elif kind in link_tensors.GRPC_KINDS:
                    self.grpc.received(kind, body)
                elif kind == link_arena.RELEASE:
                    for ident in link_arena.decode_ids(body):
                        response = self.held.pop(ident, None)
                        if response is not None:
                            response.release()
                elif kind == link_tensors.REFUSED:
                    self.runtime.service.refused_unread(*link_tensors.decode_refused(body))
                elif kind == link_frames.REQUEST:
                    self._start(link_frames.decode_request(body))
                elif kind == link_frames.CANCEL:
                    pending = self.pending.pop(link_frames.decode_id(body), None)
                    if pending is not None:
                        pending.cancel()
                elif kind == link_frames.CONNECTIONS:  # at least once a second: its beat
                    self.heard = time.monotonic()
                    self.link.tally.report(self, link_frames.decode_connections(body))
                elif kind == link_frames.HELLO:
                    self.pid = link_frames.decode_id(body)
                    self.link.connections.add(self)
                    self.link.hello.set()
                    self._grant()
                else:
                    raise FrameError(f"an unknown frame kind {kind}")
        except FrameError as exc:
            log.error("a front end sent a broken frame (%s); its link is closed", exc)
            self.end()

    def _grant(self) -> None:
        """Grant the front end a block of the arena for its inputs, where one may be
        (``server/link_arena.py`` says when not); the ``GRANT`` frame tells it where."""
        owner = self.runtime.memory.owner
        arena = owner.existing()
        if (
            self.grant is not None
            or arena is None
            or arena.closed
            or arena.zero_on_free
            or owner.memory.pool_size == "auto"
        ):
            return
        try:
            # server.frontends unset: at most 4 (the default from the cores).
            count = self.runtime.config.server.frontends or 4
            self.grant = Grant(arena, grant_size(arena, count), self._free)
        except OutOfMemory:
            log.info("no arena space to grant a front end: its inputs cross as bytes")
            return
        block = self.grant.block
        self._write([link_arena.encode_grant(arena.name, block.offset, block.size)])

    def _free(self, offset: int) -> None:
        """A granted range was let go of: the front end may reuse it (one ``FREED`` a turn)."""
        if self.transport is None:
            return  # the link is ending: the grant goes back whole
        if not self._freed:
            asyncio.get_running_loop().call_soon(self._flush_freed)
        self._freed.append(offset)

    def _flush_freed(self) -> None:
        freed, self._freed = self._freed, []
        if freed:
            self._write([link_arena.encode_ids(link_arena.FREED, freed)])

    def end(self) -> None:
        """Close the link from this end. With responses held, only this end's writing:
        the front end may be reading them now; it closes its end once it sees the
        EOF, after any encoding under way, and the holds go then (never before)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.held and transport.can_write_eof():
            transport.write_eof()
            self.transport = None  # nothing more is written; what arrives is still read
        else:
            transport.close()

    def _start(self, request: LinkRequest) -> None:
        pending = Pending()
        self.pending[request.id] = pending
        pending.task = asyncio.get_running_loop().create_task(self._answer(request, pending))

    def _infer(self, body: bytes) -> None:
        """An ``INFER`` frame: checked and handed to the service now; answered by
        callback (:meth:`_done`), or by a task where the service must wait."""
        decoded = link_tensors.decode_infer(body, self.grant)
        ident, request = decoded.id, decoded.request
        inputs = request.inputs  # the service may swap in a plain dict (shm, state)
        ready = begin_decoded(self.parts, request, decoded.read_s, decoded.size)
        if not isinstance(ready, Ready):
            release_owned(inputs)  # granted inputs go back to the front end
            if ready is None:  # the result cache keys on the body: ask for it
                self._send(ident, link_frames.SEND_BODY, b"", {})
            else:
                self._answer_error(ident, ready)
            return
        if not ready.shared:
            pending = Forwarded(inputs)
            try:
                pending.soon = self.parts.service.infer_soon(
                    request, ready.route, partial(self._done, ident, request.model, inputs)
                )
            except Exception as exc:  # refused (counted by the service)
                release_owned(inputs)
                self._answer_error(ident, answer_error(exc, _path(request.model)))
                return
            if pending.soon is not None:
                self.pending[ident] = pending
                return
        task_pending = Pending()
        self.pending[ident] = task_pending
        task_pending.task = asyncio.get_running_loop().create_task(
            self._serve(ident, request, ready, task_pending)
        )

    def _done(
        self,
        ident: int,
        model: str,
        inputs: Mapping[str, Tensor],
        answer: InferResponse | Exception,
    ) -> None:
        """The service's answer to request ``ident`` (:meth:`InferenceService.infer_soon`)."""
        # Inputs in the front end's grant go back to it whatever the outcome (a no-op
        # when the service released them already, as it does the requests it took).
        release_owned(inputs)
        if self.pending.pop(ident, None) is None:  # the link is gone
            if not isinstance(answer, Exception):
                answer.release()
            return
        if isinstance(answer, Exception):
            self._answer_error(ident, answer_error(answer, _path(model)))
            return
        self._result(ident, model, answer)

    def _result(self, ident: int, model: str, response: InferResponse) -> None:
        """Send ``response`` (held until the front end's ``RELEASE`` when its outputs go
        as arena descriptors; else released here)."""
        held = False
        try:
            parts, held = link_tensors.encode_result_held(
                ident, response, self.runtime.stopping, self.runtime.memory.owner.existing()
            )
            if held and (self.transport is None or self.transport.is_closing()):
                held = False  # nobody will read it: released below
            else:
                self._write(parts)
            if held:
                self.held[ident] = response  # until the front end's RELEASE
        except Exception as exc:  # an output the frame cannot carry: answered as an error
            self._send(ident, *answer_error(exc, _path(model)))
        finally:
            if not held:
                response.release()

    async def _serve(
        self, ident: int, request: InferRequest, ready: Ready, pending: Pending
    ) -> None:
        """A decoded request the service answers in a task (it may wait before its queue)."""
        inputs = request.inputs
        try:
            try:
                result: InferResponse | tuple[int, bytes, dict[str, str]] = await serve(
                    self.parts, request, ready.route, ready.shared, watch(pending)
                )
            except Exception as exc:
                result = answer_error(exc, _path(request.model))
        except BaseException:
            self.pending.pop(ident, None)
            if not pending.gone:
                self._send(ident, 500, b'{"error":"internal error"}', {})
            raise
        finally:
            release_owned(inputs)
        answering = self.pending.pop(ident, None) is not None and not pending.gone
        if isinstance(result, tuple):
            if answering:
                self._answer_error(ident, result)
        elif answering:
            self._result(ident, request.model, result)
        else:
            result.release()

    def _answer_error(self, ident: int, answer: tuple[int, bytes, dict[str, str]]) -> None:
        status, payload, headers = answer
        if self.runtime.stopping:
            headers["Connection"] = "close"
        self._send(ident, status, payload, headers)

    async def _answer(self, request: LinkRequest, pending: Pending) -> None:
        body = request.body

        async def read_body() -> bytes:
            if pending.gone:
                raise Cancelled("the client disconnected while sending the request")
            return body

        watched = watch(pending)

        try:
            status, payload, headers = await answer_infer(
                self.runtime,
                request.model,
                request.version,
                request.headers,
                read_body,
                watched,
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
        self.tally = ConnectionTally()
        """The front ends' connection figures (``CONNECTIONS`` frames)."""
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

    def heard(self) -> dict[int, float]:
        """When each connected front end (by pid) last beat (``time.monotonic``)."""
        return {c.pid: c.heard for c in self.connections if c.pid is not None}

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
                connection.end()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            self._server = None
        shutil.rmtree(self.path, ignore_errors=True)


def _path(model: str) -> str:
    return f"/v2/models/{model}/infer"


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
