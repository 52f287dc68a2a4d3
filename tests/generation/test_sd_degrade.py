"""Degrade at step boundaries on an export: a running generation's remaining calls re-spaced.

The fixture exports in the scripted engine of test_sd_engine.py (virtual clock, 10 ms a
denoiser batch). A fresh engine knows no pace before its first step, so a request's
deadline cannot cut it before the first step: every cut here is made part way, at a
step boundary (sd_generation.py ``_cut``, diffusers_replan.py).
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from sordino.errors import DeadlineExceeded
from sordino.generation.diffusers_replan import can_replan, replan
from sordino.generation.diffusers_schedulers import scheduler_from_config
from sordino.memory.arena import Arena
from tests.generation.test_sd_engine import (
    KINDS,
    _assert_equals_reference,
    _body,
    _cases,
    _settings,
    make_sd_engine,
)

CUT = [
    ("sd", "pndm"),
    ("sd", "ddim"),
    ("sd", "euler"),
    ("sd", "euler_ancestral"),
    ("sd", "dpmpp_2m_karras"),
    ("sd3", "flow"),
]


@pytest.mark.parametrize(("kind", "name"), CUT, ids=[f"{k}-{n}" for k, n in CUT])
async def test_a_running_generation_is_cut_at_a_step_boundary(
    arena: Arena, kind: str, name: str
) -> None:
    case = next(c for c in _cases(kind) if c["name"] == name)
    engine = make_sd_engine(kind, arena, _settings(case, degrade={"min_steps": 2}))
    body = {**_body(kind, case), "steps": 20}
    try:
        # 20 steps at 10 ms do not fit 0.105 s; the pace is known only after a step.
        (cut,) = await engine.finish(asyncio.ensure_future(engine.generate(body, timeout_s=0.105)))
        cut_calls = engine.timesteps()
        (full,) = await engine.finish(asyncio.ensure_future(engine.generate(body)))
        full_calls = engine.timesteps()[len(cut_calls) :]
    finally:
        await engine.scheduler.close(drain=False)
    assert (full.steps_used, full.degraded) == (20, False)
    assert cut.degraded and cut.steps_requested == 20
    assert 2 <= cut.steps_used < 20
    assert len(cut_calls) < len(full_calls)
    # Cut part way: its first calls are the full run's, then fewer, larger steps.
    assert cut_calls[:2] == full_calls[:2]
    assert [row[0] for row in cut_calls] == sorted((row[0] for row in cut_calls), reverse=True)
    assert cut_calls[-1] != full_calls[len(cut_calls) - 1]
    # A valid image, within a loose bound of the full-step one.
    assert cut.sample is not None and np.isfinite(cut.sample).all()
    difference = np.abs(cut.image.astype(np.float64) - full.image.astype(np.float64)) / 255
    assert difference.mean() < 0.25
    assert engine.degrader.statistics().degraded_requests == 1


async def test_a_cut_keeps_the_floor_and_the_protected_priority(arena: Arena) -> None:
    case = next(c for c in _cases("sd") if c["name"] == "euler")
    degrade = {"min_steps": 2, "floors": {3: 12}}
    engine = make_sd_engine("sd", arena, _settings(case, degrade=degrade))
    body = {**_body("sd", case), "steps": 20}
    try:
        # One batch a step for all three (10 ms): 20 steps fit none of the deadlines.
        tasks = [
            asyncio.ensure_future(engine.generate({**body, "seed": p}, priority=p, timeout_s=t))
            for p, t in ((1, 0.105), (2, 0.105), (3, 0.15))
        ]
        second, third = await engine.finish(*tasks[1:])
        while not tasks[0].done():
            await engine.clock.advance(0.05)
    finally:
        await engine.scheduler.close(drain=False)
    # Protected: never cut, it ran its full plan until its deadline passed, then ended.
    with pytest.raises(DeadlineExceeded, match="deadline passed"):
        await tasks[0]
    assert second.degraded and 2 <= second.steps_used < 20
    assert third.degraded and 12 <= third.steps_used < 20  # its floor
    assert engine.degrader.statistics().degraded_requests == 2


async def test_a_step_factor_set_during_a_run_cuts_it_once(arena: Arena) -> None:
    case = next(c for c in _cases("sd") if c["name"] == "dpmpp_2m_karras")
    engine = make_sd_engine("sd", arena, _settings(case, degrade={"min_steps": 2}))
    body = {**_body("sd", case), "steps": 20}
    try:
        task = asyncio.ensure_future(engine.generate(body))
        await engine.clock.advance(0.035)  # three calls made
        engine.degrader.set_step_factor(0.5)  # the guardian's degrade_steps
        (result,) = await engine.finish(task)
    finally:
        await engine.scheduler.close(drain=False)
    # About half of the 16-17 steps left when the factor came, applied once, not compounded.
    assert result.degraded and 10 <= result.steps_used <= 13
    assert len(engine.timesteps()) == result.steps_used


async def test_without_a_cut_a_deadline_leaves_the_image_diffusers_own(arena: Arena) -> None:
    case = next(c for c in _cases("sd") if c["name"] == "pndm")
    engine = make_sd_engine("sd", arena, _settings(case))
    try:
        task = asyncio.ensure_future(engine.generate(_body("sd", case), timeout_s=10.0))
        (result,) = await engine.finish(task)
    finally:
        await engine.scheduler.close(drain=False)
    assert not result.degraded and result.steps_used == 5
    _assert_equals_reference("sd", case, result)


async def test_a_running_export_generation_ends_at_its_deadline(arena: Arena) -> None:
    case = next(c for c in _cases("sd") if c["name"] == "euler")
    degrade = {"min_steps": 2, "floors": {3: 15}}
    engine = make_sd_engine("sd", arena, _settings(case, degrade=degrade))
    body = {**_body("sd", case), "steps": 20}
    try:
        # Premium is never cut: it runs until its deadline passed, then ends.
        premium = asyncio.ensure_future(engine.generate(body, priority=1, timeout_s=0.105))
        # Priority 3 is cut to its floor of 15 calls, which do not fit 0.105 s either.
        free = asyncio.ensure_future(
            engine.generate({**body, "seed": 3}, priority=3, timeout_s=0.105)
        )
        # Without a deadline: all 20 calls.
        plain = asyncio.ensure_future(engine.generate({**body, "seed": 4}, priority=2))
        while not all(t.done() for t in (premium, free, plain)):
            await engine.clock.advance(0.05)
    finally:
        await engine.scheduler.close(drain=False)
    for task in (premium, free):
        with pytest.raises(DeadlineExceeded, match="deadline passed"):
            await task
    result = await plain
    assert (result.steps_used, result.degraded) == (20, False)
    # One batch a boundary for all three (guided: two rows each): the two with a
    # deadline end at the first boundary past it, after 10-11 calls, not 15 or 20.
    rows = [len(row) for row in engine.timesteps()]
    assert len(rows) == 20 and 10 <= sum(1 for r in rows if r == 6) <= 11
    assert all(r == 2 for r in rows[11:])
    stats = engine.scheduler.statistics()
    assert (stats.succeeded, stats.failed, stats.timed_out, stats.in_flight) == (1, 2, 2, 0)
    assert engine.degrader.statistics().ended_at_deadline == 2
    assert engine.degrader.statistics().degraded_requests == 1  # cut first, then ended
    assert arena.statistics().in_use_bytes == 0


@pytest.mark.parametrize(
    "scheduler",
    [
        "PNDMScheduler",
        "DDIMScheduler",
        "EulerDiscreteScheduler",
        "EulerAncestralDiscreteScheduler",
        "DPMSolverMultistepScheduler",
    ],
)
def test_a_replanned_schedule_runs_from_the_current_point_to_the_end(scheduler: str) -> None:
    config = json.loads((KINDS["sd"][0] / "scheduler" / "scheduler_config.json").read_text())
    sampler = scheduler_from_config({**config, "_class_name": scheduler}).start(20)
    before = sampler.timesteps.copy()
    last = float(before[-1])
    index = 4
    assert can_replan(sampler, index)
    replan(sampler, index, 5)
    assert np.array_equal(sampler.timesteps[: index + 1], before[: index + 1])
    tail = sampler.timesteps[index:]
    assert len(tail) == (6 if scheduler == "PNDMScheduler" else 5)
    assert tail[-1] == last and np.all(np.diff(tail) <= 0)
    if sampler.sigmas is not None:
        assert len(sampler.sigmas) == len(sampler.timesteps) + 1 and sampler.sigmas[-1] == 0
        assert np.all(np.diff(sampler.sigmas[index:]) < 0)


def test_lcm_and_the_pndm_warm_up_keep_their_plan() -> None:
    config = json.loads((KINDS["sd"][0] / "scheduler" / "scheduler_config.json").read_text())
    lcm = scheduler_from_config({**config, "_class_name": "LCMScheduler"}).start(8)
    assert not can_replan(lcm, 3)
    pndm = scheduler_from_config({**config, "_class_name": "PNDMScheduler"}).start(8)
    pndm.counter = 1  # the warm-up's second call is next
    assert not can_replan(pndm, 1)
