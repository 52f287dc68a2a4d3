"""The one owner of the shared-memory arena: it makes it, gates it, counts and closes it.

:class:`ArenaOwner` belongs to the memory manager (``MemoryManager.owner``), which
drives it (defragmentation, resizes, figures). Everyone else gets what they need from
it through a narrow interface:

- the executor's staging writes batches into :attr:`ArenaOwner.arena` (created on first
  use: the first worker process needs its name), waits at :meth:`ArenaOwner.gate`
  while the arena is resized, and counts its waits and refusals in
  :attr:`ArenaOwner.overflow`;
- the scheduler reads how much fits through the executor's ``memory_fit`` (the figures
  here) and counts its shrunk batches and oversized requests in the same
  :class:`OverflowCounters`;
- the scheduler parks what it queues (``scheduling/parking.py``): parking is a state of
  a :class:`~sordino.memory.refs.Tensors`, which the arena reads when it moves blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sordino.config.memory import MemoryConfig
from sordino.inference import Tensor
from sordino.memory.arena import Arena
from sordino.memory.refs import Tensors
from sordino.memory.segments import shm_free_bytes
from sordino.memory.strategies import allocator_factory
from sordino.records import ArenaStatistics

__all__ = ["ArenaOwner", "OverflowCounters"]

log = logging.getLogger("sordino.memory")


@dataclass(slots=True)
class OverflowCounters:
    """What overflow protection did: batches shrunk, waits, 503s, oversized requests.

    Staging counts ``waits`` and ``rejections``; the scheduler ``shrinks`` and
    ``oversized`` (through ``MemoryFit.counters``)."""

    shrinks: int = 0
    waits: int = 0
    rejections: int = 0
    oversized: int = 0


class ArenaOwner:
    """Holds the server's one shared-memory arena, created when first needed.

    ``capacity`` is the arena's size in bytes (``workers.shared_memory``, or
    ``memory.pool_size``); when ``/dev/shm`` has less free, the arena takes half of
    what is free. With ``registry`` (``<server.data_dir>/shm``) the segment is recorded
    there, so that a server started after a hard crash removes it
    (:func:`~sordino.memory.segments.remove_stale_segments`). ``arena``: one that
    already exists (tests), held as if this owner had made it.
    """

    def __init__(
        self,
        capacity: int,
        *,
        registry: Path | None = None,
        memory: MemoryConfig | None = None,
        arena: Arena | None = None,
    ) -> None:
        self._memory = memory or MemoryConfig()
        self._capacity = self._memory.initial_pool(capacity)
        self._registry = registry
        self._arena = arena
        self._gate: asyncio.Event | None = None
        self.gate_closed = False
        """Whether new batches are held back now (a resize is under way): wait at
        :meth:`gate` then."""
        self.overflow = OverflowCounters()
        """Overflow protection's counts (staging's and the scheduler's)."""

    @property
    def memory(self) -> MemoryConfig:
        """The ``memory`` section the arena was configured with."""
        return self._memory

    @property
    def protected(self) -> bool:
        """Whether overflow protection shrinks batches to the space free now.

        Without it a batch is only kept within the arena's size; the wait for space
        is bounded (``memory.overflow_wait``) either way.
        """
        return self._memory.enabled and self._memory.overflow_protection

    def capacity(self) -> int:
        """The arena's size in bytes (what it will be, before it exists)."""
        return self._arena.capacity if self._arena is not None else self._capacity

    def plan_capacity(self, capacity: int) -> None:
        """The size the arena gets when it is created (a reconfiguration before then)."""
        if self._arena is None:
            self._capacity = capacity

    def existing(self) -> Arena | None:
        """The arena if something already needed it; None before (nothing is created)."""
        return self._arena

    @property
    def arena(self) -> Arena:
        """The arena, created on first use (the first worker process needs its name)."""
        if self._arena is None:
            size = self._capacity
            free = shm_free_bytes()
            if free is not None and free < size:
                log.warning(
                    "/dev/shm has %d bytes free, less than workers.shared_memory (%d); using %d",
                    free,
                    size,
                    free // 2,
                )
                size = max(4096, free // 2)
            memory = self._memory
            strategy = memory.strategy if memory.enabled else "best_fit"
            self._arena = Arena(
                size,
                registry=self._registry,
                allocator=allocator_factory(
                    strategy, small_max=memory.small_max, medium_max=memory.medium_max
                ),
                zero_on_free=memory.zeroes_on_free,
                strategy=strategy,
            )
        return self._arena

    # -- the resize gate ---------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """Hold new batches back while entered (the memory manager resizes the arena)."""
        gate = asyncio.Event()
        self._gate, self.gate_closed = gate, True
        try:
            yield
        finally:
            self._gate, self.gate_closed = None, False
            gate.set()

    async def gate(self, parts: Sequence[Mapping[str, Tensor]]) -> None:
        """Wait while the arena is resized, ``parts`` parked meanwhile (they may move)."""
        parked = [p for p in parts if isinstance(p, Tensors) and not p.parked and not p.released]
        for part in parked:
            part.park()
        try:
            while self._gate is not None:
                await self._gate.wait()
        finally:
            for part in parked:
                part.unpark()

    # -- figures and the end -----------------------------------------------------------

    def statistics(self) -> ArenaStatistics | None:
        """The arena's figures, or None before anything needed it."""
        return self._arena.statistics() if self._arena is not None else None

    def close(self) -> None:
        """Remove the arena (its segment); later calls do nothing."""
        if self._arena is not None:
            self._arena.close()
