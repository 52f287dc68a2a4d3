"""The best-fit allocator: alignment, best fit across size classes, coalescing, statistics."""

from __future__ import annotations

import contextlib
import itertools
import random

import pytest

from sordino.errors import OutOfMemory
from sordino.memory import ALIGNMENT, Allocator


def test_sizes_round_up_to_the_alignment() -> None:
    """Every block is a whole number of 64-byte units, at least one."""
    alloc = Allocator(4096)
    assert alloc.acquire_nowait(1).size == ALIGNMENT
    assert alloc.acquire_nowait(65).size == 2 * ALIGNMENT
    assert alloc.acquire_nowait(0).size == ALIGNMENT


def test_best_fit_picks_the_smallest_hole_that_fits() -> None:
    """Of several free holes the smallest one large enough is used, not the first."""
    alloc = Allocator(64 * 100)
    blocks = [alloc.acquire_nowait(64 * n) for n in (8, 1, 3, 1, 5, 1)]
    for index in (0, 2, 4):  # holes of 8, 3 and 5 units, kept apart by used blocks
        alloc.release(blocks[index])
    chosen = alloc.acquire_nowait(64 * 3)
    assert chosen.offset == blocks[2].offset
    chosen = alloc.acquire_nowait(64 * 4)
    assert chosen.offset == blocks[4].offset  # 5 units beats 8


def test_release_coalesces_with_both_neighbours() -> None:
    """Freeing the middle block of three free ones leaves a single free block."""
    alloc = Allocator(64 * 30)
    a, b, c = (alloc.acquire_nowait(64 * 10) for _ in range(3))
    alloc.release(a)
    alloc.release(c)
    assert alloc.statistics().free_blocks == 2
    alloc.release(b)
    stats = alloc.statistics()
    assert (stats.free_blocks, stats.largest_free, stats.in_use_bytes) == (1, 64 * 30, 0)


def test_fragmentation_is_one_minus_largest_over_free() -> None:
    """fragmentation = 1 - largest_free / free_bytes, exactly."""
    alloc = Allocator(64 * 40)
    blocks = [alloc.acquire_nowait(64 * 10) for _ in range(4)]
    alloc.release(blocks[0])
    alloc.release(blocks[2])
    stats = alloc.statistics()
    assert stats.free_bytes == 64 * 20 and stats.largest_free == 64 * 10
    assert stats.fragmentation == pytest.approx(0.5)
    assert (stats.reserved_bytes, stats.in_use_bytes, stats.peak_bytes) == (2560, 1280, 2560)


def test_exhaustion_raises_out_of_memory_with_the_numbers() -> None:
    """A request no hole can hold fails at once and says what is free."""
    alloc = Allocator(64 * 4)
    alloc.acquire_nowait(64 * 3)
    with pytest.raises(OutOfMemory, match="64 free of 256"):
        alloc.acquire_nowait(128)
    assert alloc.statistics().failed == 1


def test_double_release_is_refused() -> None:
    """Releasing a block twice is a bug and raises."""
    alloc = Allocator(1024)
    block = alloc.acquire_nowait(100)
    alloc.release(block)
    with pytest.raises(ValueError, match="not in use"):
        alloc.release(block)


def test_random_workload_keeps_the_books_exact() -> None:
    """Random acquire/release: blocks never overlap, and releasing all restores one hole."""
    rng = random.Random(7)
    alloc = Allocator(64 * 1024)
    held = []
    for _ in range(2000):
        if held and rng.random() < 0.45:
            alloc.release(held.pop(rng.randrange(len(held))))
        else:
            with contextlib.suppress(OutOfMemory):
                held.append(alloc.acquire_nowait(rng.randint(1, 4000)))
        spans = sorted((b.offset, b.offset + b.size) for b in held)
        assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(spans))
        assert alloc.statistics().in_use_bytes == sum(b.size for b in held)
    for block in held:
        alloc.release(block)
    stats = alloc.statistics()
    assert (stats.free_blocks, stats.fragmentation) == (1, 0.0)
