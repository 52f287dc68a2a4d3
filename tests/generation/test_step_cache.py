"""Step caching (iterative.step_cache): skipped denoiser calls, bit-identity at 0, bad config.

The real denoiser runs in a scripted executor on a virtual clock (see conftest.py).
"""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import onnxruntime as ort
import pytest

from sordino.config.iterative import IterativeConfig, ReuseConfig, StepCacheConfig
from sordino.config.loader import validate_config
from sordino.errors import ConfigError
from sordino.generation.reuse import Generated
from sordino.memory.arena import Arena
from tests.generation.conftest import make_engine

STEPS = 20


async def _generate(
    denoiser: ort.InferenceSession, arena: Arena, cache: StepCacheConfig
) -> tuple[Generated, list[set[float]]]:
    """One seeded 20-step generation; its result and the timesteps of each model call."""
    config = IterativeConfig(
        guidance=3.0, reuse=ReuseConfig(cache_entries=0, coalesce=False), step_cache=cache
    )
    engine, scheduler = make_engine(denoiser, arena, config)
    scheduler.start()
    try:
        task = asyncio.ensure_future(engine.generate(engine.params("7", seed=3, steps=STEPS)))
        while not task.done():
            await engine.clock.advance(0.5)
        result, how = await task
    finally:
        await scheduler.close(drain=False)
    assert how == "generated"
    stats = engine.pipeline.step_cache.statistics()
    calls = [set(c["timestep"].ravel().tolist()) for c in engine.executor.contents]
    assert stats.computed == len(calls)
    assert stats.skipped == result.cached_steps
    return result, calls


async def test_the_cache_runs_fewer_denoiser_calls_than_steps(
    denoiser: ort.InferenceSession, arena: Arena
) -> None:
    base, base_calls = await _generate(denoiser, arena, StepCacheConfig())
    cached, calls = await _generate(denoiser, arena, StepCacheConfig(enabled=True))
    assert len(base_calls) == STEPS and base.cached_steps == 0
    assert cached.cached_steps > 0 and len(calls) == STEPS - cached.cached_steps
    assert cached.steps_used == STEPS  # every step of the schedule moved the sample
    # The first step (pure noise) and the last (the image) always run.
    assert calls[0] == base_calls[0] and calls[-1] == base_calls[-1] == {0.0}
    # Close to the uncached image: the same digit, a few grey levels apart at most.
    assert cached.sample is not None and base.sample is not None
    assert not np.array_equal(cached.image, base.image)
    assert np.abs(cached.image.astype(int) - base.image.astype(int)).max() < 64
    assert arena.statistics().in_use_bytes == 0


async def test_max_skips_bounds_the_steps_in_a_row(
    denoiser: ort.InferenceSession, arena: Arena
) -> None:
    _, calls = await _generate(
        denoiser, arena, StepCacheConfig(enabled=True, threshold=1.0, max_skips=1)
    )
    plan = [t for (t,) in (await _generate(denoiser, arena, StepCacheConfig()))[1]]
    ran = [plan.index(t) for (t,) in calls]
    assert max(b - a for a, b in itertools.pairwise(ran)) == 2  # one skipped at most


async def test_threshold_zero_is_bit_identical_to_the_cache_off(
    denoiser: ort.InferenceSession, arena: Arena
) -> None:
    off, off_calls = await _generate(denoiser, arena, StepCacheConfig())
    zero, zero_calls = await _generate(denoiser, arena, StepCacheConfig(enabled=True, threshold=0))
    assert zero.cached_steps == 0 and zero_calls == off_calls
    assert zero.sample is not None and off.sample is not None
    assert zero.sample.tobytes() == off.sample.tobytes() and zero.png == off.png


@pytest.mark.parametrize(
    ("cache", "says"),
    [
        ({"threshold": 1.5}, "models.0.iterative.step_cache.threshold"),
        ({"threshold": -0.1}, "models.0.iterative.step_cache.threshold"),
        ({"max_skips": 0}, "models.0.iterative.step_cache.max_skips"),
        ({"max_skips": 1000}, "models.0.iterative.step_cache.max_skips"),
        ({"enabled": "sometimes"}, "models.0.iterative.step_cache.enabled"),
        ({"treshold": 0.1}, "treshold"),
    ],
)
def test_a_bad_step_cache_is_refused_naming_the_key(cache: dict[str, object], says: str) -> None:
    data = {"models": [{"name": "d", "path": "d.onnx", "iterative": {"step_cache": cache}}]}
    with pytest.raises(ConfigError) as caught:
        validate_config(data)
    assert says in str(caught.value)
