"""Placement variants of ``fragmentation_aware`` on the drift trace (what was tried).

Each variant changes one placement rule of the kept allocator and replays the same
drift trace as ``bench_memory`` (100k allocations, 256 MiB, no defragmentation):
fragmentation (``1 - largest free / free``), holes as a share of the arena, and
internal waste (bytes held beyond what was asked, over the bytes in use). The last
rows model an incremental compaction: whenever a long-lived block dies, the lowest
long-lived block that fits (among the K lowest) is moved into the hole it left. The
last table is how fast fragmentation comes back after a full compaction (one every
5,000 allocations, as ``bench_memory``'s defrag rows do it).

    python -m bench.bench_memory_placement [--allocations 100000] [--seed 7]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
from rich.table import Table

from bench.bench_memory import ARENA, Event, MiB, compact, drift_trace, replay
from bench.common import console
from sordino.memory.allocator import Allocator, Block, Lifetime, Strategy
from sordino.memory.tiered import FragmentationAwareAllocator

SMALL_MAX = 64 * 1024


def rounded(nbytes: int, classes: int) -> int:
    """``nbytes`` rounded up to one of ``classes`` size classes per power of two."""
    if nbytes <= SMALL_MAX:
        return nbytes
    step = 1 << max(6, nbytes.bit_length() - 1 - (classes.bit_length() - 1))
    return -(-nbytes // step) * step


class _LongBestFit(Allocator):
    """Long-lived blocks go to the smallest hole that holds them (carved from its top)."""

    def _highest_fit(self, size: int) -> tuple[int, int] | None:
        return self._best_fit(size)


class _LongInLargest(Allocator):
    """Long-lived blocks are always carved from the largest free block, never a hole."""

    def _highest_fit(self, size: int) -> tuple[int, int] | None:
        fits = [(s, o) for o, s in self._free_at.items() if s >= size]
        return (max(fits)[1], max(fits)[0]) if fits else None


class _ShortLowest(Allocator):
    """Short-lived blocks at the lowest address that holds them (away from the top)."""

    _short = False

    def acquire_nowait(self, nbytes: int, lifetime: Lifetime = "short") -> Block:
        self._short = lifetime != "long"
        try:
            return super().acquire_nowait(nbytes, lifetime)
        finally:
            self._short = False

    def _best_fit(self, size: int) -> tuple[int, int] | None:
        if not self._short:
            return super()._best_fit(size)
        fits = [(o, s) for o, s in self._free_at.items() if s >= size]
        return min(fits) if fits else None


class _Rounded(FragmentationAwareAllocator):
    """Long-lived blocks rounded up to ``classes`` size classes per power of two."""

    classes = 8

    def acquire_nowait(self, nbytes: int, lifetime: Lifetime = "short") -> Block:
        if lifetime == "long":
            nbytes = rounded(nbytes, self.classes)
        return super().acquire_nowait(nbytes, lifetime)


def _with_arena(
    arena: type[Allocator], base: type[FragmentationAwareAllocator] = FragmentationAwareAllocator
) -> Callable[[int], Strategy]:
    def build(capacity: int) -> Strategy:
        allocator = base(capacity)
        allocator._arena = arena(allocator.capacity, long_at_top=True)
        return allocator

    return build


def _rounded(classes: int, arena: type[Allocator] = Allocator) -> Callable[[int], Strategy]:
    variant = type(f"_Rounded{classes}", (_Rounded,), {"classes": classes})
    return _with_arena(arena, variant)


VARIANTS: dict[str, Callable[[int], Strategy]] = {
    "as kept: long-lived at the highest hole, short-lived best fit": FragmentationAwareAllocator,
    "long-lived rounded to 8 classes per power of two": _rounded(8),
    "long-lived rounded to 4 classes per power of two": _rounded(4),
    "long-lived best fit (smallest hole)": _with_arena(_LongBestFit),
    "long-lived best fit and 4 classes per power of two": _rounded(4, _LongBestFit),
    "short-lived at the lowest address": _with_arena(_ShortLowest),
    "long-lived always in the largest free block": _with_arena(_LongInLargest),
}


def refill_replay(events: list[Event], lowest: int) -> dict[str, float]:
    """Replay with every long-lived death refilled by moving a low long-lived block."""
    allocator = FragmentationAwareAllocator(ARENA)
    arena = allocator._arena
    dying: dict[int, list[Block]] = {}
    where: dict[int, tuple[int, int]] = {}  # long-lived block offset -> its place in dying
    samples: list[float] = []
    moved = 0
    for i, event in enumerate(events):
        for block in dying.pop(i, ()):
            was_long = where.pop(block.offset, None) is not None
            allocator.release(block)
            if was_long:
                moved += _refill(allocator, arena, block.offset, lowest, dying, where)
        block = allocator.acquire_nowait(event.size, event.lifetime)
        due = dying.setdefault(i + event.life, [])
        due.append(block)
        if event.lifetime == "long" and allocator._owner[block.offset] is None:
            where[block.offset] = (i + event.life, len(due) - 1)
        if i >= len(events) // 10 and i % 100 == 0:
            samples.append(allocator.statistics().fragmentation)
    return {"fragmentation_mean": float(np.mean(samples)), "moved_mib_total": moved / MiB}


def regrowth(events: list[Event], every: int = 5000) -> dict[int, float]:
    """Mean fragmentation N allocations after a full compaction, for a few N."""
    allocator = FragmentationAwareAllocator(ARENA)
    dying: dict[int, list[tuple[Block, int]]] = {}
    long: set[int] = set()
    since: int | None = None
    after: dict[int, list[float]] = {}
    for i, event in enumerate(events):
        for block, _ in dying.pop(i, ()):
            allocator.release(block)
            long.discard(block.offset)
        block = allocator.acquire_nowait(event.size, event.lifetime)
        dying.setdefault(i + event.life, []).append((block, event.size))
        if event.lifetime == "long":
            long.add(block.offset)
        if i >= len(events) // 10 and i % every == 0:
            compact(allocator, dying, long)
            since = i
        if since is not None and i - since in (0, 200, 500, 1000, 2000):
            after.setdefault(i - since, []).append(allocator.statistics().fragmentation)
    return {n: float(np.mean(values)) for n, values in sorted(after.items())}


def _refill(
    allocator: FragmentationAwareAllocator,
    arena: Allocator,
    hole: int,
    lowest: int,
    dying: dict[int, list[Block]],
    where: dict[int, tuple[int, int]],
) -> int:
    """Move the largest of the ``lowest`` lowest long-lived blocks that fits the hole."""
    found = [(o, s) for o, s in arena.free_blocks().items() if o <= hole < o + s]
    if not found:
        return 0
    start, size = found[0]
    candidates = [o for o in sorted(where)[:lowest] if o < start and arena._used[o] <= size]
    if not candidates:
        return 0
    old = max(candidates, key=lambda o: arena._used[o])
    length = arena._used[old]
    at, index = where.pop(old)
    arena.release(Block(old, length))  # it may merge with the hole: look the hole up again
    new = start + size - length  # the top of the hole
    start, size = next((o, s) for o, s in arena.free_blocks().items() if o <= new < o + s)
    arena._remove_free(start, size)
    if new > start:
        arena._add_free(start, new - start)
    if start + size > new + length:
        arena._add_free(new + length, start + size - new - length)
    arena._used[new] = length
    arena._in_use += length
    dying[at][index] = Block(new, length)
    where[new] = (at, index)
    allocator._owner[new] = allocator._owner.pop(old)
    allocator._used[new] = allocator._used.pop(old)
    allocator._direct[new] = allocator._direct.pop(old)
    return length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allocations", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    events = drift_trace(args.allocations, args.seed)
    table = Table(title=f"fragmentation_aware placement variants, drift trace ({len(events)})")
    for column in ("variant", "fragmentation mean", "holes / arena", "internal waste", "failed"):
        table.add_column(column, justify="right")
    for name, factory in VARIANTS.items():
        row = replay("fragmentation_aware", events, factory=factory)
        table.add_row(
            name,
            f"{row['fragmentation_mean']:.1%}",
            f"{row['holes_of_arena_mean']:.1%}",
            f"{row['internal_waste_mean']:.1%}",
            str(row["failed"]),
        )
    console.print(table)
    table = Table(title="incremental refill: each long-lived death filled by a low block")
    for column in ("lowest considered", "fragmentation mean", "moved in all"):
        table.add_column(column, justify="right")
    for lowest in (1, 4, 16):
        row = refill_replay(events, lowest)
        moved = f"{row['moved_mib_total'] / 1024:.1f} GiB"
        table.add_row(str(lowest), f"{row['fragmentation_mean']:.1%}", moved)
    console.print(table)
    table = Table(title="fragmentation N allocations after a full compaction (mean)")
    for column in ("N", "fragmentation"):
        table.add_column(column, justify="right")
    for n, value in regrowth(events).items():
        table.add_row(str(n), f"{value:.1%}")
    console.print(table)


if __name__ == "__main__":
    main()
