"""A best-fit allocator over one contiguous range of bytes, with size-class bins.

Free blocks are kept in bins by size class (powers of two of the alignment unit).
Best fit: the smallest free block that holds the request is found in the request's
own bin (bisecting its size-sorted list) or, failing that, is the smallest block of
the next non-empty bin, since every block of a higher bin is larger. A released block
merges with its free neighbours at once (coalescing), so two adjacent holes never
stay apart. Offsets and sizes are multiples of :data:`ALIGNMENT`.

The allocator only does arithmetic on offsets; :class:`sordino.memory.Arena` puts it
over a shared-memory segment. It is not thread-safe: its owner serialises calls.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from sordino.errors import OutOfMemory
from sordino.records import ArenaStatistics

__all__ = ["ALIGNMENT", "Allocator", "AllocatorStatistics", "Block", "Lifetime", "Strategy"]

Lifetime = Literal["short", "long"]
"""How long a block is expected to live: a batch's buffers (short) or a stream's state (long)."""

ALIGNMENT = 64
"""Every block starts on, and is sized in, multiples of 64 bytes (a cache line)."""


@dataclass(frozen=True, slots=True)
class Block:
    """A reserved range of the arena: ``size`` bytes (aligned) at ``offset``."""

    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class AllocatorStatistics:
    """Bytes reserved, in use and free, and how scattered the free bytes are.

    ``fragmentation`` is ``1 - largest_free / free`` (0 when nothing is free): 0 means
    every free byte is in one block, values near 1 mean the free bytes are scattered
    in holes too small to be useful.
    """

    reserved_bytes: int
    in_use_bytes: int
    peak_bytes: int
    free_bytes: int
    largest_free: int
    free_blocks: int
    used_blocks: int
    fragmentation: float
    acquired: int
    failed: int

    def of_arena(self, name: str, waiting: int) -> ArenaStatistics:
        """These figures as the record of the arena (or node pool) ``name``."""
        return ArenaStatistics(
            name=name,
            reserved_bytes=self.reserved_bytes,
            in_use_bytes=self.in_use_bytes,
            peak_bytes=self.peak_bytes,
            free_bytes=self.free_bytes,
            largest_free=self.largest_free,
            fragmentation=self.fragmentation,
            used_blocks=self.used_blocks,
            acquired=self.acquired,
            failed=self.failed,
            waiting=waiting,
        )


class Strategy(Protocol):
    """What the arena needs of an allocator; ``best_fit``, ``simple`` and ``fragmentation_aware``.

    Offsets and sizes are multiples of :data:`ALIGNMENT`. ``compact`` tidies the free
    structures after a defragmentation released the blocks it is about to place again.
    """

    capacity: int

    def acquire_nowait(self, nbytes: int, lifetime: Lifetime = "short") -> Block: ...

    def release(self, block: Block) -> None: ...

    def fits(self, nbytes: int, lifetime: Lifetime = "short") -> bool: ...

    def largest_free(self) -> int: ...

    def statistics(self) -> AllocatorStatistics: ...

    def compact(self) -> None: ...

    def shift(self, movable: Iterable[Block], budget: int) -> list[tuple[Block, Block]]: ...

    def used_blocks(self) -> dict[int, int]: ...

    def free_blocks(self) -> dict[int, int]: ...


SLIDE_RATIO = 4
"""Incremental compaction slides a block up only into a gap of at least 1/4 its size
(measured on the drift trace: 1/2 leaves 6.1 % fragmentation, 1/4 4.8 %, 1/8 4.5 % for
half again the bytes moved)."""


def _aligned(nbytes: int) -> int:
    return max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)


def _size_class(size: int) -> int:
    return (size // ALIGNMENT).bit_length() - 1


class Allocator:
    """Best-fit allocation with coalescing over ``capacity`` bytes (starting at ``base``).

    Lifetimes are ignored unless ``long_at_top``: then a long-lived block goes to the
    free block at the highest address that holds it, carved from that block's end,
    so long-lived state gathers at the top and short-lived buffers below it.
    """

    def __init__(self, capacity: int, *, base: int = 0, long_at_top: bool = False) -> None:
        capacity = capacity // ALIGNMENT * ALIGNMENT
        if capacity <= 0:
            raise ValueError(f"an allocator needs at least {ALIGNMENT} bytes")
        self.capacity = capacity
        self.base = base
        self.long_at_top = long_at_top
        self._bins: list[list[tuple[int, int]]] = [[] for _ in range(_size_class(capacity) + 1)]
        self._free_at: dict[int, int] = {}  # offset -> size
        self._free_end: dict[int, int] = {}  # end offset -> start offset
        self._used: dict[int, int] = {}  # offset -> size
        self._in_use = self._peak = self._acquired = self._failed = 0
        self._add_free(base, capacity)

    def acquire_nowait(self, nbytes: int, lifetime: Lifetime = "short") -> Block:
        """Reserve at least ``nbytes`` bytes; raise :class:`OutOfMemory` if no free block fits."""
        size = _aligned(nbytes)
        long = lifetime == "long" and self.long_at_top
        found = self._highest_fit(size) if long else self._best_fit(size)
        if found is None:
            self._failed += 1
            raise OutOfMemory(
                f"shared memory exhausted: {nbytes} bytes asked, {self.capacity - self._in_use} "
                f"free of {self.capacity} (largest free block {self.largest_free()}); raise "
                "workers.shared_memory or lower the batch size"
            )
        offset, free_size = found
        self._remove_free(offset, free_size)
        if free_size > size:
            if long:
                self._add_free(offset, free_size - size)
                offset += free_size - size
            else:
                self._add_free(offset + size, free_size - size)
        self._used[offset] = size
        self._in_use += size
        self._peak = max(self._peak, self._in_use)
        self._acquired += 1
        return Block(offset, size)

    def release(self, block: Block) -> None:
        """Return ``block``; it merges with free neighbours. Releasing twice is an error."""
        size = self._used.pop(block.offset, None)
        if size is None or size != block.size:
            raise ValueError(f"block at offset {block.offset} is not in use")
        self._in_use -= size
        offset, end = block.offset, block.offset + size
        before = self._free_end.get(offset)
        if before is not None:
            self._remove_free(before, offset - before)
            offset = before
        after = self._free_at.get(end)
        if after is not None:
            self._remove_free(end, after)
            end += after
        self._add_free(offset, end - offset)

    def fits(self, nbytes: int, lifetime: Lifetime = "short") -> bool:
        """True when a request of ``nbytes`` could be served now."""
        return self._best_fit(_aligned(nbytes)) is not None

    def compact(self) -> None:
        """Nothing to do: free neighbours merge on release."""

    def shift(
        self, movable: Iterable[Block], budget: int, *, tries: int = 32
    ) -> list[tuple[Block, Block]]:
        """One step of incremental compaction: move movable blocks up, at most ``budget`` bytes.

        Only with ``long_at_top`` (long-lived state gathers at the top, so a packed
        layout has one place for it); otherwise nothing moves. The lowest movable
        blocks are taken first, each released and placed again as long-lived: at the
        highest hole that holds it (filling a hole left by state that died), or slid up
        against the block above it. Either way the bytes it leaves are lower than the
        bytes it fills, so the holes among long-lived blocks sink to the large free
        block below them and merge with it. At most ``tries`` blocks are tried; a
        block that would not move stays where it is. Bookkeeping only: returns the
        ``(old, new)`` pairs whose contents the caller copies (a new place may
        overlap the old one).
        """
        moves: list[tuple[Block, Block]] = []
        if not self.long_at_top or budget <= 0 or not self._free_at:
            return moves
        free_at = self._free_at
        # Only a block right below a free block can move up; the lowest go first.
        candidates = sorted((b for b in movable if b.offset + b.size in free_at),
                            key=lambda b: b.offset)  # fmt: skip
        for block in candidates[:tries]:
            if block.size > budget or self._used.get(block.offset) != block.size:
                continue
            above = free_at.get(block.offset + block.size, 0)
            if above * SLIDE_RATIO < block.size and not self._hole_above(block):
                continue  # a slide by a sliver costs the whole block: not worth it
            self.release(block)
            new = self.acquire_nowait(block.size, "long")  # its own place at worst
            self._acquired -= 1  # a move is not an allocation
            if new.offset != block.offset:
                moves.append((block, new))
                budget -= block.size
        return moves

    def rebase(self, base: int) -> None:
        """Every offset moves with the range, which now starts at ``base``."""
        delta = base - self.base
        self.base = base
        self._bins = [[(size, offset + delta) for size, offset in bin_] for bin_ in self._bins]
        self._free_at = {offset + delta: size for offset, size in self._free_at.items()}
        self._free_end = {end + delta: start + delta for end, start in self._free_end.items()}
        self._used = {offset + delta: size for offset, size in self._used.items()}

    @property
    def in_use(self) -> int:
        return self._in_use

    def used_blocks(self) -> dict[int, int]:
        """Offset -> size of every block in use (a copy)."""
        return dict(self._used)

    def free_blocks(self) -> dict[int, int]:
        """Offset -> size of every free block (a copy)."""
        return dict(self._free_at)

    def largest_free(self) -> int:
        for bin_ in reversed(self._bins):
            if bin_:
                return bin_[-1][0]
        return 0

    def statistics(self) -> AllocatorStatistics:
        free = self.capacity - self._in_use
        largest = self.largest_free()
        return AllocatorStatistics(
            reserved_bytes=self.capacity,
            in_use_bytes=self._in_use,
            peak_bytes=self._peak,
            free_bytes=free,
            largest_free=largest,
            free_blocks=len(self._free_at),
            used_blocks=len(self._used),
            fragmentation=1.0 - largest / free if free else 0.0,
            acquired=self._acquired,
            failed=self._failed,
        )

    # -- free lists ------------------------------------------------------------------

    # _size_class(size) is written out in the three free-list methods below: they run
    # several times a request, and the call cost more than the arithmetic.

    def _best_fit(self, size: int) -> tuple[int, int] | None:
        first = (size // ALIGNMENT).bit_length() - 1
        if first >= len(self._bins):
            return None
        bin_ = self._bins[first]
        at = bisect.bisect_left(bin_, (size, -1))
        if at < len(bin_):
            found_size, offset = bin_[at]
            return offset, found_size
        for bin_ in self._bins[first + 1 :]:
            if bin_:
                found_size, offset = bin_[0]
                return offset, found_size
        return None

    def _highest_fit(self, size: int) -> tuple[int, int] | None:
        """The free block at the highest address that holds ``size`` (a scan: rare calls)."""
        best: tuple[int, int] | None = None
        for offset, free_size in self._free_at.items():
            if free_size >= size and (best is None or offset > best[0]):
                best = (offset, free_size)
        return best

    def _hole_above(self, block: Block) -> bool:
        """True when a free block above ``block`` (not right above it) could hold it."""
        end = block.offset + block.size
        return any(offset > end and size >= block.size for offset, size in self._free_at.items())

    def _add_free(self, offset: int, size: int) -> None:
        bisect.insort(self._bins[(size // ALIGNMENT).bit_length() - 1], (size, offset))
        self._free_at[offset] = size
        self._free_end[offset + size] = offset

    def _remove_free(self, offset: int, size: int) -> None:
        bin_ = self._bins[(size // ALIGNMENT).bit_length() - 1]
        del bin_[bisect.bisect_left(bin_, (size, offset))]
        del self._free_at[offset]
        del self._free_end[offset + size]
