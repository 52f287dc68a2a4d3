"""Noticing that an HTTP client went away, so its queued request can be cancelled.

uvicorn does not cancel a request handler when the client disconnects; it reports
``http.disconnect`` on the ASGI ``receive`` channel. :func:`until_disconnect` runs the
work and, once it has taken :data:`WATCH_AFTER_S`, a listener on that channel side by
side; if the client leaves first, the work is cancelled, which makes the scheduler
remove its queued request and count it as cancelled. :class:`EventStream` does the
same for a Server-Sent Events response.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sordino.errors import Cancelled

__all__ = ["WATCH_AFTER_S", "EventStream", "client_left", "until_disconnect"]

T = TypeVar("T")


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


WATCH_AFTER_S = 0.05
"""How long a request runs before :func:`until_disconnect` starts listening for the client.

Most requests are answered sooner (a batching delay is 10 ms by default); they never
pay for a listener. A request still running then gets one, so a client that left is
noticed at most this much later than it could have been."""


def client_left() -> Cancelled:
    """The error to raise where the current task's work was cancelled because its client
    left: the task is uncancelled first (that cancel was ours, not its caller's)."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
    return Cancelled("the client disconnected before the response was ready")


async def until_disconnect(
    receive: Receive, work: Awaitable[T], *, watch_after_s: float = WATCH_AFTER_S
) -> T:
    """Return ``work``'s result; if the client disconnects first, cancel it and raise Cancelled.

    Call it after the request body has been read: the receive channel then carries
    nothing but the disconnect. The work runs in the calling task. Once it has run
    ``watch_after_s`` (0: at once) a watcher task listens on the channel; a disconnect
    cancels the calling task, so a queued request is removed by the scheduler and
    counted as cancelled.
    """
    task = asyncio.current_task()
    assert task is not None
    watcher: asyncio.Future[Any] | None = None
    gone = False

    def on_message(future: asyncio.Future[Any]) -> None:
        nonlocal gone
        if not future.cancelled() and future.exception() is None:
            gone = True
            task.cancel()

    def watch() -> None:
        # A task and a future per request cost more than the whole of some requests
        # (issue 16: ~5 us against ~1.7 us for the timer), so only late ones get them.
        nonlocal watcher
        watcher = asyncio.ensure_future(receive())
        watcher.add_done_callback(on_message)

    timer: asyncio.TimerHandle | None = None
    if watch_after_s > 0:
        timer = asyncio.get_running_loop().call_later(watch_after_s, watch)
    else:
        watch()
    try:
        return await work
    except asyncio.CancelledError:
        if not gone:
            raise
        raise client_left() from None
    finally:
        if timer is not None:
            timer.cancel()
        if watcher is not None:
            watcher.remove_done_callback(on_message)
            watcher.cancel()


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
