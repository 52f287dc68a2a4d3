"""A decoupled model's requests in the scheduler: open after their batch, each ends once."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from typing import Any

import numpy as np
import pytest

from sordino.errors import ModelError, ShuttingDown
from sordino.inference import ModelKey
from sordino.records import QueueSettings
from sordino.scheduling.batcher import BatchPolicy
from sordino.scheduling.modes import build_controller
from sordino.scheduling.scheduler import ModelScheduler
from sordino.scheduling.work import Request
from sordino.testing import ScriptedExecutor, VirtualClock

KEY = ModelKey("m", "1")


def _scheduler(clock: VirtualClock, executor: ScriptedExecutor) -> ModelScheduler:
    policy = BatchPolicy(max_batch=8, max_delay_s=0.010)
    sched = ModelScheduler(
        KEY,
        batched=True,
        executor=executor,
        controller=build_controller("manual", policy, slo_s=0.1),
        settings=QueueSettings(),
        clock=clock,
    )
    sched.start()
    return sched


def _submit(sched: ModelScheduler, value: int) -> Request:
    x = np.full((1, 1), value, dtype=np.int32)
    return sched.submit({"x": x}, priority=2, decoupled=True)


async def _read(sched: ModelScheduler, request: Request) -> list[Any]:
    got: list[Any] = []
    async with aclosing(sched.responses(request)) as steps:
        async for step in steps:
            got.append(("empty" if step.empty else step.outputs["y"].tolist(), step.final))
            step.outputs.release()
    return got


async def test_responses_come_after_the_batch_until_the_final_flag() -> None:
    """The batch ends; the model's responses still reach the reader; the final ends it."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock)
    sched = _scheduler(clock, executor)
    a, b = _submit(sched, 1), _submit(sched, 2)
    readers = [asyncio.create_task(_read(sched, r)) for r in (a, b)]
    await clock.advance(0.02)
    assert executor.batches == [2] and sched.statistics().running_batches == 0
    (channel,) = executor.channels
    channel.response(1, {"y": np.array([[20]])}, False, None)
    channel.response(0, {"y": np.array([[10]])}, True, None)
    channel.response(1, {}, True, None)
    assert await readers[0] == [([[10]], True)]
    assert await readers[1] == [([[20]], False), ("empty", True)]
    stats = sched.statistics()
    assert (stats.succeeded, stats.in_flight) == (2, 0)
    await sched.close()


async def test_a_reader_that_leaves_cancels_and_the_model_is_told() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock)
    sched = _scheduler(clock, executor)
    request = _submit(sched, 1)
    await clock.advance(0.02)
    (channel,) = executor.channels
    channel.response(0, {"y": np.array([[1]])}, False, None)
    async with aclosing(sched.responses(request)) as steps:
        step = await anext(steps)
        step.outputs.release()
    assert executor.cancellations == [(0, 0)]
    channel.response(0, {"y": np.array([[2]])}, False, None)  # too late: dropped
    assert sched.statistics().cancelled == 1
    await sched.close()


async def test_a_drained_close_waits_for_the_final_response() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock)
    sched = _scheduler(clock, executor)
    reader = asyncio.create_task(_read(sched, _submit(sched, 1)))
    await clock.advance(0.02)
    closing = asyncio.create_task(sched.close(drain=True))
    await clock.settle()
    assert not closing.done()
    executor.channels[0].response(0, {"y": np.array([[1]])}, True, None)
    await closing
    assert await reader == [([[1]], True)]


async def test_a_close_without_drain_ends_open_requests_and_tells_the_model() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock)
    sched = _scheduler(clock, executor)
    reader = asyncio.create_task(_read(sched, _submit(sched, 1)))
    await clock.advance(0.02)
    await sched.close(drain=False)
    with pytest.raises(ShuttingDown):
        await reader
    assert executor.cancellations == [(0, 0)]


async def test_a_failed_batch_answers_with_its_own_error() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, fail=ModelError("execute raised ValueError('no')"))
    sched = _scheduler(clock, executor)
    readers = [asyncio.create_task(_read(sched, _submit(sched, v))) for v in (1, 2)]
    await clock.advance(0.02)
    for reader in readers:
        with pytest.raises(ModelError, match="execute raised"):
            await reader
    assert sched.statistics().failed == 2
    await sched.close()
