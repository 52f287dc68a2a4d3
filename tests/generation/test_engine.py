"""The sampler loop inside the engine: step-level batching, preemption, cancellation, degrading.

The real denoiser runs in a scripted executor on a virtual clock (see conftest.py).
"""

from __future__ import annotations

import asyncio

import numpy as np
import onnxruntime as ort
import pytest

from sordino.config.iterative import DegradeConfig, IterativeConfig, ReuseConfig
from sordino.generation.degrade import StepDegrader
from sordino.memory.arena import Arena
from tests.generation.conftest import Engine, make_engine

NO_REUSE = ReuseConfig(cache_entries=0, coalesce=False)


async def test_step_mixed_batches_equal_solo_runs(engine: Engine) -> None:
    prompts = [("7", 1, 10), ("three", 2, 6), ("a 0", 3, 8)]
    solo = []
    for prompt, seed, steps in prompts:
        task = asyncio.ensure_future(engine.generate(engine.params(prompt, seed=seed, steps=steps)))
        await engine.clock.advance(1.0)
        solo.append((await task)[0])
    assert all(rows == 2 for rows in engine.executor.batches)  # alone: its two guidance rows
    engine.executor.batches.clear()
    engine.pipeline.results = type(engine.pipeline.results)(0)  # no cached results this time
    tasks = []
    for prompt, seed, steps in prompts:  # each joins the running ones a step later
        params = engine.params(prompt, seed=seed, steps=steps)
        tasks.append(asyncio.ensure_future(engine.generate(params)))
        await engine.clock.advance(0.01)
    await engine.clock.advance(1.0)
    mixed = [(await task)[0] for task in tasks]
    assert max(engine.executor.batches) == 6  # three requests, at different timesteps, one batch
    timesteps = [set(c["timestep"].ravel().tolist()) for c in engine.executor.contents]
    assert any(len(t) == 3 for t in timesteps)
    for alone, together in zip(solo, mixed, strict=True):
        assert alone.sample is not None and together.sample is not None
        assert float(np.max(np.abs(alone.sample - together.sample))) <= 1e-4
        assert alone.png == together.png
    assert engine.arena.statistics().in_use_bytes == 0


async def test_a_new_request_joins_the_next_batch_not_the_next_generation(engine: Engine) -> None:
    first = asyncio.ensure_future(engine.generate(engine.params("1", steps=20)))
    await engine.clock.advance(0.05)  # the first generation is 5 steps in
    second = asyncio.ensure_future(engine.generate(engine.params("2", steps=4)))
    await engine.clock.advance(0.06)
    assert second.done() and not first.done()  # 4 steps in 4-5 batches, beside the first
    await engine.clock.advance(1.0)
    assert (await first)[0].steps_used == 20


async def test_high_priority_steps_go_first_and_low_resumes(
    denoiser: ort.InferenceSession, arena: Arena
) -> None:
    config = IterativeConfig(guidance=3.0, reuse=NO_REUSE)
    engine, scheduler = make_engine(denoiser, arena, config, max_batch=2)  # one request a batch
    scheduler.start()
    try:
        low = asyncio.ensure_future(engine.generate(engine.params("1", steps=6), priority=3))
        await engine.clock.advance(0.025)  # low has run 2 steps and is in its third
        high = asyncio.ensure_future(engine.generate(engine.params("8", steps=4), priority=1))
        await engine.clock.advance(1.0)
        assert (await high)[0].steps_used == 4 and (await low)[0].steps_used == 6
        order = [int(np.argmax(c["condition"][0])) for c in engine.executor.contents]
        # low's third step was running when high came; then all of high's, then low resumes.
        assert order == [1, 1, 1, 8, 8, 8, 8, 1, 1, 1]
        # The paused state stayed in the arena; everything is back once both ended.
        assert arena.statistics().in_use_bytes == 0
    finally:
        await scheduler.close(drain=False)


async def test_cancelling_frees_the_state_at_the_next_boundary(engine: Engine) -> None:
    task = asyncio.ensure_future(engine.generate(engine.params("5", steps=30)))
    await engine.clock.advance(0.055)
    assert engine.arena.statistics().in_use_bytes > 0  # the state of the next step
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await engine.clock.advance(0.05)
    ran = len(engine.executor.batches)
    await engine.clock.advance(1.0)
    assert len(engine.executor.batches) == ran  # no step after the cancel
    stats = engine.scheduler.statistics()
    assert (stats.cancelled, stats.in_flight) == (1, 0)
    assert engine.arena.statistics().in_use_bytes == 0


async def test_the_step_factor_degrades_low_priority_never_below_the_floor(engine: Engine) -> None:
    engine.degrader.set_step_factor(0.25)
    free = asyncio.ensure_future(engine.generate(engine.params("4", steps=20), priority=3))
    premium = asyncio.ensure_future(engine.generate(engine.params("4", steps=20), priority=1))
    await engine.clock.advance(2.0)
    degraded, _ = await free
    kept, _ = await premium
    assert kept.steps_used == 20 and not kept.degraded  # premium never degrades by default
    assert degraded.degraded and 4 <= degraded.steps_used < 20  # the default floor is 4
    assert engine.degrader.degraded_requests == 1
    assert engine.degrader.steps_saved == 20 - degraded.steps_used
    engine.degrader.set_step_factor(None)
    (again, _), _ = await asyncio.gather(
        engine.generate(engine.params("4", seed=9, steps=20), priority=3),
        engine.clock.advance(2.0),
    )
    assert again.steps_used == 20


async def test_a_deadline_degrades_instead_of_dropping(engine: Engine) -> None:
    # 20 steps take 0.2 s of virtual time; a 0.1 s deadline gets fewer steps, not a 503.
    task = asyncio.ensure_future(
        engine.generate(engine.params("6", steps=20), priority=3, timeout_s=0.1)
    )
    await engine.clock.advance(1.0)
    result, _ = await task
    assert result.degraded and 4 <= result.steps_used < 20


def test_degrade_floors_and_protection() -> None:
    degrader = StepDegrader()
    config = DegradeConfig(min_steps=4, floors={3: 6}, protect_priority=1)
    args = {"done": 2, "remaining": 18, "now": 0.0, "deadline": 0.05, "step_s": 0.01}
    assert degrader.remaining(config, priority=1, **args) == 18  # protected
    assert degrader.remaining(config, priority=2, **args) == 5  # fits the deadline
    assert degrader.remaining(config, priority=3, **args) == 5  # 6 in all: 2 done + 4 more
    tight = {**args, "deadline": 0.0}
    assert degrader.remaining(config, priority=2, **tight) == 2  # the floor of 4 in all
    unprotected = DegradeConfig(protect_priority=0)
    assert degrader.remaining(unprotected, priority=1, **tight) == 2
    assert degrader.remaining(DegradeConfig(enabled=False), priority=3, **tight) == 18
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        degrader.set_step_factor(0.0)
    with pytest.raises(ValueError):
        degrader.set_step_factor(1.5)


async def test_cache_and_coalescing_return_identical_bytes(engine: Engine) -> None:
    params = engine.params("9", seed=42, steps=8)
    both = asyncio.gather(engine.generate(params), engine.generate(params))
    await engine.clock.advance(1.0)
    (first, how1), (second, how2) = await both
    assert {how1, how2} == {"generated", "coalesced"}
    assert first.png == second.png
    assert engine.scheduler.statistics().accepted == 1  # one generation for both
    third = asyncio.ensure_future(engine.generate(params))
    await engine.clock.advance(0.001)
    cached, how3 = await third
    assert how3 == "cache" and cached.png == first.png
    other_tenant = type(params)(params.prompt, 42, 8, 3.0, "someone-else", True)
    fourth = asyncio.ensure_future(engine.generate(other_tenant))
    await engine.clock.advance(1.0)
    assert (await fourth)[1] == "generated"  # caches are per tenant
    assert (await fourth)[0].png == first.png  # the same seed: the same image
    # In flight, too, another tenant's identical request is not coalesced with this one.
    fifth = params.__class__(params.prompt, 43, 8, 3.0, "tenant-a", True)
    sixth = params.__class__(params.prompt, 43, 8, 3.0, "tenant-b", True)
    pair = asyncio.gather(engine.generate(fifth), engine.generate(sixth))
    await engine.clock.advance(1.0)
    (_, how5), (_, how6) = await pair
    assert (how5, how6) == ("generated", "generated")


async def test_approximate_reuse_skips_steps_from_a_cached_state(
    denoiser: ort.InferenceSession, arena: Arena
) -> None:
    config = IterativeConfig(
        guidance=3.0, reuse=ReuseConfig(cache_entries=0, coalesce=False, approximate=True)
    )
    engine, scheduler = make_engine(denoiser, arena, config)
    scheduler.start()
    try:
        first = asyncio.ensure_future(engine.generate(engine.params("2", seed=1, steps=20)))
        await engine.clock.advance(1.0)
        full, _ = await first
        assert full.reused_steps == 0 and full.steps_used == 20
        second = asyncio.ensure_future(engine.generate(engine.params("two", seed=2, steps=20)))
        await engine.clock.advance(1.0)
        reused, _ = await second
        assert reused.reused_steps == 10 and reused.steps_used == 20
        assert len(engine.executor.batches) == 30  # 20 + only the last 10 of the second
        assert engine.pipeline.states.hits == 1 and engine.pipeline.states.steps_saved == 10
        assert reused.png != full.png  # its own seed re-noised the cached state
    finally:
        await scheduler.close(drain=False)


async def test_free_requests_fill_at_most_half_the_queue_premium_still_enters(
    denoiser: ort.InferenceSession, arena: Arena
) -> None:
    from sordino.errors import Shed

    config = IterativeConfig(guidance=3.0, reuse=NO_REUSE)
    engine, scheduler = make_engine(denoiser, arena, config, max_batch=2, max_queue_size=4)
    scheduler.start()
    try:
        free = [
            asyncio.ensure_future(engine.generate(engine.params(str(d), steps=5), priority=3))
            for d in range(3)
        ]
        await engine.clock.advance(0.001)  # all three arrived; one step runs at a time
        with pytest.raises(Shed, match="kept for priority 1"):
            await free[2]
        premium = asyncio.ensure_future(engine.generate(engine.params("8", steps=5), priority=1))
        await engine.clock.advance(1.0)
        assert (await premium)[0].steps_used == 5
        assert [(await f)[0].steps_used for f in free[:2]] == [5, 5]
    finally:
        await scheduler.close(drain=False)
