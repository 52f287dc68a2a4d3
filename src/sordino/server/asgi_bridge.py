"""Every request but inference, handed to the Starlette app through ASGI.

A minimal HTTP/1.1 ASGI cycle, as uvicorn's httptools protocol runs one: ``receive``
gives ``http.request`` (the body, ``more_body``) then ``http.disconnect``; ``send``
takes ``http.response.start`` and ``http.response.body``, framed by the
``Content-Length`` the app gives or else chunked (so ``/generate_stream``'s events go
out as they come); a ``HEAD`` answer has no body; ``Expect: 100-continue`` is
answered when the app first reads the body. An app that fails before answering gets
500; one that fails in the middle of an answer has its connection closed.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import TYPE_CHECKING, Any

from sordino.server.http_cycle import STATUS_LINE, Cycle

if TYPE_CHECKING:
    from sordino.server.http_protocol import HttpProtocol

__all__ = ["AsgiCycle"]

log = logging.getLogger("sordino.http")

_HEADER_NAME = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
_HEADER_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")
_ERROR_500: list[tuple[bytes, bytes]] = [
    (b"content-type", b"text/plain; charset=utf-8"),
    (b"content-length", b"21"),
    (b"connection", b"close"),
]


class AsgiCycle(Cycle):
    """One request run by the ASGI app."""

    __slots__ = ("chunked", "event", "expected_length", "scope")

    def __init__(
        self, conn: HttpProtocol, scope: dict[str, Any], keep_alive: bool, expect_continue: bool
    ) -> None:
        super().__init__(conn, scope["method"], keep_alive, expect_continue)
        self.scope = scope
        self.chunked: bool | None = None
        self.expected_length = 0
        # An app may wait in receive() from two tasks at once (a disconnect watcher and
        # a cancelled probe): an Event wakes every waiter, as uvicorn's cycle does.
        self.event = asyncio.Event()

    def _signal(self) -> None:
        self.event.set()

    async def _wait(self) -> None:
        await self.event.wait()
        self.event.clear()

    async def run(self) -> None:
        try:
            result: object = await self.conn.app(self.scope, self.receive, self.send)  # type: ignore[func-returns-value]
        except asyncio.CancelledError:  # the stop's grace ran out
            self._cancelled_by_stop(self.scope["path"])
        except BaseException as exc:
            log.error("exception in the ASGI application", exc_info=exc)
            if not self.response_started:
                await self._send_500()
            else:
                self.conn.transport.close()
        else:
            if result is not None:
                log.error("the ASGI app returned %r instead of None", result)
                self.conn.transport.close()
            elif not self.response_started and not self.disconnected:
                log.error("the ASGI app returned without starting its response")
                await self._send_500()
            elif not self.response_complete and not self.disconnected:
                log.error("the ASGI app returned without completing its response")
                self.conn.transport.close()

    async def _send_500(self) -> None:
        await self.send({"type": "http.response.start", "status": 500, "headers": _ERROR_500})
        await self.send({"type": "http.response.body", "body": b"Internal Server Error"})

    async def receive(self) -> dict[str, Any]:
        """The next ASGI receive event: the body (as it has come), then the disconnect."""
        self._continue()
        if not self.disconnected and not self.response_complete:
            self.conn.resume_reading()
            await self._wait()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": self._take(), "more_body": self.more_body}

    async def send(self, message: Any) -> None:
        """Write an ASGI send event (dropped once the client left)."""
        conn = self.conn
        if conn.write_paused and not self.disconnected:
            await conn.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected ASGI message 'http.response.start', got {kind!r}")
            self._start(message["status"], message.get("headers", []))
        elif not self.response_complete:
            if kind != "http.response.body":
                raise RuntimeError(f"expected ASGI message 'http.response.body', got {kind!r}")
            self._body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} after the response completed")

    def _start(self, status: int, headers: Any) -> None:
        self.response_started = True
        self.waiting_for_100_continue = False
        content = [STATUS_LINE[status], self.conn.default_head()]
        closing = False
        for name, value in headers:
            if _HEADER_NAME.search(name):
                raise RuntimeError("invalid HTTP header name")
            if _HEADER_VALUE.search(value):
                raise RuntimeError("invalid HTTP header value")
            name = name.lower()
            if name == b"content-length" and self.chunked is None:
                self.expected_length = int(value.decode())
                self.chunked = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_length = 0
                self.chunked = True
            elif name == b"connection" and b"close" in [
                token.lower().strip() for token in value.split(b",")
            ]:
                self.keep_alive = False
                closing = True
            content += [name, b": ", value, b"\r\n"]
        if not self.keep_alive and not closing:
            content.append(b"connection: close\r\n")
        if self.chunked is None and self.method != "HEAD" and status not in (204, 304):
            self.chunked = True  # no length given: the body is framed in chunks
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        self.conn.transport.write(b"".join(content))

    def _body(self, body: bytes, more_body: bool) -> None:
        transport = self.conn.transport
        if self.method == "HEAD":
            self.expected_length = 0
        elif self.chunked:
            content = [b"%x\r\n" % len(body), body, b"\r\n"] if body else []
            if not more_body:
                content.append(b"0\r\n\r\n")
            transport.write(b"".join(content))
        else:
            if len(body) > self.expected_length:
                raise RuntimeError("response content longer than its Content-Length")
            self.expected_length -= len(body)
            transport.write(body)
        if not more_body:
            if self.expected_length != 0:
                raise RuntimeError("response content shorter than its Content-Length")
            self._complete()
