"""The memory manager's triggers on a virtual clock: interval, threshold, on demand."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from sordino.config.memory import MemoryConfig
from sordino.events import EventSink
from sordino.inference import ModelKey
from sordino.memory import Arena, Lease, TensorRef, Tensors, TensorsBuilder
from sordino.memory.manager import MemoryManager
from sordino.memory.strategies import allocator_factory
from sordino.records import BatchDone
from sordino.testing import VirtualClock


@pytest.fixture
def arena() -> Iterator[Arena]:
    arena = Arena(1 << 20, allocator=allocator_factory("fragmentation_aware"))
    yield arena
    arena.close()


def _fragment(arena: Arena) -> list[Tensors]:
    """Parked 128 KiB blocks with every other one released: fragmentation near 0.5+."""
    held = []
    for index in range(8):
        lease = Lease(arena)
        block = lease.acquire_nowait(128 * 1024)
        view = np.ndarray((128 * 1024,), np.uint8, arena.buffer, block.offset)
        view[:] = index
        tensors = Tensors({"x": TensorRef(view, block.offset)}, (lease,))
        tensors.park()
        held.append(tensors)
    for tensors in held[1::2]:
        tensors.release()
    return held[::2]


def _manager(arena: Arena | None, clock: VirtualClock, **config: object) -> MemoryManager:
    return MemoryManager(
        MemoryConfig.model_validate(config), arena=arena, clock=clock, events=EventSink()
    )


async def test_threshold_must_hold_for_the_window(arena: Arena) -> None:
    """Fragmentation above the threshold for defrag_window starts one run, reason threshold."""
    clock = VirtualClock()
    manager = _manager(arena, clock, defrag_threshold=0.2, defrag_window="60s")
    kept = _fragment(arena)
    assert arena.statistics().fragmentation > 0.2
    await manager.start()
    await clock.advance(50)
    assert manager.statistics().defrag_runs == 0
    await clock.advance(20)
    stats = manager.statistics()
    assert stats.defrag_runs == 1 and stats.last_defrag is not None
    assert stats.last_defrag.reason == "threshold" and stats.last_defrag.bytes_moved > 0
    assert arena.statistics().fragmentation < 0.2
    assert sorted(int(t["x"][0]) for t in kept) == [0, 2, 4, 6]
    await manager.stop()
    for tensors in kept:
        tensors.release()


async def test_interval_runs_on_the_timer(arena: Arena) -> None:
    clock = VirtualClock()
    events = EventSink()
    manager = MemoryManager(
        MemoryConfig(defrag_interval=30, defrag_threshold=0),
        arena=arena,
        clock=clock,
        events=events,
    )
    await manager.start()
    await clock.advance(95)
    runs = [e for e in events.recent("memory") if e.subject == "defrag"]
    assert [e.payload["reason"] for e in runs] == ["interval"] * 3
    assert set(runs[0].payload) >= {
        "bytes_moved", "fragmentation_before", "fragmentation_after", "pause_s", "reason"
    }  # fmt: skip
    await manager.stop()


async def test_trigger_defrag_and_no_arena(arena: Arena) -> None:
    clock = VirtualClock()
    manager = _manager(None, clock)
    report = await manager.defragment("guardian")
    assert (report.bytes_moved, report.reason) == (0, "guardian")
    assert manager.statistics().arena is None
    live = _manager(arena, clock)
    kept = _fragment(arena)
    report = await live.trigger_defrag("guardian")
    assert report.reason == "guardian" and report.blocks_moved > 0
    for tensors in kept:
        tensors.release()


async def test_disabled_manager_starts_no_timer(arena: Arena) -> None:
    clock = VirtualClock()
    manager = _manager(arena, clock, enabled=False)
    await manager.start()
    await clock.advance(3600)
    assert manager.statistics().defrag_runs == 0


def test_builder_places_long_lived_state_at_the_top(arena: Arena) -> None:
    """TensorsBuilder(lifetime="long") keeps state apart from short-lived buffers."""
    builder = TensorsBuilder(arena, lifetime="long")
    builder.put("state", np.ones((256, 256), np.float32))
    tensors = builder.finish()
    short = TensorsBuilder(arena)
    short.put("x", np.ones((256, 256), np.float32))
    batch = short.finish()
    assert tensors.ref("state").offset > batch.ref("x").offset  # type: ignore[operator]
    tensors.release()
    batch.release()


def test_learned_bytes_per_request_and_the_forecast_peak() -> None:
    """Bytes per request per shape bucket; Little's law on the forecast's peak QPS."""
    from sordino.telemetry.forecast import Forecast, ForecastSeries

    series = ForecastSeries(10.0, 50.0, (), "holt_winters", 100, 60)
    forecast = Forecast(0.0, {"m": series}, None)
    manager = MemoryManager(
        MemoryConfig(), clock=VirtualClock(), events=EventSink(),
        forecast=lambda: forecast,
    )  # fmt: skip
    for _ in range(3):
        manager.learn("m", 1, 1000, 0.02)
    manager.learn("m", 8, 8000, 0.02)
    manager.learn("other", 3, 500, 0.01)
    by_model = {f.model: f for f in manager.statistics().forecasts}
    m = by_model["m"]
    assert m.buckets == ((1, 3, 1000), (8, 1, 8000))
    assert m.bytes_per_request == pytest.approx((3 * 1000 + 8000) / 4)
    assert m.forecast_peak_qps == 50.0
    assert m.predicted_peak_bytes == pytest.approx(50.0 * m.bytes_per_request * 0.02)
    assert by_model["other"].buckets == ((4, 1, 500),)
    assert by_model["other"].predicted_peak_bytes is None  # no forecast for it


def test_every_batch_boundary_runs_one_bounded_compaction_step(arena: Arena) -> None:
    """fragmentation_aware: each batch_done moves at most memory.compact_step bytes of
    parked blocks, and the steps are counted with their pauses."""
    held = _fragment(arena)
    before = arena.statistics().fragmentation
    manager = _manager(arena, VirtualClock(), strategy="fragmentation_aware", compact_step="128KiB")
    done = BatchDone(ModelKey("m", "1"), 1, 1, 0.0, 0.0, 0.0, True)
    for _ in range(8):
        manager.batch_done(done)
    stats = manager.statistics().compaction
    assert stats is not None and stats.budget_bytes == 128 * 1024
    assert stats.steps == 8 and stats.steps_moving >= 2
    assert stats.bytes_moved <= stats.steps_moving * 128 * 1024
    assert stats.max_pause_s <= stats.pause_s
    assert arena.statistics().fragmentation < before
    assert [int(t["x"][0]) for t in held] == [0, 2, 4, 6]
    for tensors in held:
        tensors.release()


def test_compaction_steps_are_off_for_other_strategies_and_at_zero(arena: Arena) -> None:
    """best_fit, or compact_step 0: batch boundaries move nothing."""
    held = _fragment(arena)
    done = BatchDone(ModelKey("m", "1"), 1, 1, 0.0, 0.0, 0.0, True)
    for config in (
        {"strategy": "best_fit"},
        {"strategy": "fragmentation_aware", "compact_step": 0},
    ):
        manager = _manager(arena, VirtualClock(), **config)
        manager.batch_done(done)
        stats = manager.statistics().compaction
        assert stats is not None and stats.steps == 0 and stats.bytes_moved == 0
    for tensors in held:
        tensors.release()


async def test_compact_step_is_taken_live(arena: Arena) -> None:
    """A reconfiguration's new memory.compact_step applies from the next batch on."""
    held = _fragment(arena)
    manager = _manager(arena, VirtualClock(), strategy="fragmentation_aware", compact_step=0)
    done = BatchDone(ModelKey("m", "1"), 1, 1, 0.0, 0.0, 0.0, True)
    manager.batch_done(done)
    assert manager.compaction().steps == 0
    await manager.retune(
        MemoryConfig.model_validate({"strategy": "fragmentation_aware", "compact_step": "1MiB"})
    )
    manager.batch_done(done)
    assert manager.compaction().steps == 1 and manager.compaction().bytes_moved > 0
    await manager.stop()
    for tensors in held:
        tensors.release()


async def test_a_run_moves_in_bounded_steps_and_a_second_call_joins_it() -> None:
    """Steps of at most step_bytes; the loop runs between them; one run for two calls."""
    arena = Arena(4 << 20)  # best fit: the one-shot pass packs everything at the bottom
    try:
        held = []
        for index in range(32):
            lease = Lease(arena)
            block = lease.acquire_nowait(64 * 1024)
            view = np.ndarray((64 * 1024,), np.uint8, arena.buffer, block.offset)
            view[:] = index
            tensors = Tensors({"x": TensorRef(view, block.offset)}, (lease,))
            tensors.park()
            held.append(tensors)
        for tensors in held[1::2]:
            tensors.release()
        kept = held[::2]
        goal, movable, pinned = arena.defragment_goal()
        assert (movable, pinned) == (16, 0) and goal < arena.statistics().fragmentation
        manager = MemoryManager(
            MemoryConfig(), arena=arena, clock=VirtualClock(), events=EventSink(),
            step_bytes=128 * 1024,
        )  # fmt: skip
        turns = 0

        async def count_turns() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        counter = asyncio.get_running_loop().create_task(count_turns())
        first, second = await asyncio.gather(
            manager.defragment("manual"), manager.defragment("guardian")
        )
        counter.cancel()
        assert first is second and first.reason == "manual"
        assert manager.statistics().defrag_runs == 1
        assert first.fragmentation_after <= goal and first.bytes_moved > 0
        assert first.steps >= first.bytes_moved // (128 * 1024) > 1
        assert turns >= first.steps  # the event loop ran between every two steps
        assert first.pause_s <= first.duration_s
        assert [int(t["x"][0]) for t in kept] == list(range(0, 32, 2))
        assert all(bool((t["x"] == t["x"][0]).all()) for t in kept)
        for tensors in kept:
            tensors.release()
    finally:
        arena.close()


def test_a_step_never_moves_a_block_pinned_since_the_last_step(arena: Arena) -> None:
    """Between two steps work may leave the queue: its blocks stay where they are."""
    kept = _fragment(arena)
    visited: set[tuple[Lease, int]] = set()
    pinned = kept[0]
    pinned.unpark()
    where = pinned.leases[0]._blocks[0]
    while (step := arena.defragment_step(128 * 1024, visited)) is not None:
        assert step.blocks_moved <= 1
    assert pinned.leases[0]._blocks[0] == where
    assert all(lease is not pinned.leases[0] for lease, _ in visited)
    for tensors in kept:
        tensors.release()
