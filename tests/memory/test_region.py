"""A multi-step request's region: steps' outputs at their planned places, one region.

The region is reserved at the plan's size on the first step, every later step's
outputs reuse its bytes, a step whose slot is still held falls back to the arena, and
the region goes back once the request ended and its last outputs were released. When
none of its steps runs, defragmentation and resizing move it with its contents.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sordino.errors import OutOfMemory
from sordino.memory import Arena, Lease, TensorRef, Tensors
from sordino.memory.allocator import ALIGNMENT
from sordino.memory.planner import plan_greedy_by_size
from sordino.memory.region import StepRegion
from sordino.memory.strategies import allocator_factory

OUT = 1000  # bytes of each of a step's two outputs


@pytest.fixture
def arena() -> Iterator[Arena]:
    arena = Arena(1 << 20, allocator=allocator_factory("fragmentation_aware"))
    yield arena
    arena.close()


def _step(region: StepRegion, arena: Arena, value: int, size: int = OUT) -> Tensors:
    """Stage one step's two outputs in the region, as staging does, and fill them."""
    lease = region.lease(arena, [size, size])
    assert lease is not None
    refs = {}
    for name in ("a", "b"):
        block = lease.acquire_nowait(size)
        view = np.ndarray((size,), np.uint8, lease.arena.buffer, block.offset)
        view[:] = value
        refs[name] = TensorRef(view, block.offset)
    return Tensors(refs, (lease,))


def test_steps_reuse_one_region_of_the_planned_size(arena: Arena) -> None:
    """Carried outputs: two steps' worth, reserved once; step k+2 reuses step k's bytes."""
    region = StepRegion()
    held_before = arena.statistics().in_use_bytes
    _, planned = plan_greedy_by_size([(OUT, 0, 1), (OUT, 0, 1), (OUT, 1, 2), (OUT, 1, 2)])
    previous = _step(region, arena, 0)
    assert region.planned_bytes == planned == 4 * 1024  # 1,000 bytes aligned to 1,024
    for k in range(1, 20):
        current = _step(region, arena, k)  # step k reads step k-1's outputs, then they go
        assert int(previous["a"][0]) == k - 1
        previous.release()
        previous = current
        assert arena.statistics().in_use_bytes - held_before == planned
    assert region.peak_bytes == planned and region.fallbacks == 0
    region.close()
    assert arena.statistics().in_use_bytes - held_before == planned  # the last step's outputs
    previous.release()
    assert arena.statistics().in_use_bytes == held_before  # the region went back


def test_a_slot_still_held_falls_back_to_the_arena(arena: Arena) -> None:
    """Step k's outputs not released by step k+2 (a slow response): that step's outputs
    take arena blocks, counted, and the region stays until they are back too."""
    region = StepRegion()
    steps = [_step(region, arena, k) for k in range(3)]
    assert region.fallbacks == 2 and region.fallback_bytes == 2 * 1024
    assert region.peak_bytes == region.planned_bytes
    region.close()
    for tensors in steps:
        assert tensors.leases[0].nbytes == 2 * 1024
        tensors.release()
    assert arena.statistics().in_use_bytes == 0


def test_outputs_that_are_not_carried_need_one_step(arena: Arena) -> None:
    """An iterative model's sampler reads step k's outputs within step k: one step's worth."""
    region = StepRegion(carried=False)
    for k in range(5):
        _step(region, arena, k).release()
    assert region.planned_bytes == region.peak_bytes == 2 * 1024
    region.close()
    assert arena.statistics().in_use_bytes == 0


def test_a_closed_region_is_not_used_again(arena: Arena) -> None:
    region = StepRegion()
    _step(region, arena, 0).release()
    region.close()
    assert region.lease(arena, [OUT]) is None and not region.reserved


@pytest.mark.parametrize("how", ["defragment", "resize"])
def test_a_parked_region_moves_with_its_contents(arena: Arena, how: str) -> None:
    """Between steps (its outputs parked in the queue) the region may move: its blocks,
    its allocator and the parked tensors follow; the next step is placed in it."""
    low = Lease(arena)
    low.acquire_nowait(256 * 1024)  # below the region: released to leave a hole
    region = StepRegion()
    state = _step(region, arena, 7)
    first = state.ref("a").offset
    state.park()
    low.release()
    if how == "defragment":
        report = arena.defragment("test")
        assert report.blocks_moved >= 1
    else:
        assert arena.resize(2 << 20, "test") is not None
    moved = state.ref("a")
    assert how == "resize" or moved.offset != first
    assert int(moved.array.min()) == int(moved.array.max()) == 7
    base = np.frombuffer(arena.buffer, np.uint8).__array_interface__["data"][0]
    assert moved.array.__array_interface__["data"][0] - base == moved.offset
    state.unpark()
    following = _step(region, arena, 8)  # placed in the region where it lies now
    assert region.fallbacks == 0
    assert abs(following.ref("a").offset - moved.offset) < region.planned_bytes + ALIGNMENT
    state.release()
    following.release()
    region.close()
    assert arena.statistics().in_use_bytes == 0


_op = st.one_of(
    st.tuples(st.just("step"), st.integers(0, 2)),
    st.tuples(st.just("release"), st.integers(0, 1000)),
    st.tuples(st.sampled_from(["defrag", "shift", "resize"]), st.just(0)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, min_size=1, max_size=40))
def test_random_steps_releases_and_moves_keep_every_output(ops: list[tuple[str, int]]) -> None:
    """Steps of three requests, released in any order, the arena defragmented, compacted
    or resized between them (everything parked): every output keeps its bytes, regions
    never overlap anything, and everything goes back in the end."""
    arena = Arena(1 << 20, allocator=allocator_factory("fragmentation_aware"))
    regions = [StepRegion(carried=bool(i % 2)) for i in range(3)]
    sizes = [1000, 40_000, 70_000]  # the small tier (chunks) and the arena itself
    live: list[tuple[Tensors, int]] = []
    stamp = 0
    try:
        for op, arg in ops:
            if op == "step":
                stamp += 1
                free = arena.capacity - arena.statistics().in_use_bytes
                try:
                    step = _step(regions[arg], arena, stamp % 251, sizes[arg])
                except OutOfMemory:
                    # Many live steps of 140 kB fill the 1 MiB arena, or leave its free
                    # bytes in pieces and inside the small tier's chunks (128 KiB, one for
                    # each lifetime): a refusal is right then, and only then — when no free
                    # run outside the chunks holds one output.
                    largest = arena.statistics().largest_free
                    needed = -(-sizes[arg] // ALIGNMENT) * ALIGNMENT
                    assert largest < needed, f"refused with a {largest} B run ({free} B free)"
                    continue
                live.append((step, stamp % 251))
            elif op == "release" and live:
                live.pop(arg % len(live))[0].release()
            elif op in ("defrag", "shift", "resize"):
                for tensors, _ in live:
                    tensors.park()
                if op == "defrag":  # (about a third of the examples move a region)
                    arena.defragment("test")
                elif op == "shift":
                    arena.shift(1 << 20)
                else:
                    arena.resize(arena.capacity, "test")
                for tensors, _ in live:
                    tensors.unpark()
            used = sorted(arena.allocator.used_blocks().items())
            for (a, size_a), (b, _) in itertools.pairwise(used):
                assert a + size_a <= b
            base = np.frombuffer(arena.buffer, np.uint8).__array_interface__["data"][0]
            holders = {o: o + size for o, size in arena.allocator.used_blocks().items()}
            for tensors, value in live:
                for name in ("a", "b"):
                    ref = tensors.ref(name)
                    assert int(ref.array.min()) == int(ref.array.max()) == value
                    assert ref.array.__array_interface__["data"][0] - base == ref.offset
                    assert ref.offset is not None  # inside a block the arena has handed out
                    assert any(o <= ref.offset < end for o, end in holders.items())
        for region in regions:
            region.close()
        for tensors, _ in live:
            tensors.release()
        assert arena.statistics().in_use_bytes == 0
    finally:
        arena.close()
