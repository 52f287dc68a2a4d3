"""The ``fragmentation_aware`` allocator: size-class tiers and lifetime classes.

Blocks are sorted by size into tiers — small (up to ``small_max``), medium (up to
``medium_max``) and large — and by expected lifetime into short (a batch's buffers)
and long (a stream's carried state). Small and medium blocks live in *chunks*: runs
of the arena a tier and lifetime own, each with its own best-fit free structure,
so a stream of small tensors cannot scatter holes through the region large batches
need. A chunk that empties goes back to the arena. Large blocks are placed in the
arena itself, short-lived ones from the bottom of a hole and long-lived ones from
its top, so state that outlives many batches does not split the space they reuse.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sordino.errors import OutOfMemory
from sordino.memory.allocator import ALIGNMENT, Allocator, AllocatorStatistics, Block, Lifetime
from sordino.records import TierStatistics

__all__ = ["FragmentationAwareAllocator"]

_LIFETIMES: tuple[Lifetime, ...] = ("short", "long")


def _aligned(nbytes: int) -> int:
    return max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)


@dataclass(eq=False, slots=True)
class _Chunk:
    block: Block
    allocator: Allocator
    pool: _Pool


@dataclass(eq=False, slots=True)
class _Pool:
    """The chunks of one tier and lifetime."""

    tier: str
    lifetime: Lifetime
    chunk_size: int
    chunks: list[_Chunk] = field(default_factory=list)
    current: _Chunk | None = None
    in_use: int = 0
    peak: int = 0


class FragmentationAwareAllocator:
    """Tiers by size and lifetime over ``capacity`` bytes (see the module's doc)."""

    def __init__(
        self,
        capacity: int,
        *,
        small_max: int = 64 * 1024,
        medium_max: int = 4 * 1024 * 1024,
        chunked: tuple[str, ...] = ("small",),
    ) -> None:
        self._arena = Allocator(capacity, long_at_top=True)
        self.capacity = self._arena.capacity
        self.small_max = _aligned(small_max)
        self.medium_max = max(self.small_max, _aligned(medium_max))
        # A chunk holds many blocks of its tier, but is never more than 1/8 of the arena.
        limit = max(ALIGNMENT, self.capacity // 8 // ALIGNMENT * ALIGNMENT)
        small_chunk = min(max(16 * self.small_max, 1 << 20), limit)
        medium_chunk = min(max(4 * self.medium_max, 16 << 20), limit)
        self._pools = {
            (tier, lifetime): _Pool(tier, lifetime, chunk)
            for tier, chunk in (("small", small_chunk), ("medium", medium_chunk))
            if tier in chunked
            for lifetime in _LIFETIMES
        }
        self._owner: dict[int, _Chunk | None] = {}  # block offset -> its chunk (None: large)
        self._used: dict[int, int] = {}
        # Blocks placed in the arena itself (outside chunks), by tier and lifetime.
        self._direct_in_use = {
            (tier, lifetime): 0 for tier in ("small", "medium", "large") for lifetime in _LIFETIMES
        }
        self._direct: dict[int, tuple[str, Lifetime]] = {}
        self._in_use = self._peak = self._acquired = self._failed = 0

    def _tier(self, size: int) -> str:
        if size <= self.small_max:
            return "small"
        return "medium" if size <= self.medium_max else "large"

    def acquire_nowait(self, nbytes: int, lifetime: Lifetime = "short") -> Block:
        """Reserve at least ``nbytes`` in the block's tier; raise OutOfMemory if none fits."""
        size = _aligned(nbytes)
        tier = self._tier(size)
        block: Block | None = None
        chunk: _Chunk | None = None
        pool = self._pools.get((tier, lifetime))
        if pool is not None and size <= pool.chunk_size:
            chunk = self._chunk_for(pool, size)
            if chunk is not None:
                block = chunk.allocator.acquire_nowait(size)
                pool.in_use += size
                pool.peak = max(pool.peak, pool.in_use)
        if block is None:
            chunk = None
            if not self._arena.fits(size):
                self._failed += 1
                raise OutOfMemory(
                    f"shared memory exhausted: {nbytes} bytes asked, "
                    f"{self.capacity - self._in_use} free of {self.capacity} (largest free "
                    f"block {self._arena.largest_free()}); raise memory.pool_size or lower "
                    "the batch size"
                )
            block = self._arena.acquire_nowait(size, lifetime)
            self._direct_in_use[(tier, lifetime)] += size
            self._direct[block.offset] = (tier, lifetime)
        self._owner[block.offset] = chunk
        self._used[block.offset] = size
        self._in_use += size
        self._peak = max(self._peak, self._in_use)
        self._acquired += 1
        return block

    def _chunk_for(self, pool: _Pool, size: int) -> _Chunk | None:
        """A chunk of ``pool`` with room for ``size``: the current one, another, or a new one."""
        current = pool.current
        if current is not None and current.allocator.fits(size):
            return current
        for chunk in pool.chunks:
            if chunk is not current and chunk.allocator.fits(size):
                pool.current = chunk
                return chunk
        if not self._arena.fits(pool.chunk_size):
            return None
        block = self._arena.acquire_nowait(pool.chunk_size, pool.lifetime)
        chunk = _Chunk(block, Allocator(block.size, base=block.offset, long_at_top=True), pool)
        pool.chunks.append(chunk)
        pool.current = chunk
        return chunk

    def release(self, block: Block) -> None:
        """Return ``block``; a chunk left empty (and not its pool's current one) goes back."""
        size = self._used.pop(block.offset, None)
        if size is None or size != block.size:
            raise ValueError(f"block at offset {block.offset} is not in use")
        chunk = self._owner.pop(block.offset)
        self._in_use -= size
        if chunk is None:
            self._arena.release(block)
            self._direct_in_use[self._direct.pop(block.offset)] -= size
            return
        chunk.allocator.release(block)
        pool = chunk.pool
        pool.in_use -= size
        if chunk.allocator.in_use == 0 and chunk is not pool.current:
            self._drop_chunk(pool, chunk)

    def _drop_chunk(self, pool: _Pool, chunk: _Chunk) -> None:
        pool.chunks.remove(chunk)
        if pool.current is chunk:
            pool.current = None
        self._arena.release(chunk.block)

    def fits(self, nbytes: int, lifetime: Lifetime = "short") -> bool:
        size = _aligned(nbytes)
        tier = self._tier(size)
        pool = self._pools.get((tier, lifetime))
        if pool is not None and size <= pool.chunk_size:
            if any(chunk.allocator.fits(size) for chunk in pool.chunks):
                return True
            if self._arena.fits(pool.chunk_size):
                return True
        return self._arena.fits(size)

    def largest_free(self) -> int:
        """The largest free run of the arena outside every chunk."""
        return self._arena.largest_free()

    def compact(self) -> None:
        """Give every empty chunk back to the arena."""
        for pool in self._pools.values():
            for chunk in list(pool.chunks):
                if chunk.allocator.in_use == 0:
                    self._drop_chunk(pool, chunk)

    def shift(self, movable: Iterable[Block], budget: int) -> list[tuple[Block, Block]]:
        """One step of incremental compaction (:meth:`Allocator.shift`) in the arena itself.

        Only blocks placed in the arena directly move (a chunk's small blocks stay);
        the moved blocks keep their tier and lifetime accounting.
        """
        direct = [b for b in movable if b.offset in self._direct]
        moves = self._arena.shift(direct, budget)
        for old, new in moves:
            self._owner[new.offset] = self._owner.pop(old.offset)
            self._used[new.offset] = self._used.pop(old.offset)
            self._direct[new.offset] = self._direct.pop(old.offset)
        return moves

    @property
    def in_use(self) -> int:
        return self._in_use

    def used_blocks(self) -> dict[int, int]:
        return dict(self._used)

    def free_blocks(self) -> dict[int, int]:
        """Every free run: the arena's outside chunks and the holes inside chunks."""
        blocks = self._arena.free_blocks()
        for pool in self._pools.values():
            for chunk in pool.chunks:
                blocks.update(chunk.allocator.free_blocks())
        return blocks

    def statistics(self) -> AllocatorStatistics:
        """Figures for the whole arena; free bytes inside chunks count as free, not largest."""
        free = self.capacity - self._in_use
        largest = self._arena.largest_free()
        return AllocatorStatistics(
            reserved_bytes=self.capacity,
            in_use_bytes=self._in_use,
            peak_bytes=self._peak,
            free_bytes=free,
            largest_free=largest,
            free_blocks=len(self.free_blocks()),
            used_blocks=len(self._used),
            fragmentation=1.0 - largest / free if free else 0.0,
            acquired=self._acquired,
            failed=self._failed,
        )

    def tiers(self) -> list[TierStatistics]:
        """One record per tier and lifetime."""
        records = []
        for pool in self._pools.values():
            reserved = sum(chunk.block.size for chunk in pool.chunks)
            largest = max((c.allocator.largest_free() for c in pool.chunks), default=0)
            free = reserved - pool.in_use
            records.append(
                TierStatistics(
                    tier=pool.tier,
                    lifetime=pool.lifetime,
                    reserved_bytes=reserved,
                    in_use_bytes=pool.in_use,
                    peak_bytes=pool.peak,
                    largest_free=largest,
                    fragmentation=1.0 - largest / free if free else 0.0,
                    chunks=len(pool.chunks),
                )
            )
        for (tier, lifetime), in_use in self._direct_in_use.items():
            if (tier, lifetime) in self._pools:
                continue
            records.append(
                TierStatistics(
                    tier=tier,
                    lifetime=lifetime,
                    reserved_bytes=in_use,
                    in_use_bytes=in_use,
                    peak_bytes=in_use,
                    largest_free=0,
                    fragmentation=0.0,
                    chunks=0,
                )
            )
        return records
