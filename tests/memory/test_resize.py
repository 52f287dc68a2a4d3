"""Resizing the arena: contents kept, tensors repointed, pool_size auto's decisions."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sordino.config.memory import MemoryConfig
from sordino.errors import OutOfMemory
from sordino.events import EventSink
from sordino.memory import Arena, Lease, TensorRef, Tensors
from sordino.memory.manager import MemoryManager
from sordino.memory.strategies import allocator_factory
from sordino.telemetry.forecast import Forecast, ForecastSeries
from sordino.testing import VirtualClock

KIB = 1024
MIB = 1024 * 1024


def _parked(arena: Arena, count: int, size: int) -> list[Tensors]:
    held = []
    for index in range(count):
        lease = Lease(arena)
        block = lease.acquire_nowait(size)
        view = np.ndarray((size // 8,), np.int64, arena.buffer, block.offset)
        view[:] = index
        tensors = Tensors({"x": TensorRef(view, block.offset)}, (lease,))
        tensors.park()
        held.append(tensors)
    return held


@pytest.mark.parametrize("strategy", ["best_fit", "fragmentation_aware", "simple"])
def test_resize_keeps_every_parked_block_and_repoints_it(strategy: str) -> None:
    arena = Arena(1 * MIB, allocator=allocator_factory(strategy))
    try:
        held = _parked(arena, 12, 48 * KIB)
        for tensors in held[1::3]:
            tensors.release()
        kept = [t for t in held if not t.released]
        old_name = arena.name
        report = arena.resize(4 * MIB, "grow")
        assert report is not None and report.bytes_after == 4 * MIB
        assert arena.capacity == 4 * MIB and arena.name != old_name
        assert report.blocks_copied == len(kept) and report.bytes_copied == len(kept) * 48 * KIB
        for tensors in kept:
            index = int(tensors["x"][0])
            assert bool((tensors["x"] == index).all())
            # The array is a view of the new segment, at the offset the tensors say.
            offset = tensors.ref("x").offset
            assert offset is not None
            fresh = np.ndarray((48 * KIB // 8,), np.int64, arena.buffer, offset)
            assert bool((fresh == index).all())
        assert arena.statistics().in_use_bytes == len(kept) * 48 * KIB
        # Shrinking below the live bytes is refused and changes nothing.
        with pytest.raises(OutOfMemory):
            arena.resize(64 * KIB, "shrink")
        assert arena.capacity == 4 * MIB
        assert arena.resize(len(kept) * 48 * KIB + 64 * KIB, "shrink") is not None
        assert all(bool((t["x"] == t["x"][0]).all()) for t in kept)
        for tensors in kept:
            tensors.release()
        assert arena.statistics().in_use_bytes == 0
    finally:
        arena.close()


def test_a_lease_in_use_makes_the_arena_not_quiet() -> None:
    arena = Arena(1 * MIB)
    try:
        (parked,) = _parked(arena, 1, 64 * KIB)
        assert arena.quiet()
        busy = Lease(arena)  # a running batch's space: not parked
        busy.acquire_nowait(64 * KIB)
        assert not arena.quiet()
        assert arena.resize(2 * MIB) is None and arena.capacity == 1 * MIB
        busy.release()
        assert arena.resize(2 * MIB) is not None
        parked.release()
    finally:
        arena.close()


def _series(peak: float) -> ForecastSeries:
    return ForecastSeries(peak / 2, peak, (), "holt_winters", 100, 60)


async def test_auto_grows_ahead_of_the_forecast_peak_and_shrinks_after() -> None:
    """Little's law on the forecast sizes the pool; a passed peak shrinks it back."""
    arena = Arena(4 * MIB)
    forecast: list[Forecast | None] = [None]
    events = EventSink()
    manager = MemoryManager(
        MemoryConfig(pool_size="auto", pool_min="4MB", pool_max="64MB", prewarm_headroom=1.5),
        arena=arena,
        clock=VirtualClock(),
        events=events,
        forecast=lambda: forecast[0],
    )
    try:
        manager.learn("m", 1, 100 * KIB, 0.5)
        assert await manager.prewarm() is None  # no forecast, nothing used: stays at min
        forecast[0] = Forecast(0.0, {"m": _series(200.0)}, None)  # 200 req/s x 100 KiB x 0.5 s
        report = await manager.prewarm()
        assert report is not None and report.reason == "grow"
        predicted = 200 * 100 * KIB * 0.5
        assert arena.capacity == 15 * MIB >= predicted * 1.5  # rounded up to whole MiB
        pool = manager.statistics().pool
        assert pool is not None and pool.auto and pool.resizes == 1
        assert pool.predicted_peak_bytes == pytest.approx(predicted)
        resize = [e for e in events.recent("memory") if e.subject == "resize"]
        assert resize and resize[0].payload["bytes_before"] == 4 * MIB
        assert resize[0].payload["bytes_after"] == 15 * MIB
        assert {"bytes_copied", "pause_s", "reason"} <= set(resize[0].payload)
        forecast[0] = Forecast(0.0, {"m": _series(20.0)}, None)  # the peak has passed
        report = await manager.prewarm()
        assert report is not None and report.reason == "shrink" and arena.capacity == 4 * MIB
        forecast[0] = Forecast(0.0, {"m": _series(10_000.0)}, None)
        await manager.prewarm()
        assert arena.capacity == 64 * MIB  # never above pool_max
    finally:
        arena.close()


async def test_auto_follows_the_real_peak_without_a_forecast() -> None:
    arena = Arena(1 * MIB)
    manager = MemoryManager(
        MemoryConfig(pool_size="auto", pool_min="1MB", pool_max="16MB"),
        arena=arena,
        clock=VirtualClock(),
        events=EventSink(),
    )
    try:
        held = _parked(arena, 14, 64 * KIB)  # 896 KiB of 1 MiB in use
        report = await manager.prewarm()
        assert report is not None and report.reason == "grow" and arena.capacity == 2 * MIB
        assert all(int(t["x"][0]) == i for i, t in enumerate(held))
        for tensors in held:
            tensors.release()
    finally:
        arena.close()


async def test_the_timer_runs_the_auto_step_every_prewarm_interval() -> None:
    arena = Arena(1 * MIB)
    clock = VirtualClock()
    manager = MemoryManager(
        MemoryConfig(pool_size="auto", pool_min="1MB", pool_max="8MB", prewarm_interval="30s"),
        arena=arena,
        clock=clock,
        events=EventSink(),
    )
    held = _parked(arena, 12, 64 * KIB)  # 768 KiB in use: 1.5x is over 1 MiB
    await manager.start()
    try:
        await clock.advance(29)
        assert arena.capacity == 1 * MIB
        await clock.advance(2)
        assert arena.capacity == 2 * MIB
        pool = manager.statistics().pool
        assert pool is not None and pool.resizes == 1 and pool.last_resize is not None
        assert pool.last_resize.reason == "grow"
    finally:
        await manager.stop()
        for tensors in held:
            tensors.release()
        arena.close()


@settings(max_examples=40, deadline=None)
@given(
    strategy=st.sampled_from(["best_fit", "fragmentation_aware", "simple"]),
    ops=st.lists(
        st.tuples(st.sampled_from(["acquire", "release", "resize"]), st.integers(1, 96)),
        min_size=1,
        max_size=40,
    ),
)
def test_random_acquire_release_resize_keeps_every_live_block(
    strategy: str, ops: list[tuple[str, int]]
) -> None:
    """Contents (a checksum per block) survive every resize; live blocks never overlap."""
    arena = Arena(1 * MIB, allocator=allocator_factory(strategy))
    live: list[tuple[Tensors, int]] = []
    try:
        for n, (op, arg) in enumerate(ops):
            if op == "acquire":
                lease = Lease(arena)
                try:
                    block = lease.acquire_nowait(arg * KIB)
                except OutOfMemory:
                    lease.release()
                    continue
                view = np.ndarray((arg * KIB,), np.uint8, arena.buffer, block.offset)
                view[:] = np.arange(arg * KIB) % 251
                view[0] = n % 256
                tensors = Tensors({"x": TensorRef(view, block.offset)}, (lease,))
                tensors.park()
                live.append((tensors, int(view.sum())))
            elif op == "release" and live:
                live.pop(arg % len(live))[0].release()
            elif op == "resize":
                size = (arg * 32 + 64) * KIB
                before = arena.capacity
                try:
                    arena.resize(size)
                except OutOfMemory:  # the live blocks do not fit: nothing changed
                    assert arena.capacity == before
            for tensors, checksum in live:
                assert int(tensors["x"].sum()) == checksum
            spans = sorted(
                (b.offset, b.offset + b.size) for t, _ in live for b in t.leases[0]._blocks
            )
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
            assert all(end <= arena.capacity for _, end in spans)
    finally:
        for tensors, _ in live:
            tensors.release()
        arena.close()


def _prewarm_loops() -> int:
    return sum(
        task.get_name() == "sordino-memory-prewarm" and not task.done()
        for task in asyncio.all_tasks()
    )


async def test_a_retune_keeps_one_prewarm_loop_and_stop_ends_it() -> None:
    """Hot reconfiguration restarts the defragmentation timer, not pre-warming: one
    pool_size auto loop before and after, none once the manager stops."""
    arena = Arena(1 * MIB)
    clock = VirtualClock()
    config = MemoryConfig(pool_size="auto", pool_min="1MB", pool_max="8MB", defrag_interval="60s")
    manager = MemoryManager(config, arena=arena, clock=clock, events=EventSink())
    await manager.start()
    try:
        assert _prewarm_loops() == 1
        await manager.retune(config.model_copy(update={"defrag_interval": 30.0}))
        await manager.retune(config)
        assert _prewarm_loops() == 1
    finally:
        await manager.stop()
        arena.close()
    assert _prewarm_loops() == 0
