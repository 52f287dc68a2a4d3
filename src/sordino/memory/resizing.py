"""Resizing the arena: ``pool_size: auto`` pre-warming ahead of a predicted peak, and
resizes on demand.

:class:`Resizing` works out a target from the forecast's implied peak and the peak seen
lately (times ``prewarm_headroom``, within ``pool_min``..``pool_max``), grows the arena
ahead of a predicted peak and shrinks it to half or less after. A resize closes
the arena's gate (no new batch starts), waits for a quiet moment (every block parked),
replaces the segment and opens the gate. Each resize is an event of kind ``memory``,
subject ``resize``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from sordino.clock import Clock
from sordino.config.memory import MemoryConfig
from sordino.errors import OutOfMemory
from sordino.events import EventSink
from sordino.memory.arena import Arena
from sordino.memory.demand import RequestCosts
from sordino.memory.segments import shm_free_bytes
from sordino.records import PoolStatistics, ResizeReport

__all__ = ["Resizing", "shm_room"]

log = logging.getLogger("sordino.memory")

QUIET_WAIT_S = 5.0
"""The longest a resize holds new batches back waiting for a quiet moment."""
QUIET_POLL_S = 0.002
PEAK_WINDOW = 10
"""pool_size auto: the peak seen lately is the largest of the last this many intervals."""
GRANULE = 1 << 20
"""pool_size auto rounds its target up to whole MiB."""


def shm_room(arena: Arena) -> int | None:
    """The largest arena /dev/shm can hold instead of ``arena`` (its pages come back
    when it is replaced); None where /dev/shm cannot be read."""
    free = shm_free_bytes()
    return None if free is None else free + arena.capacity


class Resizing:
    """Replaces the arena's segment by a larger or smaller one; pre-warms with ``auto``."""

    def __init__(
        self,
        config: Callable[[], MemoryConfig],
        *,
        arena: Callable[[], Arena | None],
        clock: Clock,
        events: EventSink,
        pause: Callable[[], AbstractAsyncContextManager[None]],
        capacity: Callable[[], int],
        costs: RequestCosts,
    ) -> None:
        """``config`` is the memory manager's configuration now; ``pause`` holds new
        batches back while it is entered (the arena's gate, ``ArenaOwner.paused``);
        ``capacity`` is the arena's size before it exists; ``costs`` what requests were
        learned to cost (the forecast peak)."""
        self._config = config
        self._arena = arena
        self._clock = clock
        self._events = events
        self._pause = pause
        self._capacity = capacity
        self._costs = costs
        self._resizes = self._deferred = 0
        self._last_resize: ResizeReport | None = None
        self._resize_lock = asyncio.Lock()
        self._prewarm: asyncio.Task[None] | None = None
        self._recent_peaks: deque[int] = deque(maxlen=PEAK_WINDOW)
        self._seen_peak = 0

    def start(self) -> None:
        """Start pre-warming every ``prewarm_interval`` (``pool_size: auto`` only); one
        loop at a time, so starting again while it runs changes nothing."""
        if self._prewarm is not None and not self._prewarm.done():
            return
        if self._config().auto_pool:
            self._prewarm = asyncio.get_running_loop().create_task(
                self._prewarm_loop(), name="sordino-memory-prewarm"
            )

    def tasks(self) -> tuple[asyncio.Task[None] | None, ...]:
        """Every task this part runs now (the memory manager stops them)."""
        return (self._prewarm,)

    def forget_tasks(self) -> None:
        """After the memory manager stopped :meth:`tasks`."""
        self._prewarm = None

    async def resize(self, capacity: int, reason: str = "manual") -> ResizeReport | None:
        """Replace the arena's segment by one of ``capacity`` bytes; emit and return the report.

        New batches are held back (the arena's gate) until every block is parked, at
        most ``QUIET_WAIT_S``; the pause is the whole time they were held. None when
        there is no arena yet, the size is already ``capacity``, no quiet moment came
        (counted as deferred) or the live blocks do not fit ``capacity`` (logged).
        """
        arena = self._arena()
        if arena is None or capacity // 4096 * 4096 == arena.capacity:
            return None
        room = shm_room(arena)
        if room is not None and capacity > room:
            log.warning(
                "the arena was not resized to %d bytes: /dev/shm has room for %d", capacity, room
            )
            return None
        async with self._resize_lock:
            before = arena.capacity
            started = time.perf_counter()
            report: ResizeReport | None = None
            async with self._pause():
                deadline = started + QUIET_WAIT_S
                # Quiet is a property of every lease at once (no single event says it):
                # polled, while the gate keeps new batches from starting.
                while not arena.quiet() and time.perf_counter() < deadline:  # noqa: ASYNC110
                    await asyncio.sleep(QUIET_POLL_S)
                try:
                    report = arena.resize(capacity, reason)
                except (OutOfMemory, OSError) as exc:
                    log.warning("the arena was not resized to %d bytes: %s", capacity, exc)
                    return None
            pause = time.perf_counter() - started
            if report is None:
                self._deferred += 1
                log.info("arena resize to %d bytes deferred: no quiet moment", capacity)
                return None
        report = ResizeReport(
            report.bytes_before,
            report.bytes_after,
            report.bytes_copied,
            report.blocks_copied,
            pause,
            reason,
        )
        self._resizes += 1
        self._last_resize = report
        self._recent_peaks.clear()
        self._seen_peak = 0
        self._events.emit(
            "memory",
            "resize",
            f"arena {before} -> {report.bytes_after} bytes ({reason})",
            bytes_before=before,
            bytes_after=report.bytes_after,
            bytes_copied=report.bytes_copied,
            pause_s=pause,
            reason=reason,
        )
        return report

    def _observe(self) -> None:
        """Note the arena's peak in use since the last look (for pool_size auto)."""
        arena = self._arena()
        if arena is None:
            return
        stats = arena.statistics()
        seen = stats.in_use_bytes
        if stats.peak_bytes > self._seen_peak:  # a new high since the last look
            seen = stats.peak_bytes
            self._seen_peak = stats.peak_bytes
        self._recent_peaks.append(seen)

    def target(self) -> int | None:
        """pool_size auto's target: headroom x max(predicted peak, recent peak), bounded
        (``pool_min`` when nothing is predicted or used); None unless auto."""
        config = self._config()
        if not config.auto_pool:
            return None
        basis = max(self._costs.predicted_peak() or 0.0, float(max(self._recent_peaks, default=0)))
        wanted = math.ceil(basis * config.prewarm_headroom / GRANULE) * GRANULE
        return min(max(wanted, config.pool_min), config.pool_max)

    async def prewarm(self) -> ResizeReport | None:
        """One pool_size auto step: grow to the target, or shrink when it is half or less."""
        self._observe()
        arena = self._arena()
        target = self.target()
        if arena is None or target is None:
            return None
        if target > arena.capacity:
            return await self.resize(target, "grow")
        if target * 2 <= arena.capacity:
            return await self.resize(target, "shrink")
        return None

    async def _prewarm_loop(self) -> None:
        while True:
            await self._clock.sleep(self._config().prewarm_interval)
            try:
                await self.prewarm()
            except Exception:
                log.exception("pre-warming the arena failed")

    def pool(self) -> PoolStatistics:
        config = self._config()
        arena = self._arena()
        auto = config.auto_pool
        return PoolStatistics(
            auto=auto,
            capacity_bytes=arena.capacity if arena is not None else self._capacity(),
            min_bytes=config.pool_min if auto else None,
            max_bytes=config.pool_max if auto else None,
            target_bytes=self.target(),
            predicted_peak_bytes=self._costs.predicted_peak(),
            observed_peak_bytes=arena.statistics().peak_bytes if arena is not None else 0,
            resizes=self._resizes,
            deferred=self._deferred,
            last_resize=self._last_resize,
        )
