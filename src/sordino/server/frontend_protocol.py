"""The HTTP protocol of a front-end process (``server.frontends`` > 1).

The same protocol as the engine's listener (``server/http_protocol.py``: httptools, the
connection guard's limits and timeouts, keep-alive, pipelining), with two differences:

- ``POST …/infer`` is a :class:`FrontendInferCycle`: the body is read and decoded here
  (``fast_infer.decode_body``; a malformed one is answered here and never reaches the
  engine), only its tensors and facts cross the engine link (``server/link_tensors.py``),
  and the response's tensors come back to be encoded here
  (``fast_infer.encode_response``) and written in one write: read in place from the
  engine's arena when it sent descriptors, then released (``FrontendLink.done``). The
  one request sent as its body is one whose model has the engine's result cache on (it
  keys on the body: the engine asks for it). A client that leaves cancels its request in the engine.
- any other request — metrics, health, model control, ``/generate``, SSE streams, the
  dashboard — needs the engine's state, so the connection moves there: at a boundary
  between requests, once the request line shows a target that is not inference, the
  socket and the bytes already read are handed to the engine (``SCM_RIGHTS``), which
  serves that request and the rest of the connection itself. The one request it cannot
  move is one pipelined behind an unanswered inference request on the same connection
  (its bytes were already parsed here): that one gets a 503 saying so, and the
  connection closes.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import ClassVar

from sordino.errors import SordinoError
from sordino.memo import Memo
from sordino.protocol.encode import encode_error
from sordino.protocol.validate import JSON_ROOM
from sordino.server.board_shed import BoardShed
from sordino.server.connection_guard import ConnectionGuard
from sordino.server.fast_infer import (
    INFER_PATH,
    READ_HEADERS,
    answer_error,
    check_declared,
    decode_body,
    encode_response,
    error_parts,
    parse_headers,
)
from sordino.server.frontend_link import ENGINE_GONE, FrontendLink, Reply, hand_over
from sordino.server.http_coding import coded, inflate
from sordino.server.http_cycle import InferCycle
from sordino.server.http_protocol import HttpProtocol
from sordino.server.link_frames import SEND_BODY, Answer, LinkRequest

__all__ = ["FrontendInferCycle", "FrontendProtocol", "frontend_protocol"]

_LINE_MAX = 16384
"""Bytes read for a request line at most before the connection is handed over anyway
(the engine's parser then answers whatever it is)."""
_PIPELINED = (
    "a request that is not inference, pipelined behind an unanswered inference request, "
    "is not supported by a front-end process (server.frontends > 1): send it once "
    "the answers before it arrived, or on a connection of its own"
)


async def _refuse_pipelined(scope: object, receive: object, send: object) -> None:
    """The ASGI app of a front end: answers the one request it cannot move (503)."""
    body = encode_error(_PIPELINED)
    await send(  # type: ignore[operator]
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})  # type: ignore[operator]


def frontend_protocol(
    guard: ConnectionGuard,
    link: FrontendLink,
    channel: socket.socket,
    *,
    max_request_size: int,
    keep_alive_s: float,
) -> type[FrontendProtocol]:
    """The protocol class of a front end: ``guard``'s limits, inference over ``link``,
    other requests' connections handed over on ``channel``."""

    class Bound(FrontendProtocol):
        pass

    Bound.guard, Bound.keep_alive_s = guard, keep_alive_s
    Bound.link, Bound.channel, Bound.max_request_size = link, channel, max_request_size
    Bound.apps = (_refuse_pipelined,)
    Bound.infer_cycle = FrontendInferCycle
    return Bound


class FrontendProtocol(HttpProtocol):
    """One connection on a front end (see the module's docstring)."""

    link: ClassVar[FrontendLink]
    channel: ClassVar[socket.socket]
    max_request_size: ClassVar[int]

    _line: bytes | None = None  # a request line being read at a boundary
    _handed = False

    def data_received(self, data: bytes) -> None:
        if self._handed:
            return
        if self._discard and self._admitted and not self._refused_late:
            data = self._drop_body(data)  # of a request refused from its head
            if not data:
                return
        if (
            self._made
            and self._admitted
            and not self._refused_late
            and (self._line is not None or self._at_boundary())
        ):
            held = data if self._line is None else self._line + data
            self._line = None
            end = held.find(b"\r\n")
            if end < 0 and len(held) < _LINE_MAX:
                self._line = held  # the request line is not whole yet
                self._unset_keep_alive()
                if self._phase is None:
                    self._arm("header")  # its header deadline runs from now
                self._request_bytes = True
                return
            if not _inference(held[: end if end >= 0 else _LINE_MAX]):
                self._hand_over(held)
                return
            data = held
        super().data_received(data)

    def _at_boundary(self) -> bool:
        """No request is being read or answered on the connection."""
        return (
            (self.cycle is None or self.cycle.response_complete)
            and not self.pipeline
            and not self._request_bytes
            and not self._shedding
        )

    def _hand_over(self, held: bytes) -> None:
        """Move the connection to the engine with the bytes ``held`` already read."""
        self._handed = True
        self._disarm()
        self._unset_keep_alive()
        transport = self.transport
        transport.pause_reading()
        sock = transport.get_extra_info("socket")
        try:
            hand_over(self.channel, sock, held)
        except OSError:
            body = encode_error(ENGINE_GONE)
            transport.write(
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
            )
        transport.close()  # only this process's descriptor: the engine's copy stays open


def _inference(line: bytes) -> bool:
    """Whether a request line's target is ``…/infer`` (any method: the 405 is local).

    Kept by line (a client sends the same few again and again; at most 256 lines of at
    most 4 KiB, then all forgotten: :class:`~sordino.memo.Memo`)."""
    if len(line) > 4096:
        return _read_line(line)
    return _LINES[line]


def _read_line(line: bytes) -> bool:
    parts = line.split(b" ")
    if len(parts) != 3:
        return False
    path = parts[1].partition(b"?")[0]
    if b"%" in path or not path.startswith(b"/v2/models/"):
        return False  # the engine decodes escapes and answers the rest
    try:
        return INFER_PATH.fullmatch(path.decode("ascii")) is not None
    except UnicodeDecodeError:
        return False


_LINES: Memo[bytes, bool] = Memo(_read_line, 256)


class FrontendInferCycle(InferCycle):
    """``…/infer`` on a front end: read the body, ask the engine, one write."""

    __slots__ = ("_future", "_ident")

    answers_whole = False  # the engine answers it: always read and forwarded in the task

    conn: FrontendProtocol

    async def _answer(self) -> None:
        self._ident = 0
        self._future: asyncio.Future[Reply] | None = None
        if self.method != "POST":
            message = f"{self.method} is not allowed on {self.path}; use POST"
            self.respond(405, encode_error(message), {"Allow": "POST"})
            return
        conn = self.conn
        # The headers the engine reads; the others stay in the front end.
        forwarded = [pair for pair in self.headers if pair[0] in READ_HEADERS]
        declared, header_length, facts = parse_headers(forwarded)
        try:
            check_declared(conn.max_request_size, declared)
            arrived = time.perf_counter()
            body = await self.read_body()
            read_s = time.perf_counter() - arrived
            coding = facts.get("content-encoding")
            data = body if coding is None else inflate(body, coding, conn.max_request_size)
            shed = conn.guard.early_shed
            values = None
            if len(data) > JSON_ROOM and isinstance(shed, BoardShed):
                # More JSON than any request to the model needs is refused before parsing.
                values = shed.json_values(self.model, self.version)
            # A malformed body is answered here; it never reaches the engine.
            request = decode_body(
                data,
                self.model,
                self.version,
                header_length,
                facts,
                client=self.client,
                received_at=self.received_at,
                json_values=values,
            )
        except SordinoError as exc:
            # Counted by the engine as it counts one refused in its own process.
            conn.link.refused(self.model, self.version, facts.get("x-sordino-tenant"), exc.reason)
            self.respond(*error_parts(exc))
            return
        await conn.link.writable()
        if self.disconnected:
            return  # the client left while the link was full: nothing was sent
        try:
            self._ident, future = conn.link.call_decoded(request, read_s)
        except Exception as exc:  # a tensor that cannot be framed: answered, never sent
            self.respond(*answer_error(exc, self.path))
            return
        self._future = future
        reply = await future
        if isinstance(reply, Answer):
            if reply.status == SEND_BODY:  # the engine's result cache keys on the body
                link_request = LinkRequest(
                    0,
                    self.received_at,
                    self.model,
                    self.version,
                    self.path,
                    self.client,
                    forwarded,
                    body,
                )
                self._future = future = conn.link.call(link_request)
                self._ident = link_request.id
                reply = await future
            if isinstance(reply, Answer):
                self.respond(reply.status, reply.payload, reply.headers)
                return
        response, close = reply
        link = conn.link
        try:
            if not link.readable(self._ident):  # the engine may have let go of its outputs
                status, payload = 503, encode_error(ENGINE_GONE)
                headers = {"Content-Type": "application/json", "Connection": "close"}
            else:
                # Outputs held in the engine's arena are read in place, here, once.
                payload, headers = coded(facts, *encode_response(response, request))
                status = 200
        except Exception as exc:
            status, payload, headers = answer_error(exc, self.path)
        finally:
            link.done(self._ident)
        if close:
            headers["Connection"] = "close"
        self.respond(status, payload, headers)

    def _body_limit(self) -> int:
        """The engine's ``server.max_request_size``, handed to this front end at its start."""
        return self.conn.max_request_size

    def disconnect(self) -> None:
        self.disconnected = True
        self._signal()
        future = getattr(self, "_future", None)
        if future is not None and not future.done():
            self.conn.link.cancel(self._ident)  # the engine cancels the request
            future.set_result(Answer(self._ident, 499, b"", {}))  # dropped: the client left
