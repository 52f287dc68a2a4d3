"""Time as a dependency.

Every component that waits, times out, or measures durations takes a :class:`Clock`.
Production code uses :class:`MonotonicClock`; tests use
:class:`sordino.testing.VirtualClock`, so batching delays and deadlines are tested
without sleeping for real.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "MonotonicClock", "TimerHandle"]


class TimerHandle(Protocol):
    """A scheduled callback that can still be cancelled."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Monotonic time in seconds, sleeping, and timers, all on the same time base."""

    def now(self) -> float:
        """Return the current time in seconds on this clock's (arbitrary) time base."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Suspend the calling task for ``seconds`` of this clock's time."""
        ...

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        """Run ``callback`` in the event loop once ``now() >= when``."""
        ...


class MonotonicClock:
    """The real clock: ``time.monotonic`` and the running event loop's timers."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        # The loop's own time base may differ from time.monotonic (uvloop uses libuv's),
        # so convert to a relative delay.
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, when - time.monotonic()), callback)
