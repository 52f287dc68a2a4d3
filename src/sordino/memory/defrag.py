"""Defragmenting the arena: whole runs (on a timer, a threshold, on demand) and the
incremental compaction steps taken at batch boundaries.

:class:`Defragmentation` is the memory manager's part that moves blocks (``manager.py``
holds it and answers for it). A run moves blocks in bounded steps on the event loop,
which serves requests between them; blocks of running batches stay where they are
(see :meth:`sordino.memory.arena.Arena.defragment_step`). Each run emits an event of
kind ``memory``, subject ``defrag``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from sordino.clock import Clock
from sordino.config.memory import MemoryConfig
from sordino.events import EventSink
from sordino.memory.arena import Arena
from sordino.memory.refs import Lease
from sordino.records import BatchDone, CompactionStatistics, DefragReport

__all__ = ["DEFRAG_STEP_BYTES", "Defragmentation", "strategy_of"]

log = logging.getLogger("sordino.memory")

THRESHOLD_TICK_S = 5.0
"""How often fragmentation is compared with ``memory.defrag_threshold``."""

DEFRAG_STEP_BYTES = 8 << 20
"""The most bytes one step of a defragmentation run moves (one block may be larger):
about 5 ms of copying on an idle machine, the longest the event loop is held."""
SHARE_FLOOR_S = 0.001
"""Below this a step is short enough that a bare yield lets requests through."""
MAX_ROUNDS = 4
"""A defragmentation run goes over the movable blocks at most this many times."""


def strategy_of(config: MemoryConfig) -> str:
    """The allocator strategy ``config`` gives the arena (``best_fit`` when memory is off)."""
    return config.strategy if config.enabled else "best_fit"


class Defragmentation:
    """Runs defragmentation (one run at a time) and compaction steps; counts both."""

    def __init__(
        self,
        config: Callable[[], MemoryConfig],
        *,
        arena: Callable[[], Arena | None],
        clock: Clock,
        events: EventSink,
        step_bytes: int = DEFRAG_STEP_BYTES,
    ) -> None:
        """``config`` is the memory manager's configuration now (it may be retuned);
        ``step_bytes`` bounds one step of a defragmentation run."""
        self._config = config
        self.step_bytes = step_bytes
        self._arena = arena
        self._clock = clock
        self._events = events
        self.runs = self.bytes_moved = 0
        self.pause_s = 0.0
        self.last: DefragReport | None = None
        self._task: asyncio.Task[None] | None = None
        self._running: asyncio.Task[DefragReport] | None = None
        self._pending: set[asyncio.Task[DefragReport]] = set()
        self._above_since: float | None = None
        # Incremental compaction: [steps, steps that moved, bytes, blocks]; pauses.
        self._steps = [0, 0, 0, 0]
        self._step_pause = self._step_pause_max = 0.0

    def start(self) -> None:
        """Start the timer that runs the interval and threshold triggers (if any is set)."""
        config = self._config()
        if not config.enabled or (config.defrag_interval <= 0 and config.defrag_threshold <= 0):
            return
        self._task = asyncio.get_running_loop().create_task(
            self._triggers(), name="sordino-memory-defrag"
        )

    def tasks(self) -> tuple[asyncio.Task[DefragReport] | asyncio.Task[None] | None, ...]:
        """Every task this part runs now (the memory manager stops them)."""
        return (self._task, self._running, *self._pending)

    def forget_tasks(self) -> None:
        """After the memory manager stopped :meth:`tasks`."""
        self._task = self._running = None
        self._pending.clear()

    async def stop_triggers(self) -> None:
        """Stop the trigger timer; a defragmentation run in progress finishes first."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _triggers(self) -> None:
        interval = self._config().defrag_interval
        tick = min(interval, THRESHOLD_TICK_S) if interval > 0 else THRESHOLD_TICK_S
        next_run = self._clock.now() + interval if interval > 0 else None
        while True:
            await self._clock.sleep(tick)
            now = self._clock.now()
            if next_run is not None and now >= next_run:
                next_run = now + interval
                await self._run_logged("interval")
                continue
            if self._threshold_crossed(now):
                await self._run_logged("threshold")

    def _threshold_crossed(self, now: float) -> bool:
        """True once fragmentation has stayed above the threshold for the whole window."""
        threshold = self._config().defrag_threshold
        arena = self._arena()
        if threshold <= 0 or arena is None:
            return False
        if arena.statistics().fragmentation <= threshold:
            self._above_since = None
            return False
        if self._above_since is None:
            self._above_since = now
        if now - self._above_since >= self._config().defrag_window:
            self._above_since = None
            return True
        return False

    async def _run_logged(self, reason: str) -> None:
        try:
            await self.defragment(reason)
        except Exception:
            log.exception("defragmentation (%s) failed", reason)

    async def defragment(self, reason: str = "manual") -> DefragReport:
        """Defragment the arena now, in bounded steps; emit and return the report.

        A run moves at most ``step_bytes`` per step (:meth:`Arena.defragment_step`)
        and lets the event loop run between steps, so requests keep being answered
        and batches keep starting (for as long as the step took: at most half the
        time goes to moving); blocks of running batches stay where they are. It
        goes over the movable blocks, highest first, until fragmentation is down to
        what one pass over the whole arena reaches (:meth:`Arena.defragment_goal`),
        or a round over them all moved nothing (at most ``MAX_ROUNDS`` rounds). The
        report's ``pause_s`` is the longest step, ``duration_s`` the whole run.

        Only one run at a time: a call while one is running joins it and gets its
        report (the first caller's ``reason``). Cancelling a caller does not stop the
        run. Before any worker process created the arena there is nothing to move: the
        report says 0 bytes.
        """
        running = self._running
        if running is None or running.done():
            running = asyncio.get_running_loop().create_task(
                self._defragment(reason), name="sordino-memory-defrag-run"
            )
            self._running = running
        return await asyncio.shield(running)

    async def _defragment(self, reason: str) -> DefragReport:
        arena = self._arena()
        if arena is None:
            report = DefragReport(0, 0, 0.0, 0.0, 0.0, reason)
        else:
            report = await self._steps_until_done(arena, reason)
        self.runs += 1
        self.bytes_moved += report.bytes_moved
        self.pause_s += report.pause_s
        self.last = report
        self._events.emit(
            "memory",
            "defrag",
            f"moved {report.bytes_moved} bytes in {report.blocks_moved} blocks ({reason})",
            bytes_moved=report.bytes_moved,
            blocks_moved=report.blocks_moved,
            fragmentation_before=report.fragmentation_before,
            fragmentation_after=report.fragmentation_after,
            pause_s=report.pause_s,
            duration_s=report.duration_s,
            steps=report.steps,
            reason=reason,
        )
        return report

    async def _steps_until_done(self, arena: Arena, reason: str) -> DefragReport:
        started = time.perf_counter()
        before = arena.statistics().fragmentation
        goal, movable, pinned = arena.defragment_goal()
        longest = time.perf_counter() - started
        moved_bytes = moved_blocks = steps = 0
        for _ in range(MAX_ROUNDS):
            visited: set[tuple[Lease, int]] = set()
            moved_in_round = 0
            while arena.statistics().fragmentation > goal:
                step = arena.defragment_step(self.step_bytes, visited)
                if step is None:
                    break
                steps += 1
                moved_bytes += step.bytes_moved
                moved_blocks += step.blocks_moved
                moved_in_round += step.bytes_moved
                longest = max(longest, step.pause_s)
                if arena.statistics().fragmentation <= goal:
                    break
                # The event loop runs as long again before the next step: a request
                # needs several turns of it (read, stage, dispatch, answer), which a
                # bare yield would give one at a time, a step apart. Real time, not the
                # clock's: this shares the loop's thread, it schedules nothing.
                await asyncio.sleep(step.pause_s if step.pause_s >= SHARE_FLOOR_S else 0)
            if moved_in_round == 0 or arena.statistics().fragmentation <= goal:
                break
        return DefragReport(
            moved_bytes,
            moved_blocks,
            before,
            arena.statistics().fragmentation,
            longest,
            reason,
            movable,
            pinned,
            duration_s=time.perf_counter() - started,
            steps=steps,
        )

    # -- incremental compaction -------------------------------------------------------

    def batch_done(self, done: BatchDone) -> None:
        """A batch boundary: one step of incremental compaction (``memory.compact_step``).

        Only ``fragmentation_aware`` moves anything; the step moves at most
        ``compact_step`` bytes of parked blocks (:meth:`Arena.shift`), so the pause it
        adds between batches stays about a millisecond per MiB.
        """
        budget = self._config().compact_step
        if budget <= 0 or strategy_of(self._config()) != "fragmentation_aware":
            return
        arena = self._arena()
        if arena is None:
            return
        step = arena.shift(budget)
        counts = self._steps
        counts[0] += 1
        if step.bytes_moved:
            counts[1] += 1
            counts[2] += step.bytes_moved
            counts[3] += step.blocks_moved
        self._step_pause += step.pause_s
        self._step_pause_max = max(self._step_pause_max, step.pause_s)

    def compaction(self) -> CompactionStatistics:
        steps, moving, moved, blocks = self._steps
        config = self._config()
        return CompactionStatistics(
            config.compact_step if strategy_of(config) == "fragmentation_aware" else 0,
            steps,
            moving,
            moved,
            blocks,
            self._step_pause,
            self._step_pause_max,
        )

    def trigger_defrag(self, reason: str = "trigger") -> asyncio.Task[DefragReport]:
        """Start a defragmentation soon (from the event loop's thread); return its task."""
        task = asyncio.get_running_loop().create_task(self.defragment(reason))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return task
