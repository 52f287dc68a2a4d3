"""The shared-memory arena: one segment, an allocator over it, and waiting for space.

The server owns the arena; worker processes attach (``segments.attach_segment``) to the same
segment by name and read and write tensors in place. ``acquire`` waits (first come,
first served) until a block fits; ``acquire_nowait`` never blocks and raises
:class:`OutOfMemory` instead. A request larger than the whole arena fails at once.
All calls come from the event loop's thread.

An arena given a ``registry`` folder records its segment there, so that the next
server on the same data dir can remove it after a hard crash (``segments.py``).
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

import numpy as np

from sordino.errors import OutOfMemory
from sordino.memory.allocator import ALIGNMENT, Allocator, Block, Lifetime, Strategy
from sordino.memory.segments import close_segment, create_segment
from sordino.records import ArenaStatistics, CompactionStep, DefragReport, ResizeReport

if TYPE_CHECKING:
    from sordino.memory.refs import Lease

__all__ = ["Arena"]


class Arena:
    """A shared-memory segment of ``capacity`` bytes handed out in aligned blocks.

    ``allocator`` builds the allocator for the capacity (best fit by default; see
    ``memory/strategies.py``). With ``zero_on_free`` every released block is zeroed
    before anyone can receive it again (tenant isolation).
    """

    def __init__(
        self,
        capacity: int,
        *,
        registry: Path | None = None,
        allocator: Callable[[int], Strategy] | None = None,
        zero_on_free: bool = False,
        strategy: str = "best_fit",
    ) -> None:
        """Create the segment; with ``registry``, record it there (see the module's doc)."""
        capacity = max(ALIGNMENT, capacity // ALIGNMENT * ALIGNMENT)
        self._record: IO[str] | None
        self._shm, self._record = create_segment(registry, capacity)
        self._factory: Callable[[int], Strategy] = allocator or Allocator
        self._registry = registry
        self._allocator: Strategy = self._factory(capacity)
        self.strategy = strategy
        self.zero_on_free = zero_on_free
        self._waiters: deque[tuple[int, asyncio.Future[Block]]] = deque()
        self._leases: set[Lease] = set()
        self._closed = False

    @property
    def allocator(self) -> Strategy:
        return self._allocator

    @property
    def name(self) -> str:
        """The segment's name; workers attach to it (``segments.attach_segment``)."""
        return self._shm.name

    @property
    def buffer(self) -> memoryview:
        """The whole segment as bytes."""
        buf = self._shm.buf
        assert buf is not None
        return buf

    @property
    def capacity(self) -> int:
        return self._allocator.capacity

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (the segment is gone)."""
        return self._closed

    def acquire_nowait(self, nbytes: int, lifetime: Lifetime = "short") -> Block:
        """Reserve a block of at least ``nbytes``; raise :class:`OutOfMemory` if none fits now."""
        if self._waiters:  # never overtake someone already waiting
            raise OutOfMemory(f"shared memory is short: {len(self._waiters)} requests wait")
        return self._allocator.acquire_nowait(nbytes, lifetime)

    def fits(self, nbytes: int) -> bool:
        """True when ``nbytes`` could be reserved now without waiting."""
        return not self._waiters and self._allocator.fits(nbytes)

    async def acquire(self, nbytes: int) -> Block:
        """Reserve a block of at least ``nbytes``, waiting until one is released if needed."""
        if nbytes > self.capacity:
            raise OutOfMemory(
                f"{nbytes} bytes cannot fit in the shared-memory arena of {self.capacity} "
                "bytes; raise workers.shared_memory or lower the batch size"
            )
        if not self._waiters and self._allocator.fits(nbytes):
            return self._allocator.acquire_nowait(nbytes)
        future: asyncio.Future[Block] = asyncio.get_running_loop().create_future()
        self._waiters.append((nbytes, future))
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(future.result())
            else:
                self._waiters = deque(w for w in self._waiters if w[1] is not future)
            raise

    def release(self, block: Block) -> None:
        """Return ``block`` to the arena and hand space to waiters in arrival order."""
        self._allocator.release(block)
        if self.zero_on_free and not self._closed:
            np.frombuffer(self.buffer, np.uint8, block.size, block.offset)[:] = 0
        self._serve_waiters()

    def _serve_waiters(self) -> None:
        while self._waiters:
            nbytes, future = self._waiters[0]
            if future.done():
                self._waiters.popleft()
                continue
            if not self._allocator.fits(nbytes):
                break
            self._waiters.popleft()
            future.set_result(self._allocator.acquire_nowait(nbytes))

    # -- leases and defragmentation --------------------------------------------------

    def _track(self, lease: Lease) -> None:
        self._leases.add(lease)

    def _untrack(self, lease: Lease) -> None:
        self._leases.discard(lease)

    def _movable_blocks(self) -> tuple[list[tuple[Lease, int, Block]], int]:
        """Every movable block with its lease and index there; and how many are pinned."""
        movable: list[tuple[Lease, int, Block]] = []
        pinned = 0
        for lease in self._leases:
            blocks = lease._blocks
            if lease._movable():
                movable.extend((lease, index, block) for index, block in enumerate(blocks))
            else:
                pinned += len(blocks)
        return movable, pinned

    def defragment(self, reason: str = "manual") -> DefragReport:
        """Move every movable block so that the free space coalesces; report what moved.

        A block is movable when every holder of its lease is parked (queued work, a
        request's own inputs, carried stream state): nothing reads it until the
        scheduler takes the work out of the queue, and this runs on the event loop's
        thread between batches. Blocks of running batches and of responses being
        written are pinned where they are. Moved contents are copied byte for byte and
        every parked :class:`~sordino.memory.refs.Tensors` is pointed at the new place.
        If the new placement cannot be completed, nothing moves.

        This is one pause for the whole arena (seconds for gigabytes): the memory
        manager defragments in bounded steps instead (:meth:`defragment_step`).
        """
        started = time.perf_counter()
        before = self._allocator.statistics().fragmentation
        movable, pinned = self._movable_blocks()
        moved_bytes, moved_blocks = self._repack(movable) if movable else (0, 0)
        after = self._allocator.statistics().fragmentation
        pause = time.perf_counter() - started
        return DefragReport(
            moved_bytes, moved_blocks, before, after, pause, reason, len(movable), pinned,
            duration_s=pause, steps=1,
        )  # fmt: skip

    def defragment_goal(self) -> tuple[float, int, int]:
        """What :meth:`defragment` would reach now, worked out on a copy of the allocator.

        Returns (fragmentation after, movable blocks, pinned blocks); nothing moves.
        The fragmentation now when the placement could not be completed.
        """
        movable, pinned = self._movable_blocks()
        trial = copy.deepcopy(self._allocator)
        try:
            _place(trial, [block for _, _, block in movable])
        except OutOfMemory:
            return self._allocator.statistics().fragmentation, len(movable), pinned
        return trial.statistics().fragmentation, len(movable), pinned

    def defragment_step(
        self, budget: int, visited: set[tuple[Lease, int]]
    ) -> CompactionStep | None:
        """One bounded step of a defragmentation: re-place at most ``budget`` bytes of blocks.

        Takes the highest movable blocks not in ``visited`` (at least one, even when it
        is larger than ``budget``), adds them to it, and places them again as
        :meth:`defragment` places all of them: movable on the same terms, contents
        copied, parked tensors pointed at the new place, nothing moved if the placement
        cannot be completed. Between two steps the event loop runs (batches start,
        requests are answered); a block that became pinned meanwhile is not taken.
        None when every movable block was visited (the round is over).
        """
        started = time.perf_counter()
        movable, _ = self._movable_blocks()
        movable.sort(key=lambda entry: -entry[2].offset)
        taken: list[tuple[Lease, int, Block]] = []
        size = 0
        for lease, index, block in movable:
            if (lease, index) in visited:
                continue
            if taken and size + block.size > budget:
                break
            visited.add((lease, index))
            taken.append((lease, index, block))
            size += block.size
        if not taken:
            return None
        moved_bytes, moved_blocks = self._repack(taken)
        return CompactionStep(moved_bytes, moved_blocks, time.perf_counter() - started)

    def _repack(self, movable: list[tuple[Lease, int, Block]]) -> tuple[int, int]:
        """Release ``movable`` and place it again packed; copy and repoint what moved.

        Returns (bytes, blocks) moved; (0, 0) and no change when the placement fails.
        """
        buffer = np.frombuffer(self.buffer, np.uint8)
        snapshot = copy.deepcopy(self._allocator)
        try:
            placed = _place(self._allocator, [block for _, _, block in movable])
        except OutOfMemory:
            self._allocator = snapshot
            return 0, 0
        # The placement was bookkeeping only: the bytes are still where they were. Only
        # blocks that changed place are copied: through a copy of their own when
        # another moving block's new place covers their old one (or the old place is
        # zeroed), else straight (numpy copies right between overlapping ranges).
        shifted = [i for i, (_, _, old) in enumerate(movable) if placed[i].offset != old.offset]
        covered = shifted if self.zero_on_free else _covered(movable, placed, shifted)
        saved = {i: buffer[b.offset : b.offset + b.size].copy()
                 for i in covered for b in (movable[i][2],)}  # fmt: skip
        moves: dict[int, int] = {}  # old offset -> new offset
        sizes: dict[int, int] = {}
        moved_bytes = 0
        if self.zero_on_free:  # what stays behind in a vacated range is nobody's to read
            for i in shifted:
                old = movable[i][2]
                buffer[old.offset : old.offset + old.size] = 0
        for i, (lease, index, old) in enumerate(movable):
            new = placed[i]
            if new.offset != old.offset:
                source = saved.get(i)
                if source is None:
                    source = buffer[old.offset : old.offset + old.size]
                buffer[new.offset : new.offset + new.size] = source
                moves[old.offset] = new.offset
                sizes[old.offset] = old.size
                moved_bytes += old.size
            lease._blocks[index] = new
        if moves:
            self._repoint({lease for lease, _, _ in movable}, moves, sizes)
        self._serve_waiters()
        return moved_bytes, len(moves)

    def shift(self, budget: int) -> CompactionStep:
        """One step of incremental compaction: move at most ``budget`` bytes of movable blocks.

        Called at a batch boundary by the memory manager (``memory.compact_step``). The
        allocator picks the moves (:meth:`~sordino.memory.allocator.Allocator.shift`:
        only ``fragmentation_aware`` moves anything); blocks are movable on the same
        terms as for :meth:`defragment` (every holder parked), contents are copied and
        parked tensors pointed at the new place, so the pause is bounded by ``budget``.
        """
        started = time.perf_counter()
        owners: dict[int, tuple[Lease, int]] = {}
        for lease in self._leases:
            if lease._movable():
                for index, block in enumerate(lease._blocks):
                    owners[block.offset] = (lease, index)
        if not owners:
            return CompactionStep(0, 0, time.perf_counter() - started)
        blocks = [lease._blocks[index] for lease, index in owners.values()]
        moves = self._allocator.shift(blocks, budget)
        if not moves:
            return CompactionStep(0, 0, time.perf_counter() - started)
        buffer = np.frombuffer(self.buffer, np.uint8)
        offsets: dict[int, int] = {}
        sizes: dict[int, int] = {}
        moved = 0
        # One move at a time, in the allocator's order: a move's new place was free
        # when it was chosen, so it overlaps at most its own old place (copied first).
        for old, new in moves:
            saved = buffer[old.offset : old.offset + old.size].copy()
            if self.zero_on_free:
                buffer[old.offset : old.offset + old.size] = 0
            buffer[new.offset : new.offset + new.size] = saved
            lease, index = owners.pop(old.offset)
            lease._blocks[index] = new
            owners[new.offset] = (lease, index)
            moved += old.size
            offsets[old.offset] = new.offset  # a block moves at most once per step
            sizes[old.offset] = old.size
        self._repoint({owners[n][0] for n in offsets.values()}, offsets, sizes)
        self._serve_waiters()
        return CompactionStep(moved, len(moves), time.perf_counter() - started)

    def _repoint(self, leases: set[Lease], moves: dict[int, int], sizes: dict[int, int]) -> None:
        """Point every parked tensor of ``leases`` that lies in a moved block at its new place."""
        starts = sorted(moves)
        seen: set[int] = set()
        for lease in list(leases):
            if lease._inner is not None:  # a region: its blocks moved with it
                leases = leases | lease._inner.moved(moves)
        for lease in leases:
            for tensors in lease._parked:
                tensors._relocate(self.buffer, starts, moves, sizes, seen)

    # -- resizing (predictive pre-warming) -------------------------------------------

    def quiet(self) -> bool:
        """True when nothing reads the segment now: no waiter, and every lease parked.

        A running batch, a response being written and a request being decoded each
        hold a lease that is not parked (or an empty one, still filling).
        """
        return not self._waiters and all(lease._movable() for lease in self._leases)

    def resize(self, capacity: int, reason: str = "manual") -> ResizeReport | None:
        """Replace the segment by one of ``capacity`` bytes; None when not quiet now.

        Only at a quiet moment (:meth:`quiet`): every live block belongs to parked
        work, so nobody reads the old segment. A new segment is created, every live
        block copied into it (packed, as defragmentation would), every parked tensor
        pointed at the new segment, and the old one removed. Worker processes map the
        new segment when their next batch names it. Raises :class:`OutOfMemory` when
        the live blocks do not fit ``capacity`` (nothing changes then). The allocator's
        counters (peak, acquired) start again with the new segment.
        """
        started = time.perf_counter()
        capacity = max(ALIGNMENT, capacity // ALIGNMENT * ALIGNMENT)
        if self._closed or not self.quiet():
            return None
        before = self.capacity
        live = [
            (lease, index, block)
            for lease in self._leases
            for index, block in enumerate(lease._blocks)
        ]
        allocator = self._factory(capacity)
        placed: list[Block] = []
        for _, _, block in sorted(live, key=lambda item: -item[2].size):
            placed.append(allocator.acquire_nowait(block.size, "long"))  # OutOfMemory: no change
        by_size = sorted(range(len(live)), key=lambda i: -live[i][2].size)
        new_blocks = {order: placed[n] for n, order in enumerate(by_size)}
        shm, record = create_segment(self._registry, capacity)  # OutOfMemory: no change
        new_buffer = shm.buf
        assert new_buffer is not None
        old_buffer = np.frombuffer(self.buffer, np.uint8)
        target = np.frombuffer(new_buffer, np.uint8)
        moves: dict[int, int] = {}
        sizes: dict[int, int] = {}
        copied = 0
        for i, (lease, index, old) in enumerate(live):
            new = new_blocks[i]
            target[new.offset : new.offset + old.size] = old_buffer[
                old.offset : old.offset + old.size
            ]
            moves[old.offset] = new.offset
            sizes[old.offset] = old.size
            copied += old.size
            lease._blocks[index] = new
        del old_buffer, target
        old_shm, old_record = self._shm, self._record
        self._shm, self._record, self._allocator = shm, record, allocator
        if moves:
            self._repoint(set(self._leases), moves, sizes)
        close_segment(old_shm, old_record)
        return ResizeReport(
            before, self.capacity, copied, len(live), time.perf_counter() - started, reason
        )

    def statistics(self) -> ArenaStatistics:
        return self._allocator.statistics().of_arena(self.name, len(self._waiters))

    def close(self) -> None:
        """Unmap and remove the segment. Views into it must be gone by now."""
        if self._closed:
            return
        self._closed = True
        for _, future in self._waiters:
            if not future.done():
                future.set_exception(OutOfMemory("the shared-memory arena was closed"))
        self._waiters.clear()
        close_segment(self._shm, self._record)
        self._record = None


def _place(allocator: Strategy, blocks: list[Block]) -> list[Block]:
    """Release ``blocks`` and acquire each again (bookkeeping only); their new places.

    Highest first, as long-lived: with long-lived blocks placed at the top, blocks
    already packed there land where they were, and only those below a hole move.
    Raises :class:`OutOfMemory` part way (the caller restores the allocator).
    """
    for block in blocks:
        allocator.release(block)
    allocator.compact()
    placed: dict[int, Block] = {}
    for i in sorted(range(len(blocks)), key=lambda i: -blocks[i].offset):
        placed[i] = allocator.acquire_nowait(blocks[i].size, "long")
    return [placed[i] for i in range(len(blocks))]


def _covered(
    movable: list[tuple[Lease, int, Block]], placed: list[Block], shifted: list[int]
) -> list[int]:
    """The moving blocks (indices) whose old place another moving block's new place overlaps."""
    targets = sorted((placed[i].offset, placed[i].offset + placed[i].size, i) for i in shifted)
    starts = [start for start, _, _ in targets]
    found = []
    for i in shifted:
        old = movable[i][2]
        # New places do not overlap each other: those that overlap the old place are
        # the run of targets starting before its end and ending after its start.
        j = bisect.bisect_left(starts, old.offset + old.size) - 1
        while j >= 0 and targets[j][1] > old.offset:
            if targets[j][2] != i:
                found.append(i)
                break
            j -= 1
    return found
