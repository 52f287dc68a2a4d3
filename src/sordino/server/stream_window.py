"""A credit window of one forwarded ``ModelStreamInfer`` (``server.frontends`` > 1).

Both ends of the engine link bound what crosses for a stream by ``STREAM_CREDIT``
(``link_tensors.STREAM_WINDOW``): the engine's responses beyond those the front end has
handed to gRPC (``grpc_link.StreamContext``), and the front end's messages beyond those
the engine's servicer has read (``frontend_link.FrontendLink.stream_room``).
"""

from __future__ import annotations

import asyncio

__all__ = ["StreamWindow"]


class StreamWindow:
    """How many more of a stream's messages may cross the link before the other end
    grants more."""

    __slots__ = ("_open", "left")

    def __init__(self, size: int) -> None:
        self.left = size
        self._open: asyncio.Event | None = None  # made when a sender first waits

    async def take(self) -> None:
        """Wait for room for one, and take it (a cancel ends the wait)."""
        while self.left <= 0:
            if self._open is None:
                self._open = asyncio.Event()
            self._open.clear()
            await self._open.wait()
        self.left -= 1

    def grant(self, count: int) -> None:
        """The other end took ``count``: as many more may cross."""
        self.left += count
        if self._open is not None:
            self._open.set()
