"""The memory manager: defragmentation triggers, quotas and the figures of the arena.

One per runtime (``Runtime.memory``). It owns no memory itself: the arena belongs to
the executor's staging, which creates it when the first worker process needs it. The
manager

- defragments the arena (:meth:`MemoryManager.defragment`) on the interval, when
  fragmentation stays above the threshold for ``defrag_window``, on demand (``sordino
  memory defrag``, ``POST /v2/memory/defrag``) and when something calls
  :meth:`MemoryManager.trigger_defrag` (the guardian). A run moves blocks in bounded
  steps on the event loop, which serves requests between them; blocks of running
  batches stay where they are (see :meth:`sordino.memory.arena.Arena.defragment_step`).
  Each run emits an event of kind ``memory``, subject ``defrag``, with ``bytes_moved``,
  ``fragmentation_before``, ``fragmentation_after``, ``pause_s`` (the longest step),
  ``duration_s`` and ``reason``;
- resizes the arena (:meth:`MemoryManager.resize`): with ``pool_size: auto`` every
  ``prewarm_interval`` it works out a target from the forecast's implied peak and the
  peak seen lately (times ``prewarm_headroom``, within ``pool_min``..``pool_max``),
  grows the arena ahead of a predicted peak and shrinks it to half or less after. A
  resize closes staging's gate (no new batch starts), waits for a quiet moment (every
  block parked), replaces the segment and opens the gate; workers map the new segment
  with their next batch. Each resize is an event of kind ``memory``, subject
  ``resize``, with ``bytes_before``, ``bytes_after``, ``bytes_copied``, ``pause_s``
  and ``reason``;
- keeps the tenants' quotas and the node pools (:class:`~sordino.memory.quotas.QuotaLedger`);
- reports everything as one :class:`~sordino.records.MemoryStatistics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager

from sordino.clock import Clock
from sordino.config.memory import MemoryConfig
from sordino.errors import OutOfMemory
from sordino.events import EventSink
from sordino.inference import ModelKey
from sordino.memory.arena import Arena, shm_free_bytes
from sordino.memory.quotas import QuotaLedger
from sordino.memory.refs import Lease
from sordino.records import (
    BatchDone,
    CompactionStatistics,
    DefragReport,
    MemoryForecast,
    MemoryStatistics,
    NodeMemoryStatistics,
    PoolStatistics,
    RequestDone,
    ResizeReport,
    StepPlanStatistics,
    TierStatistics,
    WorkerMemory,
)
from sordino.telemetry.forecast import Forecast

__all__ = ["MemoryManager"]

log = logging.getLogger("sordino.memory")

THRESHOLD_TICK_S = 5.0
"""How often fragmentation is compared with ``memory.defrag_threshold``."""

Overflow = Callable[[], tuple[int, int, int, int]]
"""Returns (shrinks, waits, rejections, oversized) of overflow protection so far."""

DEFRAG_STEP_BYTES = 8 << 20
"""The most bytes one step of a defragmentation run moves (one block may be larger):
about 5 ms of copying on an idle machine, the longest the event loop is held."""
SHARE_FLOOR_S = 0.001
"""Below this a step is short enough that a bare yield lets requests through."""
MAX_ROUNDS = 4
"""A defragmentation run goes over the movable blocks at most this many times."""

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


@contextlib.asynccontextmanager
async def _no_gate() -> AsyncIterator[None]:
    yield


class MemoryManager:
    """Defragments, enforces quotas and reports on the shared-memory arena."""

    def __init__(
        self,
        config: MemoryConfig,
        *,
        arena: Callable[[], Arena | None],
        overflow: Overflow = lambda: (0, 0, 0, 0),
        clock: Clock,
        events: EventSink,
        forecast: Callable[[], Forecast | None] = lambda: None,
        pause: Callable[[], AbstractAsyncContextManager[None]] = _no_gate,
        workers: Callable[[], tuple[WorkerMemory, ...]] = tuple,
        plans: Callable[[], tuple[StepPlanStatistics, ...]] = tuple,
        capacity: Callable[[], int] | None = None,
        nodes: Callable[[], tuple[NodeMemoryStatistics, ...]] = tuple,
        pools: Mapping[str, tuple[str, int]] | None = None,
        step_bytes: int = DEFRAG_STEP_BYTES,
    ) -> None:
        """``pause`` holds new batches back while it is entered (staging's gate);
        ``workers`` and ``plans`` report framework memory and step plans; ``capacity``
        is the arena's size before it exists; ``nodes`` the Ray nodes' pools; ``pools``
        maps a model to its node's name and ``memory_pool`` (``nodes[].runtime``);
        ``step_bytes`` bounds one step of a defragmentation run."""
        self.config = config
        self.step_bytes = step_bytes
        self._pause = pause
        self._workers = workers
        self._plans = plans
        self._nodes = nodes
        self._capacity = capacity or (lambda: config.initial_pool(0))
        self._resizes = self._deferred = 0
        self._last_resize: ResizeReport | None = None
        self._resize_lock = asyncio.Lock()
        self._prewarm: asyncio.Task[None] | None = None
        self._recent_peaks: deque[int] = deque(maxlen=PEAK_WINDOW)
        self._seen_peak = 0
        self._forecast = forecast
        # (model, rows bucket) -> [requests, bytes EWMA]; model -> seconds EWMA
        self._bytes: dict[tuple[str, int], list[float]] = {}
        self._seconds: dict[str, float] = {}
        self._arena = arena
        self._overflow = overflow
        self._clock = clock
        self._events = events
        self.quotas = QuotaLedger(
            {q.tenant: q.max for q in config.quotas} if config.enabled else {},
            wait_s=config.quota_wait,
        )
        named = dict(pools or {})
        self.pools = QuotaLedger(
            {model: size for model, (_, size) in named.items()} if config.enabled else {},
            wait_s=config.quota_wait,
            name=lambda model: (
                f"node {named[model][0]!r} (model {model!r})"
                if model in named
                else f"model {model!r}"
            ),
            setting="the node's memory_pool",
        )
        """The node pools: arena bytes in flight per model, against its node's pool."""
        self._runs = self._bytes_moved = 0
        self._pause_s = 0.0
        self._last: DefragReport | None = None
        self._task: asyncio.Task[None] | None = None
        self._running: asyncio.Task[DefragReport] | None = None
        self._pending: set[asyncio.Task[DefragReport]] = set()
        self._above_since: float | None = None
        # Incremental compaction: [steps, steps that moved, bytes, blocks]; pauses.
        self._steps = [0, 0, 0, 0]
        self._step_pause = self._step_pause_max = 0.0

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Start the timer that runs the interval and threshold triggers (if any is set)."""
        config = self.config
        if config.auto_pool:
            self._prewarm = asyncio.get_running_loop().create_task(
                self._prewarm_loop(), name="sordino-memory-prewarm"
            )
        if not config.enabled or (config.defrag_interval <= 0 and config.defrag_threshold <= 0):
            return
        self._task = asyncio.get_running_loop().create_task(
            self._triggers(), name="sordino-memory-defrag"
        )

    async def stop(self) -> None:
        tasks = (self._task, self._prewarm, self._running, *self._pending)
        for task in tasks:
            if task is not None:
                task.cancel()
        for task in tasks:
            if task is not None:
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                except Exception:  # a failed run was logged where it failed
                    pass
        self._task = self._prewarm = self._running = None
        self._pending.clear()

    async def retune(self, config: MemoryConfig) -> None:
        """Take new defragmentation triggers live (hot reconfiguration); the timer restarts.

        Only the trigger keys (interval, threshold, window) may differ from the running
        configuration; a defragmentation run in progress finishes first.
        """
        self.config = config
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.start()

    async def _triggers(self) -> None:
        interval = self.config.defrag_interval
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
        threshold = self.config.defrag_threshold
        arena = self._arena()
        if threshold <= 0 or arena is None:
            return False
        if arena.statistics().fragmentation <= threshold:
            self._above_since = None
            return False
        if self._above_since is None:
            self._above_since = now
        if now - self._above_since >= self.config.defrag_window:
            self._above_since = None
            return True
        return False

    async def _run_logged(self, reason: str) -> None:
        try:
            await self.defragment(reason)
        except Exception:
            log.exception("defragmentation (%s) failed", reason)

    # -- defragmentation -------------------------------------------------------------

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
        self._runs += 1
        self._bytes_moved += report.bytes_moved
        self._pause_s += report.pause_s
        self._last = report
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

    # -- incremental compaction (a scheduler observer) --------------------------------

    def batch_done(self, done: BatchDone) -> None:
        """A batch boundary: one step of incremental compaction (``memory.compact_step``).

        Only ``fragmentation_aware`` moves anything; the step moves at most
        ``compact_step`` bytes of parked blocks (:meth:`Arena.shift`), so the pause it
        adds between batches stays about a millisecond per MiB.
        """
        budget = self.config.compact_step
        if budget <= 0 or self._strategy() != "fragmentation_aware":
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

    def request_done(self, done: RequestDone) -> None:
        """Requests are learned through :meth:`learn`, not here."""

    def queue_changed(self, model: ModelKey, depth: int) -> None:
        """Queues say nothing about the arena."""

    def compaction(self) -> CompactionStatistics:
        steps, moving, moved, blocks = self._steps
        return CompactionStatistics(
            self.config.compact_step if self._strategy() == "fragmentation_aware" else 0,
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

    # -- resizing (predictive pre-warming) ---------------------------------------------

    async def resize(self, capacity: int, reason: str = "manual") -> ResizeReport | None:
        """Replace the arena's segment by one of ``capacity`` bytes; emit and return the report.

        New batches are held back (staging's gate) until every block is parked, at
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

    def _predicted_peak(self) -> float | None:
        peaks = [f.predicted_peak_bytes for f in self.forecasts()]
        known = [p for p in peaks if p is not None]
        return sum(known) if known else None

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
        config = self.config
        if not config.auto_pool:
            return None
        basis = max(self._predicted_peak() or 0.0, float(max(self._recent_peaks, default=0)))
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
            await self._clock.sleep(self.config.prewarm_interval)
            try:
                await self.prewarm()
            except Exception:
                log.exception("pre-warming the arena failed")

    def pool(self) -> PoolStatistics:
        config = self.config
        arena = self._arena()
        auto = config.auto_pool
        return PoolStatistics(
            auto=auto,
            capacity_bytes=arena.capacity if arena is not None else self._capacity(),
            min_bytes=config.pool_min if auto else None,
            max_bytes=config.pool_max if auto else None,
            target_bytes=self.target(),
            predicted_peak_bytes=self._predicted_peak(),
            observed_peak_bytes=arena.statistics().peak_bytes if arena is not None else 0,
            resizes=self._resizes,
            deferred=self._deferred,
            last_resize=self._last_resize,
        )

    # -- learning what requests cost ---------------------------------------------------

    def learn(self, model: str, rows: int, nbytes: int, seconds: float) -> None:
        """Note one finished request: its staged bytes and how long it held them."""
        bucket = 1 << max(0, rows - 1).bit_length()
        entry = self._bytes.get((model, bucket))
        if entry is None:
            if len(self._bytes) >= 1024:  # bounded: models are loaded, buckets are few
                return
            self._bytes[(model, bucket)] = [1, float(nbytes)]
        else:
            entry[0] += 1
            entry[1] += (nbytes - entry[1]) * 0.05
        previous = self._seconds.get(model)
        self._seconds[model] = (
            seconds if previous is None else previous + (seconds - previous) * 0.05
        )

    def forecasts(self) -> tuple[MemoryForecast, ...]:
        """Per model: bytes per request learned, and the peak the QPS forecast implies."""
        forecast = self._forecast()
        models: dict[str, list[tuple[int, int, int]]] = {}
        for (model, bucket), (count, nbytes) in sorted(self._bytes.items()):
            models.setdefault(model, []).append((bucket, int(count), int(nbytes)))
        found = []
        for model, buckets in models.items():
            total = sum(count for _, count, _ in buckets)
            per_request = sum(count * nbytes for _, count, nbytes in buckets) / total
            seconds = self._seconds.get(model, 0.0)
            series = forecast.qps.get(model) if forecast is not None else None
            peak = series.peak if series is not None else None
            found.append(
                MemoryForecast(
                    model=model,
                    buckets=tuple(buckets),
                    bytes_per_request=per_request,
                    seconds_per_request=seconds,
                    forecast_peak_qps=peak,
                    predicted_peak_bytes=peak * per_request * seconds if peak is not None else None,
                )
            )
        return tuple(found)

    # -- figures ---------------------------------------------------------------------

    def statistics(self) -> MemoryStatistics:
        arena = self._arena()
        tiers: tuple[TierStatistics, ...] = ()
        if arena is not None:
            tiers_of = getattr(arena.allocator, "tiers", None)
            if tiers_of is not None:
                tiers = tuple(tiers_of())
        shrinks, waits, rejections, oversized = self._overflow()
        return MemoryStatistics(
            strategy=arena.strategy if arena is not None else self._strategy(),
            arena=arena.statistics() if arena is not None else None,
            tiers=tiers,
            owners=self.quotas.statistics(),
            pools=self.pools.statistics(limited_only=True),
            defrag_runs=self._runs,
            defrag_bytes_moved=self._bytes_moved,
            defrag_pause_s=self._pause_s,
            last_defrag=self._last,
            overflow_shrinks=shrinks,
            overflow_waits=waits,
            overflow_rejections=rejections,
            oversized_rejections=oversized,
            forecasts=self.forecasts(),
            pool=self.pool(),
            workers=self._workers(),
            plans=self._plans(),
            nodes=self._nodes(),
            compaction=self.compaction(),
        )

    def _strategy(self) -> str:
        return self.config.strategy if self.config.enabled else "best_fit"
