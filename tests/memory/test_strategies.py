"""Every allocator strategy keeps the arena's invariants under acquire/release/defrag.

Hypothesis drives random sequences of operations on a real arena: blocks never
overlap, reserved = in use + free, and defragmentation never changes the contents of
a live block (checked by checksums) nor moves a block that is not parked; nor does a
step of incremental compaction (``Arena.shift``), which never moves more than its
budget.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sordino.errors import OutOfMemory
from sordino.memory import Arena, Lease, TensorRef, Tensors
from sordino.memory.strategies import STRATEGIES, allocator_factory

CAPACITY = 1 << 20

_op = st.one_of(
    st.tuples(
        st.just("acquire"),
        st.sampled_from([1, 64, 200, 4000, 9000, 70_000, 200_000]),
        st.sampled_from(["short", "long"]),
        st.booleans(),
    ),
    st.tuples(st.just("release"), st.integers(0, 1000)),
    st.tuples(st.just("defrag")),
    st.tuples(st.just("shift"), st.sampled_from([0, 4096, 70_000, 1 << 20])),
)


@dataclass
class _Live:
    tensors: Tensors
    offset: int
    digest: str
    parked: bool


def _digest(array: np.ndarray) -> str:
    return hashlib.blake2b(array.tobytes(), digest_size=16).hexdigest()


def _check_invariants(arena: Arena) -> None:
    allocator = arena.allocator
    stats = allocator.statistics()
    assert stats.reserved_bytes == stats.in_use_bytes + stats.free_bytes
    used = sorted(allocator.used_blocks().items())
    assert sum(size for _, size in used) == stats.in_use_bytes
    for (a, size_a), (b, _) in itertools.pairwise(used):
        assert a + size_a <= b, "two blocks in use overlap"
    if used:
        assert used[0][0] >= 0 and used[-1][0] + used[-1][1] <= stats.reserved_bytes
    free = sorted(allocator.free_blocks().items())
    spans = sorted(used + free)
    for (a, size_a), (b, _) in itertools.pairwise(spans):
        assert a + size_a <= b, "a free block overlaps a block in use"
    assert 0.0 <= stats.fragmentation <= 1.0


@pytest.mark.parametrize("strategy", STRATEGIES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, min_size=1, max_size=60), seed=st.integers(0, 2**16))
def test_invariants_hold_and_defrag_preserves_contents(
    strategy: str, ops: list[tuple[object, ...]], seed: int
) -> None:
    """Random acquire/release/defrag/shift keeps every invariant and every live block's bytes."""
    rng = np.random.default_rng(seed)
    arena = Arena(CAPACITY, allocator=allocator_factory(strategy), strategy=strategy)
    live: list[_Live] = []
    try:
        for op in ops:
            if op[0] == "acquire":
                _, size, lifetime, parked = op
                lease = Lease(arena)
                try:
                    block = lease.acquire_nowait(int(size), lifetime)  # type: ignore[call-overload]
                except OutOfMemory:
                    lease.release()
                    continue
                view = np.ndarray((int(size),), np.uint8, arena.buffer, block.offset)
                view[:] = rng.integers(0, 256, int(size), dtype=np.uint8)
                tensors = Tensors({"x": TensorRef(view, block.offset)}, (lease,))
                if parked:
                    tensors.park()
                live.append(_Live(tensors, block.offset, _digest(view), bool(parked)))
            elif op[0] == "release" and live:
                entry = live.pop(int(op[1]) % len(live))  # type: ignore[call-overload]
                entry.tensors.release()
            elif op[0] in ("defrag", "shift"):
                if op[0] == "defrag":
                    report = arena.defragment("test")
                    assert report.fragmentation_after <= 1.0 and report.pause_s >= 0
                else:
                    step = arena.shift(int(op[1]))  # type: ignore[call-overload]
                    assert step.bytes_moved <= int(op[1])  # type: ignore[call-overload]
                for entry in live:
                    ref = entry.tensors.ref("x")
                    assert _digest(ref.array) == entry.digest, "defrag changed a block's bytes"
                    address = ref.array.__array_interface__["data"][0]
                    base = np.frombuffer(arena.buffer, np.uint8).__array_interface__["data"][0]
                    assert address - base == ref.offset
                    if not entry.parked:
                        assert ref.offset == entry.offset, "a pinned block moved"
            _check_invariants(arena)
        for entry in live:
            entry.tensors.release()
        assert arena.allocator.statistics().in_use_bytes == 0
    finally:
        arena.close()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_defrag_coalesces_parked_blocks(strategy: str) -> None:
    """Parked blocks scattered between holes are moved together: fragmentation falls."""
    arena = Arena(CAPACITY, allocator=allocator_factory(strategy), strategy=strategy)
    try:
        tensors = []
        for _ in range(40):
            lease = Lease(arena)
            block = lease.acquire_nowait(9000)
            view = np.ndarray((9000,), np.uint8, arena.buffer, block.offset)
            view[:] = 7
            tensors.append(Tensors({"x": TensorRef(view, block.offset)}, (lease,)))
        for index, t in enumerate(tensors):
            if index % 2:
                t.release()
            else:
                t.park()
        before = arena.statistics().fragmentation
        report = arena.defragment("test")
        assert report.fragmentation_before == pytest.approx(before)
        assert report.fragmentation_after < before
        assert report.blocks_moved > 0 and report.bytes_moved >= report.blocks_moved * 9000
        assert all(int(t["x"].sum()) == 7 * 9000 for t in tensors[::2])
        for t in tensors[::2]:
            t.release()
    finally:
        arena.close()


def test_zero_on_free_clears_a_released_block() -> None:
    """With zero_on_free, the next owner of a block never sees the last one's bytes."""
    arena = Arena(4096, zero_on_free=True)
    try:
        lease = Lease(arena)
        block = lease.acquire_nowait(4096)
        np.ndarray((4096,), np.uint8, arena.buffer, block.offset)[:] = 0xAB
        lease.release()
        assert not np.frombuffer(arena.buffer, np.uint8).any()
    finally:
        arena.close()


def test_defrag_with_zero_on_free_leaves_no_bytes_behind() -> None:
    """A moved block's old range is zeroed (tenant isolation), its new one holds the data."""
    arena = Arena(CAPACITY, zero_on_free=True)
    try:
        held = []
        for index in range(8):
            lease = Lease(arena)
            block = lease.acquire_nowait(64 * 1024)
            view = np.ndarray((64 * 1024,), np.uint8, arena.buffer, block.offset)
            view[:] = index + 1
            held.append(Tensors({"x": TensorRef(view, block.offset)}, (lease,)))
        for t in held[::2]:
            t.release()
        for t in held[1::2]:
            t.park()
        report = arena.defragment("test")
        assert report.blocks_moved > 0
        whole = np.frombuffer(arena.buffer, np.uint8)
        live = sum(int(t["x"].size) for t in held[1::2])
        nonzero = int(np.count_nonzero(whole))
        del whole, view
        assert nonzero == live  # nothing outside the live blocks
        assert [int(t["x"][0]) for t in held[1::2]] == [2, 4, 6, 8]
        for t in held[1::2]:
            t.release()
        held.clear()
    finally:
        arena.close()


def test_shift_sinks_holes_between_parked_blocks_within_its_budget() -> None:
    """fragmentation_aware: steps of incremental compaction move parked long-lived blocks
    up into the holes above them, at most the budget per step, until the holes merged
    with the free space below; contents and tensors follow, pinned blocks stay."""
    arena = Arena(
        CAPACITY, allocator=allocator_factory("fragmentation_aware"), strategy="fragmentation_aware"
    )
    try:
        tensors = []
        for index in range(12):
            lease = Lease(arena)
            block = lease.acquire_nowait(70_000, "long")  # medium: placed in the arena itself
            view = np.ndarray((70_000,), np.uint8, arena.buffer, block.offset)
            view[:] = index
            tensors.append(Tensors({"x": TensorRef(view, block.offset)}, (lease,)))
        pinned = tensors[0]  # the highest block: a running batch's, it must not move
        pinned_offset = pinned.ref("x").offset
        for index, t in enumerate(tensors[1:], start=1):
            if index % 2:
                t.release()
            else:
                t.park()
        kept = [(index, t) for index, t in enumerate(tensors) if index % 2 == 0]
        before = arena.statistics().fragmentation
        assert before > 0.1
        budget = 2 * 70_016  # two blocks (aligned) per step
        steps = moved = 0
        while (step := arena.shift(budget)).bytes_moved:
            assert step.bytes_moved <= budget and step.pause_s >= 0
            steps += 1
            moved += step.bytes_moved
            assert steps < 100
        assert steps > 1  # the budget spread the work over several steps
        assert arena.statistics().fragmentation < 0.01 < before
        assert pinned.ref("x").offset == pinned_offset
        for index, t in kept:
            ref = t.ref("x")
            assert int(ref.array.min()) == int(ref.array.max()) == index
            base = np.frombuffer(arena.buffer, np.uint8).__array_interface__["data"][0]
            assert ref.array.__array_interface__["data"][0] - base == ref.offset
        for _, t in kept:
            t.release()
    finally:
        arena.close()


@pytest.mark.parametrize("strategy", ["best_fit", "simple"])
def test_shift_moves_nothing_without_a_place_for_long_lived_state(strategy: str) -> None:
    """Only fragmentation_aware packs long-lived state at the top; the others never shift."""
    arena = Arena(CAPACITY, allocator=allocator_factory(strategy), strategy=strategy)
    try:
        tensors = []
        for _ in range(10):
            lease = Lease(arena)
            block = lease.acquire_nowait(9000, "long")
            view = np.ndarray((9000,), np.uint8, arena.buffer, block.offset)
            tensors.append(Tensors({"x": TensorRef(view, block.offset)}, (lease,)))
        for index, t in enumerate(tensors):
            t.release() if index % 2 else t.park()
        assert arena.shift(1 << 20).bytes_moved == 0
        for t in tensors[::2]:
            t.release()
    finally:
        arena.close()
