"""One arena region per multi-step request, laid out by the step plan.

A streaming or iterative request runs step after step, and each step's outputs are
read by the next step and by nobody after (see ``planner.py``). Instead of taking a
new arena block for every step's outputs, the request reserves one region of the
arena the first time a step of it is staged, sized by the greedy-by-size plan of its
steps' outputs (:func:`~sordino.memory.planner.plan_greedy_by_size`: step ``k``'s
outputs live from step ``k`` until step ``k + 1`` consumed them, so two steps'
outputs share the region and every later step reuses their bytes), and every step's
output space is taken from that region: at the offset the plan gives it, which a
best-fit allocator over the region finds again as soon as step ``k - 1``'s outputs
were released. Should a step's slot still be held (a response not written yet), that
step's outputs take an ordinary arena block instead (a *fallback*, counted).

The scheduler names the request's region in the batch context it hands the executor
(``BatchContext.region``) when a batch is one step of one multi-step request; staging
reads it (a batch of several requests concatenates
their rows and cannot live in one request's region). The region goes back to the arena
when the request ended and its last step's outputs were released. Its figures — the
planned size, the bytes it really held at most, fallbacks — reach the step planner
with the request's end (:class:`~sordino.records.RequestDone`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from sordino.errors import OutOfMemory
from sordino.memory.allocator import Allocator, Block, Lifetime
from sordino.memory.planner import plan_greedy_by_size

if TYPE_CHECKING:
    from sordino.memory.arena import Arena
    from sordino.memory.refs import Lease

__all__ = ["StepRegion"]


class StepRegion:
    """The arena region of one multi-step request (see the module's doc).

    To a :class:`~sordino.memory.refs.Lease` it stands where an arena does: blocks are
    acquired from it and released to it. Created empty by the scheduler; the region
    itself is reserved by :meth:`lease` on the first step staged.
    """

    def __init__(self, *, carried: bool = True) -> None:
        """``carried``: step ``k``'s outputs feed step ``k + 1`` (a stream's carry); an
        iterative model's sampler instead reads them within step ``k`` and keeps its
        own state, so they live for their step only and the plan overlaps no two."""
        self._carried = carried
        self._arena: Arena | None = None
        self._holder: Lease | None = None
        self._region: Block | None = None
        self._allocator: Allocator | None = None
        self._fallback: set[int] = set()  # offsets of blocks taken from the arena instead
        self._leases: set[Lease] = set()
        self._closed = False
        self.planned_bytes = 0
        """The plan's peak: the region's size (0 until the first step was staged)."""
        self.fallbacks = 0
        """Steps' output blocks that did not fit the region and came from the arena."""
        self.fallback_bytes = 0

    # -- what the scheduler and staging call ------------------------------------------

    def lease(self, arena: Arena, outputs: Sequence[int]) -> Lease | None:
        """A lease for one step's output space; the first call reserves the region.

        ``outputs`` are the bytes of the step's fixed-size outputs; the plan lays out
        two steps of them (every later step repeats the second): two steps' worth
        when they are carried, one step's otherwise. None when the step
        is staged as usual instead: the request already ended, the step has no
        fixed-size outputs, or the arena cannot hold the region now.
        """
        from sordino.memory.refs import Lease

        if self._closed:
            return None
        if self._region is None:
            last = 1 if self._carried else 0
            tensors = [(size, step, step + last) for step in (0, 1) for size in outputs if size]
            _, peak = plan_greedy_by_size(tensors)
            if peak <= 0:
                return None
            holder = Lease(arena)
            try:
                block = holder.acquire_nowait(peak)
            except OutOfMemory:
                holder.release()
                return None
            holder._inner = self  # the arena may move the region (see movable)
            self._arena, self._holder, self._region = arena, holder, block
            self._allocator = Allocator(peak, base=block.offset)
            self.planned_bytes = peak
        return Lease(self)

    def close(self) -> None:
        """The request ended: the region goes back once its last blocks are released."""
        self._closed = True
        self._give_back()

    @property
    def peak_bytes(self) -> int:
        """The most bytes of the region in use at once (what really happened)."""
        return self._allocator.statistics().peak_bytes if self._allocator is not None else 0

    @property
    def reserved(self) -> bool:
        """Whether the region holds arena bytes now."""
        return self._holder is not None

    # -- moving the region (defragmentation, resizing) ---------------------------------

    def movable(self) -> bool:
        """Movable when no step of it runs: every lease of the region parked or empty,
        and no fallback block out (those lie outside the region)."""
        return not self._fallback and all(
            lease._movable() or not lease._blocks for lease in self._leases
        )

    def moved(self, moves: dict[int, int]) -> set[Lease]:
        """Follow the region to its new place; return its leases (see ``refs.Inner``)."""
        region, allocator = self._region, self._allocator
        if region is None or allocator is None or region.offset not in moves:
            return set()
        new = moves[region.offset]
        delta = new - region.offset
        self._region = Block(new, region.size)
        allocator.rebase(new)
        for lease in self._leases:
            lease._blocks = [Block(b.offset + delta, b.size) for b in lease._blocks]
        return set(self._leases)

    # -- what a Lease needs of its arena ----------------------------------------------

    @property
    def buffer(self) -> memoryview:
        assert self._arena is not None
        return self._arena.buffer

    def _track(self, lease: Lease) -> None:
        self._leases.add(lease)

    def _untrack(self, lease: Lease) -> None:
        self._leases.discard(lease)

    def acquire_nowait(self, nbytes: int, lifetime: Lifetime = "short") -> Block:
        """A block of the region at its planned place, or of the arena if it is held."""
        assert self._allocator is not None and self._arena is not None
        if self._allocator.fits(nbytes):
            return self._allocator.acquire_nowait(nbytes)
        block = self._arena.acquire_nowait(nbytes, lifetime)
        self._fallback.add(block.offset)
        self.fallbacks += 1
        self.fallback_bytes += block.size
        return block

    async def acquire(self, nbytes: int) -> Block:
        """As :meth:`acquire_nowait`, waiting for arena space for a fallback."""
        assert self._allocator is not None and self._arena is not None
        if self._allocator.fits(nbytes):
            return self._allocator.acquire_nowait(nbytes)
        block = await self._arena.acquire(nbytes)
        self._fallback.add(block.offset)
        self.fallbacks += 1
        self.fallback_bytes += block.size
        return block

    def release(self, block: Block) -> None:
        assert self._allocator is not None and self._arena is not None
        if block.offset in self._fallback:
            self._fallback.discard(block.offset)
            self._arena.release(block)
            self._give_back()
            return
        self._allocator.release(block)
        if self._arena.zero_on_free:  # as the arena does: nothing left for the next tenant
            np.frombuffer(self._arena.buffer, np.uint8, block.size, block.offset)[:] = 0
        self._give_back()

    def _give_back(self) -> None:
        """Once the request ended and nothing of the region is held, return it."""
        allocator = self._allocator
        if not self._closed or self._holder is None or self._fallback:
            return
        if allocator is not None and allocator.in_use:
            return
        holder, self._holder = self._holder, None
        holder.release()
