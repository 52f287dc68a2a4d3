"""The ``simple`` allocator: a bump pointer and exact-size free lists (the baseline).

New blocks are cut from the top of the used region (the bump pointer). A released
block goes on the free list of its exact size and is reused only by a request of
that size (or, when nothing else fits, split by a first fit over the lists); the
top block moves the pointer back down. Neighbours are not merged on release, only
when nothing fits any more (:meth:`compact`). It is what the benchmark compares the
other strategies against: cheap, and it fragments as soon as sizes drift.
"""

from __future__ import annotations

from collections.abc import Iterable

from sordino.errors import OutOfMemory
from sordino.memory.allocator import ALIGNMENT, AllocatorStatistics, Block, Lifetime

__all__ = ["SimpleAllocator"]


def _aligned(nbytes: int) -> int:
    return max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)


class SimpleAllocator:
    """Bump allocation with exact-size free lists over ``capacity`` bytes."""

    def __init__(self, capacity: int) -> None:
        capacity = capacity // ALIGNMENT * ALIGNMENT
        if capacity <= 0:
            raise ValueError(f"an allocator needs at least {ALIGNMENT} bytes")
        self.capacity = capacity
        self._top = 0
        self._lists: dict[int, list[int]] = {}  # size -> offsets of free blocks that size
        self._free_count = 0
        self._free_listed = 0  # bytes on the lists (below the top)
        self._used: dict[int, int] = {}
        self._in_use = self._peak = self._acquired = self._failed = 0

    def acquire_nowait(self, nbytes: int, lifetime: Lifetime = "short") -> Block:
        """Reserve at least ``nbytes``; raise :class:`OutOfMemory` when nothing fits."""
        size = _aligned(nbytes)
        offset = self._take(size)
        if offset is None:
            self.compact()
            offset = self._take(size)
        if offset is None:
            self._failed += 1
            raise OutOfMemory(
                f"shared memory exhausted: {nbytes} bytes asked, {self.capacity - self._in_use} "
                f"free of {self.capacity} (largest free block {self.largest_free()}); raise "
                "memory.pool_size or lower the batch size"
            )
        self._used[offset] = size
        self._in_use += size
        self._peak = max(self._peak, self._in_use)
        self._acquired += 1
        return Block(offset, size)

    def _take(self, size: int) -> int | None:
        exact = self._lists.get(size)
        if exact:
            self._unlist(size)
            return exact.pop()
        if self._top + size <= self.capacity:
            offset = self._top
            self._top += size
            return offset
        for free_size in sorted(self._lists):  # first fit by size, splitting the block
            if free_size > size and self._lists[free_size]:
                offset = self._lists[free_size].pop()
                self._unlist(free_size)
                self._list(offset + size, free_size - size)
                return offset
        return None

    def _list(self, offset: int, size: int) -> None:
        self._lists.setdefault(size, []).append(offset)
        self._free_count += 1
        self._free_listed += size

    def _unlist(self, size: int) -> None:
        self._free_count -= 1
        self._free_listed -= size

    def release(self, block: Block) -> None:
        """Return ``block``: onto its size's free list, or below the bump pointer."""
        size = self._used.pop(block.offset, None)
        if size is None or size != block.size:
            raise ValueError(f"block at offset {block.offset} is not in use")
        self._in_use -= size
        if block.offset + size == self._top:
            self._top = block.offset
        else:
            self._list(block.offset, size)

    def fits(self, nbytes: int, lifetime: Lifetime = "short") -> bool:
        size = _aligned(nbytes)
        return self.largest_free() >= size

    def largest_free(self) -> int:
        listed = max((s for s, offsets in self._lists.items() if offsets), default=0)
        return max(listed, self.capacity - self._top)

    def shift(self, movable: Iterable[Block], budget: int) -> list[tuple[Block, Block]]:
        """Nothing moves: a bump allocator has no place that packs long-lived blocks."""
        return []

    def compact(self) -> None:
        """Merge free neighbours (the lists and the space above the pointer) into one list."""
        free = sorted((offset, size) for size, offsets in self._lists.items() for offset in offsets)
        self._lists.clear()
        self._free_count = self._free_listed = 0
        merged: list[tuple[int, int]] = []
        for offset, size in free:
            if merged and merged[-1][0] + merged[-1][1] == offset:
                merged[-1] = (merged[-1][0], merged[-1][1] + size)
            else:
                merged.append((offset, size))
        if merged and merged[-1][0] + merged[-1][1] == self._top:
            self._top = merged.pop()[0]
        for offset, size in merged:
            self._list(offset, size)

    @property
    def in_use(self) -> int:
        return self._in_use

    def used_blocks(self) -> dict[int, int]:
        return dict(self._used)

    def free_blocks(self) -> dict[int, int]:
        blocks = {offset: size for size, offsets in self._lists.items() for offset in offsets}
        if self._top < self.capacity:
            blocks[self._top] = self.capacity - self._top
        return blocks

    def statistics(self) -> AllocatorStatistics:
        free = self.capacity - self._in_use
        largest = self.largest_free()
        return AllocatorStatistics(
            reserved_bytes=self.capacity,
            in_use_bytes=self._in_use,
            peak_bytes=self._peak,
            free_bytes=free,
            largest_free=largest,
            free_blocks=self._free_count + (self._top < self.capacity),
            used_blocks=len(self._used),
            fragmentation=1.0 - largest / free if free else 0.0,
            acquired=self._acquired,
            failed=self._failed,
        )
