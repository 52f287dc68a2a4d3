"""A virtual clock for tests: time moves only when the test says so."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

__all__ = ["VirtualClock"]


class _Timer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """A :class:`sordino.clock.Clock` whose time advances only through :meth:`advance`.

    Timers and sleeps fire in time order while the clock advances (one already due
    fires on the next :meth:`advance`, even ``advance(0)``), and the event loop is
    given ``settle_turns`` turns after each one so the woken tasks can react before
    time moves on.
    """

    def __init__(self, start: float = 1000.0, settle_turns: int = 20) -> None:
        self._now = start
        self._timers: list[tuple[float, int, _Timer]] = []
        self._seq = itertools.count()
        self._settle_turns = settle_turns

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(callback)
        heapq.heappush(self._timers, (when, next(self._seq), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        timer = self.call_at(self._now + max(0.0, seconds), wake)
        try:
            await future
        finally:
            timer.cancel()

    async def settle(self) -> None:
        """Let every runnable task run until the loop goes quiet (a bounded number of turns)."""
        for _ in range(self._settle_turns):
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing due timers in order."""
        target = self._now + seconds
        await self.settle()
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, when)
            timer.callback()
            await self.settle()
        self._now = target
        await self.settle()
