"""Keep-alive and flow control of one HTTP connection (``server/http_protocol.py``).

:class:`HttpFlow` is the part of the protocol that decides when a connection reads and
when it goes on to its next request: the idle (keep-alive) timer, reading paused and
resumed, and writing paused by the transport while the client does not read its
answers. A client that does not read is read no further: the answer just written waits
in the transport, the next pipelined request waits unread (``_next_request`` runs once
the client has read enough, from :meth:`HttpFlow.resume_writing`).
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

__all__ = ["HttpFlow"]


class HttpFlow(asyncio.Protocol):
    """Keep-alive and flow control; the protocol supplies the transport, the timeout
    and what to do next (:meth:`_next_request`)."""

    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    keep_alive_s: ClassVar[float]
    keep_alive_task: asyncio.TimerHandle | None
    _idle_at: float | None
    read_paused: bool
    write_paused: bool
    _writable: asyncio.Future[None] | None
    _next_after_drain: bool

    def _next_request(self) -> None:
        raise NotImplementedError

    # The idle timer is armed lazily: going busy only clears ``_idle_at``, and a timer
    # that finds the connection busy (or idle for less than the timeout) re-arms from
    # the time it went idle. One timer a keep-alive period instead of a call_later and a
    # cancel a request (docs/benchmarks.md, "The HTTP transport's cost per request").

    def _idle(self) -> None:
        self._idle_at = self.loop.time()
        if self.keep_alive_task is None:
            self.keep_alive_task = self.loop.call_later(self.keep_alive_s, self._keep_alive_expired)

    def _unset_keep_alive(self) -> None:
        self._idle_at = None

    def _keep_alive_expired(self) -> None:
        self.keep_alive_task = None
        idle_at = self._idle_at
        if idle_at is None or self.transport.is_closing():
            return  # busy: the next idle moment arms it again
        left = idle_at + self.keep_alive_s - self.loop.time()
        if left > 0:
            self.keep_alive_task = self.loop.call_later(left, self._keep_alive_expired)
        else:
            self.transport.close()

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None
        if self._next_after_drain:
            self._next_after_drain = False
            if not self.transport.is_closing():
                self._next_request()

    async def drain(self) -> None:
        """Wait until the transport's write buffer is below its low-water mark."""
        if self.write_paused:
            if self._writable is None:
                self._writable = self.loop.create_future()
            await asyncio.shield(self._writable)
