"""A running generation whose deadline has passed ends at the next step boundary.

The digits denoiser in the scripted engine of conftest.py (virtual clock, 10 ms a
batch): a generation past its deadline fails with :class:`DeadlineExceeded` (a queue
timeout's 503) at the next boundary, its state back in the arena; one without a
deadline runs to the end; degrade cuts first, and what still runs late is ended.
"""

from __future__ import annotations

import asyncio

import onnxruntime as ort
import pytest

from sordino.config.iterative import DegradeConfig, IterativeConfig, ReuseConfig
from sordino.errors import DeadlineExceeded, QueueTimeout, Shed
from sordino.generation.degrade import StepDegrader
from sordino.memory.arena import Arena
from sordino.protocol.status import grpc_code_name, http_status
from tests.generation.conftest import Engine, make_engine

NO_REUSE = ReuseConfig(cache_entries=0, coalesce=False)


async def _ended(engine: Engine, task: asyncio.Future[object]) -> DeadlineExceeded:
    await engine.clock.advance(1.0)
    with pytest.raises(DeadlineExceeded) as raised:
        await task
    return raised.value


async def test_a_protected_generation_ends_once_its_deadline_passed(engine: Engine) -> None:
    # Premium is never cut: 20 steps of 10 ms run until the 0.1 s deadline has passed.
    params = engine.params("6", steps=20)
    task = asyncio.ensure_future(engine.generate(params, priority=1, timeout_s=0.1))
    await engine.clock.advance(0.055)
    assert engine.arena.statistics().in_use_bytes > 0  # its state between steps
    error = await _ended(engine, task)
    assert "deadline passed" in str(error)
    # Ended at the first boundary past the deadline: 10 or 11 steps ran, not 20.
    assert 10 <= len(engine.executor.batches) <= 11
    assert isinstance(error, QueueTimeout) and error.reason == "deadline_exceeded"
    assert (http_status(error), grpc_code_name(error)) == (503, "UNAVAILABLE")  # a queue timeout's
    stats = engine.scheduler.statistics()
    assert (stats.failed, stats.timed_out, stats.in_flight) == (1, 1, 0)
    assert engine.degrader.statistics().ended_at_deadline == 1
    assert engine.arena.statistics().in_use_bytes == 0


async def test_without_a_deadline_a_generation_runs_to_the_end(engine: Engine) -> None:
    task = asyncio.ensure_future(engine.generate(engine.params("6", steps=20), priority=1))
    await engine.clock.advance(1.0)
    result, _ = await task
    assert (result.steps_used, result.degraded) == (20, False)
    assert engine.degrader.statistics().ended_at_deadline == 0


async def test_degrade_cuts_before_it_ends(engine: Engine) -> None:
    # 20 steps do not fit 0.1 s, the floor of 4 does: cut, answered, not ended.
    task = asyncio.ensure_future(
        engine.generate(engine.params("6", steps=20), priority=3, timeout_s=0.1)
    )
    await engine.clock.advance(1.0)
    result, _ = await task
    assert result.degraded and 4 <= result.steps_used < 20
    assert engine.degrader.statistics().ended_at_deadline == 0


async def test_a_generation_whose_floor_is_late_is_cut_then_ended(
    denoiser: ort.InferenceSession, arena: Arena
) -> None:
    # Priority 3's floor is 12 steps: at 10 ms a step they cannot fit 0.05 s. Nothing
    # is known of the pace at arrival (admitted); degrade cuts it to its floor, and it
    # ends at the first boundary past its deadline, not after its 12 steps.
    config = IterativeConfig(
        guidance=3.0, reuse=NO_REUSE, degrade=DegradeConfig(min_steps=2, floors={3: 12})
    )
    engine, scheduler = make_engine(denoiser, arena, config)
    scheduler.start()
    try:
        params = engine.params("3", steps=20)
        task = asyncio.ensure_future(engine.generate(params, priority=3, timeout_s=0.05))
        error = await _ended(engine, task)
        assert "deadline passed" in str(error)
        assert 5 <= len(engine.executor.batches) <= 6
        assert arena.statistics().in_use_bytes == 0
        assert engine.degrader.statistics().degraded_requests == 1
        # Now the pace is known: the next one is refused at arrival, never admitted.
        with pytest.raises(Shed, match="even 12 steps take about 120 ms"):
            await engine.generate(engine.params("3", seed=1, steps=20), priority=3, timeout_s=0.05)
        assert 5 <= len(engine.executor.batches) <= 6
        assert engine.degrader.statistics().ended_at_deadline == 1
    finally:
        await scheduler.close(drain=False)


async def test_every_accepted_generation_ends_in_a_result_or_an_explicit_error(
    denoiser: ort.InferenceSession, arena: Arena
) -> None:
    config = IterativeConfig(guidance=3.0, reuse=NO_REUSE, degrade=DegradeConfig(floors={3: 10}))
    engine, scheduler = make_engine(denoiser, arena, config, max_batch=4)  # two a batch
    scheduler.start()
    try:
        tasks = [
            asyncio.ensure_future(
                engine.generate(
                    engine.params(str(i % 10), seed=i, steps=16),
                    priority=1 + i % 3,
                    timeout_s=(None, 0.12, 0.3, 0.6)[i % 4],
                )
            )
            for i in range(12)
        ]
        await engine.clock.advance(5.0)
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await scheduler.close(drain=False)
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert all(isinstance(e, QueueTimeout | Shed) for e in errors), errors  # explicit
    assert any(isinstance(e, DeadlineExceeded) for e in errors)
    assert len(errors) < len(tasks)
    stats = scheduler.statistics()
    assert stats.in_flight == 0 and stats.succeeded + stats.failed == stats.accepted
    assert arena.statistics().in_use_bytes == 0


def test_the_deadline_check_ends_only_a_passed_deadline() -> None:
    degrader = StepDegrader()
    args = {"done": 2, "remaining": 18, "now": 0.0, "deadline": 0.05}
    degrader.check_deadline(**args)  # 18 steps may not fit: degrade's cut, not an end
    degrader.check_deadline(**{**args, "deadline": None, "now": 9.0})
    degrader.check_deadline(**{**args, "remaining": 0, "now": 9.0})  # finished
    with pytest.raises(DeadlineExceeded, match=r"2 steps done, 18 to go"):
        degrader.check_deadline(**{**args, "now": 0.05})
    assert degrader.statistics().ended_at_deadline == 1
