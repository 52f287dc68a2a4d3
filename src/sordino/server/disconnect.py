"""Noticing that an HTTP client went away, so its queued request can be cancelled.

uvicorn does not cancel a request handler when the client disconnects; it reports
``http.disconnect`` on the ASGI ``receive`` channel. :func:`until_disconnect` runs the
work and a listener on that channel side by side; if the client leaves first, the work
is cancelled, which makes the scheduler remove its queued request and count it as
cancelled. :class:`EventStream` does the same for a Server-Sent Events response.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sordino.errors import Cancelled

__all__ = ["EventStream", "until_disconnect"]

T = TypeVar("T")


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Return ``work``'s result; cancel it and raise Cancelled if the client disconnects.

    Call it after the request body has been read: the receive channel then carries
    nothing but the disconnect.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    if task.cancelled():
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise Cancelled("the client disconnected before the response was ready")
    return task.result()


class EventStream(Response):
    """A ``text/event-stream`` response whose producer is cancelled when the client leaves."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes]) -> None:
        # Not Response.__init__: that renders a body and would announce its Content-Length.
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache"})
        self._events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def produce() -> None:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for event in self._events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        producer = asyncio.ensure_future(produce())
        watcher = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({producer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (producer, watcher):
                task.cancel()
            await asyncio.gather(producer, watcher, return_exceptions=True)
        error = None if producer.cancelled() else producer.exception()
        if error is not None:
            raise error
