"""The memory manager: defragmentation triggers, quotas and the figures of the arena.

One per runtime (``Runtime.memory``). It owns the arena: its
:class:`~sordino.memory.owner.ArenaOwner` (:attr:`MemoryManager.owner`) creates it when
the first worker process needs it, and the executor is handed that owner to stage
batches in (``ChainExecutor(arena=...)``). The manager

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
  resize closes the arena's gate (no new batch starts), waits for a quiet moment (every
  block parked), replaces the segment and opens the gate; workers map the new segment
  with their next batch. Each resize is an event of kind ``memory``, subject
  ``resize``, with ``bytes_before``, ``bytes_after``, ``bytes_copied``, ``pause_s``
  and ``reason``;
- keeps the tenants' quotas and the node pools (:class:`~sordino.memory.quotas.QuotaLedger`);
- reports everything as one :class:`~sordino.records.MemoryStatistics`.

The work is done by its parts: ``defrag.py`` (runs and compaction steps),
``resizing.py`` (resizes and pre-warming), ``demand.py`` (what requests cost, the
forecast peak); the manager starts and stops them and answers for them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from sordino.clock import Clock
from sordino.config.memory import MemoryConfig
from sordino.events import EventSink
from sordino.inference import ModelKey
from sordino.memory.arena import Arena
from sordino.memory.defrag import DEFRAG_STEP_BYTES, Defragmentation, strategy_of
from sordino.memory.demand import RequestCosts
from sordino.memory.owner import ArenaOwner
from sordino.memory.quotas import QuotaLedger
from sordino.memory.resizing import Resizing
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

__all__ = ["ExecutorMemory", "MemoryManager"]


class ExecutorMemory(Protocol):
    """What the executor tells the manager about memory outside the arena."""

    def worker_memory(self) -> tuple[WorkerMemory, ...]:
        """Framework memory (RSS) per worker process."""
        ...

    def node_memory(self) -> tuple[NodeMemoryStatistics, ...]:
        """The Ray nodes' pools (none without Ray)."""
        ...


class _NoExecutor:
    def worker_memory(self) -> tuple[WorkerMemory, ...]:
        return ()

    def node_memory(self) -> tuple[NodeMemoryStatistics, ...]:
        return ()


class MemoryManager:
    """Owns the shared-memory arena; defragments, resizes, enforces quotas, reports."""

    def __init__(
        self,
        config: MemoryConfig,
        *,
        clock: Clock,
        events: EventSink,
        capacity: int = 0,
        registry: Path | None = None,
        arena: Arena | None = None,
        forecast: Callable[[], Forecast | None] = lambda: None,
        plans: Callable[[], tuple[StepPlanStatistics, ...]] = tuple,
        pools: Mapping[str, tuple[str, int]] | None = None,
        step_bytes: int = DEFRAG_STEP_BYTES,
    ) -> None:
        """The arena gets ``capacity`` bytes (``workers.shared_memory``; ``memory.pool_size``
        overrides it) and its segment is recorded in ``registry``; ``arena``: one that
        already exists (tests), owned from now on. ``forecast`` is the QPS forecast;
        ``plans`` reports step plans; ``pools`` maps a model to its node's name and
        ``memory_pool`` (``nodes[].runtime``); ``step_bytes`` bounds one step of a
        defragmentation run. The executor's figures come with :meth:`watch`."""
        self.config = config
        self.owner = ArenaOwner(capacity, registry=registry, memory=config, arena=arena)
        """The arena's one owner: staging writes into it, this manager drives it."""
        self._plans = plans
        self._executor: ExecutorMemory = _NoExecutor()
        owner = self.owner
        self.costs = RequestCosts(forecast)
        """What requests cost the arena (``learn``), and the peak forecast from it."""
        self.defrag = Defragmentation(
            lambda: self.config,
            arena=owner.existing,
            clock=clock,
            events=events,
            step_bytes=step_bytes,
        )
        """Defragmentation runs and incremental compaction."""
        self.resizing = Resizing(
            lambda: self.config,
            arena=owner.existing,
            clock=clock,
            events=events,
            pause=owner.paused,
            capacity=owner.capacity,
            costs=self.costs,
        )
        """Resizes of the arena and ``pool_size: auto`` pre-warming."""
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

    def watch(self, executor: ExecutorMemory) -> None:
        """Report ``executor``'s worker and Ray node memory with the arena's figures."""
        self._executor = executor

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Start pre-warming (``pool_size: auto``) and the timer that runs the interval
        and threshold triggers (if any is set)."""
        self.resizing.start()
        self.defrag.start()

    async def stop(self) -> None:
        tasks = (*self.defrag.tasks(), *self.resizing.tasks())
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
        self.defrag.forget_tasks()
        self.resizing.forget_tasks()

    def close(self) -> None:
        """Remove the arena (after the worker processes that map it have stopped)."""
        self.owner.close()

    async def retune(self, config: MemoryConfig) -> None:
        """Take new defragmentation triggers live (hot reconfiguration); the timer restarts.

        Only the trigger keys (interval, threshold, window) may differ from the running
        configuration; a defragmentation run in progress finishes first. Pre-warming
        (``pool_size: auto``) goes on as it was: it reads the configuration each turn.
        """
        self.config = config
        await self.defrag.stop_triggers()
        self.defrag.start()

    # -- defragmentation (``defrag.py``) -----------------------------------------------

    async def defragment(self, reason: str = "manual") -> DefragReport:
        """Defragment the arena now, in bounded steps; emit and return the report
        (:meth:`Defragmentation.defragment <sordino.memory.defrag.Defragmentation.defragment>`)."""
        return await self.defrag.defragment(reason)

    def trigger_defrag(self, reason: str = "trigger") -> asyncio.Task[DefragReport]:
        """Start a defragmentation soon (from the event loop's thread); return its task."""
        return self.defrag.trigger_defrag(reason)

    def batch_done(self, done: BatchDone) -> None:
        """A batch boundary: one step of incremental compaction (``memory.compact_step``)."""
        self.defrag.batch_done(done)

    def request_done(self, done: RequestDone) -> None:
        """Requests are learned through :meth:`learn`, not here."""

    def queue_changed(self, model: ModelKey, depth: int) -> None:
        """Queues say nothing about the arena."""

    def compaction(self) -> CompactionStatistics:
        return self.defrag.compaction()

    # -- resizing (``resizing.py``) ----------------------------------------------------

    async def resize(self, capacity: int, reason: str = "manual") -> ResizeReport | None:
        """Replace the arena's segment by one of ``capacity`` bytes; emit and return the
        report (:meth:`Resizing.resize <sordino.memory.resizing.Resizing.resize>`)."""
        return await self.resizing.resize(capacity, reason)

    def target(self) -> int | None:
        """pool_size auto's target; None unless auto."""
        return self.resizing.target()

    async def prewarm(self) -> ResizeReport | None:
        """One pool_size auto step: grow to the target, or shrink when it is half or less."""
        return await self.resizing.prewarm()

    def pool(self) -> PoolStatistics:
        return self.resizing.pool()

    # -- learning what requests cost (``demand.py``) -------------------------------------

    def learn(self, model: str, rows: int, nbytes: int, seconds: float) -> None:
        """Note one finished request: its staged bytes and how long it held them."""
        self.costs.learn(model, rows, nbytes, seconds)

    def forecasts(self) -> tuple[MemoryForecast, ...]:
        """Per model: bytes per request learned, and the peak the QPS forecast implies."""
        return self.costs.forecasts()

    # -- figures ---------------------------------------------------------------------

    def statistics(self) -> MemoryStatistics:
        arena = self.owner.existing()
        tiers: tuple[TierStatistics, ...] = ()
        if arena is not None:
            tiers_of = getattr(arena.allocator, "tiers", None)
            if tiers_of is not None:
                tiers = tuple(tiers_of())
        overflow = self.owner.overflow
        return MemoryStatistics(
            strategy=arena.strategy if arena is not None else strategy_of(self.config),
            arena=arena.statistics() if arena is not None else None,
            tiers=tiers,
            owners=self.quotas.statistics(),
            pools=self.pools.statistics(limited_only=True),
            defrag_runs=self.defrag.runs,
            defrag_bytes_moved=self.defrag.bytes_moved,
            defrag_pause_s=self.defrag.pause_s,
            last_defrag=self.defrag.last,
            overflow_shrinks=overflow.shrinks,
            overflow_waits=overflow.waits,
            overflow_rejections=overflow.rejections,
            oversized_rejections=overflow.oversized,
            forecasts=self.costs.forecasts(),
            pool=self.resizing.pool(),
            workers=self._executor.worker_memory(),
            plans=self._plans(),
            nodes=self._executor.node_memory(),
            compaction=self.defrag.compaction(),
        )
