"""The scheduler as an engine: requests owned across steps, one outcome each, no block left.

A scripted step model counts down: each step maps ``n`` to ``n - 1`` and says ``done``
at zero; ``n`` is carried to the next step. Its outputs are placed in a real arena,
and every test ends by checking the arena holds nothing once the requests ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest

from sordino.errors import InferenceFailed, QueueTimeout, ShuttingDown
from sordino.inference import ModelKey, StreamSpec, Tensor
from sordino.memory.arena import Arena
from sordino.memory.refs import Tensors, TensorsBuilder
from sordino.records import QueueSettings
from sordino.scheduling.batcher import BatchPolicy
from sordino.scheduling.modes import build_controller
from sordino.scheduling.scheduler import ModelScheduler
from sordino.scheduling.work import StepOutput
from sordino.testing import ScriptedExecutor, VirtualClock

KEY = ModelKey("countdown", "1")
SPEC = StreamSpec(carry=(("n", "n"),), done="done", max_steps=10)


def _step(batch: dict[str, Tensor]) -> dict[str, Tensor]:
    n = batch["n"] - 1
    return {"n": n, "done": n <= 0}


@pytest.fixture
def arena() -> Iterator[Arena]:
    arena = Arena(1 << 16)
    yield arena
    arena.close()


@pytest.fixture
async def engine(
    arena: Arena,
) -> AsyncIterator[tuple[ModelScheduler, ScriptedExecutor, VirtualClock]]:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.01, fn=_step, arena=arena)
    scheduler = ModelScheduler(
        KEY,
        batched=True,
        executor=executor,
        controller=build_controller("manual", BatchPolicy(max_batch=8), slo_s=0.1),
        settings=QueueSettings(max_queue_size=2),
        clock=clock,
    )
    scheduler.start()
    yield scheduler, executor, clock
    await scheduler.close(drain=False)


def _count(arena: Arena, n: int) -> Tensors:
    builder = TensorsBuilder(arena)
    builder.put("n", np.array([[n]], dtype=np.int32))
    return builder.finish()


async def _collect(scheduler: ModelScheduler, request: object) -> list[int]:
    seen = []
    async for step in scheduler.responses(request):  # type: ignore[arg-type]
        assert isinstance(step, StepOutput)
        with step.outputs as outputs:
            seen.append(int(outputs["n"][0, 0]))
    return seen


def _empty(arena: Arena) -> bool:
    return arena.statistics().in_use_bytes == 0


async def test_a_stream_steps_to_its_end_and_is_counted_once(
    engine: tuple[ModelScheduler, ScriptedExecutor, VirtualClock], arena: Arena
) -> None:
    scheduler, executor, clock = engine
    request = scheduler.submit(_count(arena, 3), priority=2, stream=SPEC)
    collecting = asyncio.ensure_future(_collect(scheduler, request))
    await clock.advance(1.0)
    assert await collecting == [2, 1, 0]
    assert executor.batches == [1, 1, 1]
    stats = scheduler.statistics()
    assert (stats.accepted, stats.succeeded, stats.in_flight) == (1, 1, 0)
    assert _empty(arena)


async def test_requests_at_different_steps_share_a_batch(
    engine: tuple[ModelScheduler, ScriptedExecutor, VirtualClock], arena: Arena
) -> None:
    scheduler, executor, clock = engine
    first = scheduler.submit(_count(arena, 3), priority=2, stream=SPEC)
    await clock.advance(0.01)  # the first stream's step 1 runs alone
    second = scheduler.submit(_count(arena, 2), priority=2, stream=SPEC)
    results = asyncio.gather(_collect(scheduler, first), _collect(scheduler, second))
    await clock.advance(1.0)
    assert await results == [[2, 1, 0], [1, 0]]
    assert 2 in executor.batches  # a step of each in one batch
    assert _empty(arena)


async def test_a_reader_that_stops_cancels_the_rest_of_the_stream(
    engine: tuple[ModelScheduler, ScriptedExecutor, VirtualClock], arena: Arena
) -> None:
    scheduler, executor, clock = engine
    request = scheduler.submit(_count(arena, 5), priority=2, stream=SPEC)
    steps = scheduler.responses(request)
    reading = asyncio.ensure_future(anext(steps))
    await clock.advance(0.015)  # step 1 answered, step 2 running
    with (await reading).outputs as outputs:
        assert int(outputs["n"][0, 0]) == 4
    assert scheduler.statistics().running_batches == 1
    await steps.aclose()  # the reader leaves while step 2 runs
    await clock.advance(1.0)
    stats = scheduler.statistics()
    assert stats.cancelled == 1 and stats.in_flight == 0
    assert executor.batches == [1, 1]  # no step after the one running when it left
    assert _empty(arena)


async def test_a_later_step_is_never_refused_by_a_full_queue(
    engine: tuple[ModelScheduler, ScriptedExecutor, VirtualClock], arena: Arena
) -> None:
    scheduler, _, clock = engine
    streams = [scheduler.submit(_count(arena, 2), priority=2, stream=SPEC) for _ in range(2)]
    results = asyncio.gather(*(_collect(scheduler, s) for s in streams))
    await clock.advance(1.0)
    assert await results == [[1, 0], [1, 0]]
    assert scheduler.statistics().rejected == 0
    assert _empty(arena)


async def test_a_step_that_fails_ends_the_stream_with_the_error(
    engine: tuple[ModelScheduler, ScriptedExecutor, VirtualClock], arena: Arena
) -> None:
    scheduler, executor, clock = engine
    request = scheduler.submit(_count(arena, 3), priority=2, stream=SPEC)
    seen: list[int] = []

    async def read() -> None:
        async for step in scheduler.responses(request):
            with step.outputs as outputs:
                seen.append(int(outputs["n"][0, 0]))
            executor.fail = RuntimeError("boom")

    reading = asyncio.ensure_future(read())
    await clock.advance(1.0)
    with pytest.raises(InferenceFailed, match="boom"):
        await reading
    assert seen == [2] and scheduler.statistics().failed == 1
    assert _empty(arena)


async def test_a_step_that_times_out_in_the_queue_frees_its_state(arena: Arena) -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 1.0, fn=_step, arena=arena)
    scheduler = ModelScheduler(
        KEY,
        batched=True,
        executor=executor,
        controller=build_controller("manual", BatchPolicy(max_batch=1), slo_s=0.1),
        settings=QueueSettings(),
        clock=clock,
    )
    scheduler.start()
    busy = scheduler.submit(_count(arena, 1), priority=2, stream=SPEC)
    late = scheduler.submit(_count(arena, 1), priority=2, timeout_s=0.5, stream=SPEC)
    results = asyncio.gather(
        _collect(scheduler, busy), _collect(scheduler, late), return_exceptions=True
    )
    await clock.advance(3.0)
    done, expired = await results
    assert done == [0] and isinstance(expired, QueueTimeout)
    await scheduler.close()
    assert _empty(arena)


async def test_closing_without_drain_ends_running_streams_explicitly(
    engine: tuple[ModelScheduler, ScriptedExecutor, VirtualClock], arena: Arena
) -> None:
    scheduler, _, clock = engine
    request = scheduler.submit(_count(arena, 9), priority=2, stream=SPEC)
    reading = asyncio.ensure_future(_collect(scheduler, request))
    await clock.advance(0.015)
    closing = asyncio.ensure_future(scheduler.close(drain=False))
    await clock.advance(1.0)
    await closing
    with pytest.raises(ShuttingDown):
        await reading
    assert _empty(arena)
