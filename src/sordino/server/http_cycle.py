"""One request on an HTTP connection, from its headers to the end of its answer.

:class:`Cycle` is what the connection (``server/http_protocol.py``) knows of a request:
it feeds the body in, says when the body ended or the client left, and learns when
the answer is complete (to start the next pipelined request or arm the keep-alive
timer). Two kinds: :class:`InferCycle` answers ``POST …/infer`` itself — the body,
``fast_infer.answer_infer`` and one write — and ``asgi_bridge.AsgiCycle`` runs the
Starlette app for everything else.
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, ClassVar, TypeVar

from sordino.errors import Cancelled
from sordino.memo import Memo
from sordino.protocol.encode import encode_error
from sordino.server.connection_guard import error_response
from sordino.server.disconnect import client_left
from sordino.server.fast_infer import (
    Opened,
    answer_infer,
    open_infer,
    parse_headers,
    serve_opened,
    too_large,
)

if TYPE_CHECKING:
    from sordino.server.http_protocol import HttpProtocol

__all__ = ["HIGH_WATER", "STATUS_LINE", "Cycle", "InferCycle"]

T = TypeVar("T")

log = logging.getLogger("sordino.http")

HIGH_WATER = 65536
"""Body bytes buffered for a request that has not taken them before reading pauses."""

COALESCE = 16384
"""A piece of a body smaller than this, after the first, is copied onto the one before
(a ``bytearray``): a chunked body of one-byte chunks kept a ``bytes`` object each, 40
times its size in memory (and past ``server.max_pending_body_size``'s count)."""


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


STATUS_LINE = {status: _status_line(status) for status in range(100, 600)}
"""``HTTP/1.1 <status> <reason>\\r\\n`` for every status."""


class Cycle:
    """A request's body as it arrives, and the state of its answer.

    Subclasses implement :meth:`run` (the connection runs it as a task once every
    earlier request on the connection is answered, unless :meth:`defer` says it starts
    itself) and end it by :meth:`_complete`.
    """

    __slots__ = (
        "_signalled",
        "_waiter",
        "body",
        "buffered",
        "conn",
        "disconnected",
        "keep_alive",
        "method",
        "more_body",
        "response_complete",
        "response_started",
        "task",
        "waiting_for_100_continue",
    )

    def __init__(
        self, conn: HttpProtocol, method: str, keep_alive: bool, expect_continue: bool
    ) -> None:
        self.conn = conn
        self.method = method
        self.keep_alive = keep_alive
        """Whether the connection stays open after the answer (``shutdown`` clears it)."""
        self.waiting_for_100_continue = expect_continue
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self.more_body = True
        self.body: list[bytes | bytearray] = []
        self.buffered = 0
        self.task: asyncio.Task[None] | None = None
        self._signalled = False
        self._waiter: asyncio.Future[None] | None = None

    async def run(self) -> None:
        """Answer the request (the connection's task for it)."""
        raise NotImplementedError

    def defer(self) -> bool:
        """Whether the request, due now, starts itself later (once its body is whole,
        ``InferCycle``: it asks the connection for its task if it needs one) instead of
        the connection running :meth:`run` in a task now."""
        return False

    # -- from the connection ---------------------------------------------------------

    def feed(self, chunk: bytes) -> int:
        """Take a piece of the body; return the bytes buffered and not yet taken."""
        body = self.body
        if body and len(chunk) < COALESCE:
            last = body[-1]
            if isinstance(last, bytearray):
                last += chunk
            else:
                body.append(bytearray(chunk))
        else:
            body.append(chunk)
        self.buffered += len(chunk)
        self._signal()
        return self.buffered

    def end(self) -> None:
        """The body is complete."""
        self.more_body = False
        self._signal()

    def disconnect(self) -> None:
        """The client left (or its body timed out): nothing more is read or written."""
        self.disconnected = True
        self._signal()

    # -- for the subclasses ----------------------------------------------------------

    def _signal(self) -> None:
        self._signalled = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        """Wait for the next :meth:`_signal` (at once if one came since the last wait).

        One waiter at a time: the inference cycle reads its own body and nothing else
        waits on it (cheaper than an ``asyncio.Event``)."""
        if not self._signalled:
            self._waiter = self.conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self._signalled = False

    def _take(self) -> bytes:
        body = self.body
        first = body[0] if len(body) == 1 else None
        data = first if isinstance(first, bytes) else b"".join(body)  # the first is bytes
        self.body = []
        self.buffered = 0
        return data

    def _continue(self) -> None:
        """Send ``100 Continue`` if the client waits for it before sending its body."""
        if self.waiting_for_100_continue and not self.conn.transport.is_closing():
            self.conn.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.waiting_for_100_continue = False

    def _cancelled_by_stop(self, path: str) -> None:
        """The stop's grace ran out with this request unanswered (its task was
        cancelled): 503 if nothing was sent yet, and close; one line in the log."""
        log.warning("request to %s cancelled: the server stopped before it was answered", path)
        conn = self.conn
        if not self.response_started and not self.disconnected:
            self.response_started = True
            conn.transport.write(
                error_response(
                    503,
                    "the server stopped before the request was answered; send it again "
                    "(to another instance)",
                    retry_after=True,
                )
            )
        self.response_complete = True
        conn.transport.close()

    def _complete(self) -> None:
        """The answer is written whole: close, or go on to the next request."""
        self.response_complete = True
        self._signal()
        if not self.keep_alive:
            self.conn.transport.close()
        self.conn.on_response_complete()


_TEXT = "text/plain; charset=utf-8"
_CLOSE = re.compile(r"(?:^|,)\s*close\s*(?:,|$)", re.IGNORECASE)


class InferCycle(Cycle):
    """``…/infer``: read the body, :func:`answer_infer`, one write; no ASGI, no Starlette.

    A ``POST`` that does not wait for ``100 Continue`` starts once its body is whole
    (:meth:`defer`, then :meth:`end`): :func:`open_infer` decodes it in one callback and
    the task starts at the service (:func:`serve_opened`), with no coroutine reading the
    body meanwhile. A body past :data:`HIGH_WATER`, or a client that leaves mid-body,
    starts the task at once, as every other request does.
    """

    answers_whole: ClassVar[bool] = True
    """Whether the task starts once the body is whole (a front end's cycle: no)."""

    __slots__ = (
        "_deferred",
        "_gone",
        "_opened",
        "_working",
        "client",
        "headers",
        "model",
        "path",
        "received_at",
        "version",
    )

    def __init__(
        self,
        conn: HttpProtocol,
        method: str,
        keep_alive: bool,
        expect_continue: bool,
        *,
        model: str,
        version: str | None,
        path: str,
        headers: list[tuple[bytes, bytes]],
        client: str | None,
        received_at: float,
    ) -> None:
        super().__init__(conn, method, keep_alive, expect_continue)
        self.model = model
        self.version = version
        self.path = path
        self.headers = headers
        self.client = client
        self.received_at = received_at
        self._working = False  # the service has the request (a disconnect cancels it)
        self._gone = False  # the client left while the service had it
        self._deferred = False  # starts when its body is whole (defer)
        self._opened: Opened | None = None  # decoded (_open), for the task's service step

    def defer(self) -> bool:
        if not self.answers_whole or self.method != "POST" or self.waiting_for_100_continue:
            return False
        self._deferred = True
        return True

    def feed(self, chunk: bytes) -> int:
        buffered = super().feed(chunk)
        if self._deferred and buffered > HIGH_WATER:
            self._in_task()  # a large body is read by the task, reading paused meanwhile
        return buffered

    def end(self) -> None:
        super().end()
        if self._deferred:
            self._deferred = False
            # From the loop, not from inside the parser's callback (an answer written
            # there could close the transport under the parser).
            self.conn.loop.call_soon(self._open)

    def disconnect(self) -> None:
        super().disconnect()
        if self._deferred:  # left mid-body: the task counts it, as any request read so
            self._in_task()
        elif self._working and not self._gone and self.task is not None:
            # The service removes the queued request and counts it cancelled.
            self._gone = True
            self.task.cancel()

    def _in_task(self) -> None:
        self._deferred = False
        self.conn.start_task(self)

    def _open(self) -> None:
        """The body is whole: decoded and checked up to the service, then the task."""
        if self.disconnected:
            self._in_task()  # the task counts the request the client left
            return
        opened = open_infer(
            self.conn.runtime.inference,
            self.model,
            self.version,
            parse_headers(self.headers),
            self._take(),
            time.monotonic() - self.received_at,
            client=self.client,
            received_at=self.received_at,
            path=self.path,
        )
        if isinstance(opened, Opened):
            self._opened = opened
            self._in_task()
        else:
            self.respond(*opened)

    async def run(self) -> None:
        try:
            await self._answer()
        except asyncio.CancelledError:  # the stop's grace ran out
            self._cancelled_by_stop(self.path)
        except BaseException as exc:  # a defect
            # As uvicorn does for an ASGI app: logged, answered 500 if nothing was sent yet.
            log.error("inference request to %s ended without an answer", self.path, exc_info=exc)
            if not self.response_started:
                self.keep_alive = False
                self.respond(500, b"Internal Server Error", {"Content-Type": _TEXT})
            else:
                self.conn.transport.close()

    async def _answer(self) -> None:
        if self.method != "POST":
            message = f"{self.method} is not allowed on {self.path}; use POST"
            self.respond(405, encode_error(message), {"Allow": "POST"})
            return
        opened, self._opened = self._opened, None
        if opened is not None:  # decoded when its body came whole (_open)
            status, payload, headers = await serve_opened(
                self.conn.runtime.inference, opened, self.until_disconnect, self.path
            )
        else:
            status, payload, headers = await answer_infer(
                self.conn.runtime,
                self.model,
                self.version,
                self.headers,
                self.read_body,
                self.until_disconnect,
                client=self.client,
                received_at=self.received_at,
                path=self.path,
            )
        self.respond(status, payload, headers)

    def _body_limit(self) -> int:
        """The most bytes a body may have: ``server.max_request_size``."""
        return self.conn.runtime.config.server.max_request_size

    async def read_body(self) -> bytes:
        """The whole body; Cancelled if the client leaves first, too large past the limit."""
        limit = self._body_limit()
        self._continue()
        while True:
            if self.disconnected or self.response_complete:
                raise Cancelled("the client disconnected while sending the request")
            if self.buffered > limit:
                raise too_large(limit)
            if not self.more_body:
                return self._take()
            self.conn.resume_reading()
            await self._wait()

    async def until_disconnect(self, work: Awaitable[T]) -> T:
        """``work``'s result; if the client leaves first, cancel it and raise Cancelled.

        The connection tells this request when its client goes (``connection_lost``):
        no listener, task or timer per request.
        """
        self._working = True
        try:
            return await work
        except asyncio.CancelledError:
            if not self._gone:
                raise
            raise client_left() from None
        finally:
            self._working = False

    def respond(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
        """Write the whole answer in one write (dropped if the client left)."""
        if self.disconnected:
            return
        self.response_started = True
        self.waiting_for_100_continue = False
        conn = self.conn
        lines, closing = _HEADS[tuple(headers.items())]
        if closing:
            self.keep_alive = False
        parts = [
            STATUS_LINE[status],
            conn.default_head(),
            b"content-length: %d\r\n" % len(payload),
            lines if closing or self.keep_alive else lines + b"connection: close\r\n",
            b"\r\n",
        ]
        if self.method != "HEAD":
            parts.append(payload)
        conn.transport.write(b"".join(parts))
        self._complete()


def _head_lines(headers: tuple[tuple[str, str], ...]) -> tuple[bytes, bool]:
    """``headers`` as header lines (names in lower case, ``content-type`` JSON unless
    given) and whether a ``Connection`` among them says close."""
    lines, closing = [], False
    for name, value in headers:
        lower = name.lower()
        if lower == "connection" and _CLOSE.search(value):
            closing = True
        lines.append(f"{lower}: {value}\r\n".encode("latin-1"))
    if all(name != "Content-Type" for name, _ in headers):
        lines.append(b"content-type: application/json\r\n")
    return b"".join(lines), closing


_HEADS: Memo[tuple[tuple[str, str], ...], tuple[bytes, bool]] = Memo(_head_lines, 256)
"""An answer's own header lines as written, and whether they say close, by its headers:
an inference answer's few kinds are encoded once, not once a request."""
