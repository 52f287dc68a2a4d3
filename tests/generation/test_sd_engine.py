"""Stable Diffusion exports in the engine: step caching, preemption and degrade, against diffusers.

The fixture exports (tests/fixtures/sd) run with ONNX Runtime in-process: the denoiser
in a scripted executor on a virtual clock (each batch takes 10 ms of virtual time, as in
conftest.py), the text encoders and the VAE decoder called straight, so the order of the
denoiser's calls, preemption and degradation are exact. The references are diffusers'
own images for the same initial latents (tools/make_sd_references.py).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from sordino.config import ModelConfig
from sordino.config.iterative import IterativeConfig, StepCacheConfig
from sordino.generation.degrade import StepDegrader
from sordino.generation.diffusers_schedulers import scheduler_from_config
from sordino.generation.reuse import Generated
from sordino.generation.stable_diffusion import StableDiffusion
from sordino.generation.stable_diffusion_3 import StableDiffusion3
from sordino.generation.stable_diffusion_xl import StableDiffusionXL
from sordino.inference import ModelKey, Tensor
from sordino.memory.arena import Arena
from sordino.memory.refs import Tensors
from sordino.models.hints import ModelHints, embed_hints
from sordino.models.repository import sources_for
from sordino.records import QueueSettings
from sordino.scheduling.batcher import BatchPolicy
from sordino.scheduling.modes import build_controller
from sordino.scheduling.scheduler import ModelScheduler
from sordino.testing import ScriptedExecutor, VirtualClock, serve_in_thread
from tests.generation.sd_common import sd_request

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sd"
KINDS: dict[str, tuple[Path, str, type[StableDiffusion]]] = {
    "sd": (FIXTURES / "tiny-sd", "pipeline_references.npz", StableDiffusion),
    "sdxl": (FIXTURES / "tiny-sdxl", "sdxl_references.npz", StableDiffusionXL),
    "sd3": (FIXTURES / "tiny-sd3", "sd3_references.npz", StableDiffusion3),
}
NO_REUSE = {"cache_entries": 0, "coalesce": False}


@cache
def _references(kind: str) -> Mapping[str, Any]:
    return dict(np.load(FIXTURES / KINDS[kind][1]))


def _cases(kind: str) -> list[dict[str, Any]]:
    cases = json.loads(str(_references(kind)["cases"]))
    return [c for c in cases if not c.get("image")]


@cache
def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@dataclass
class SDEngine:
    pipeline: StableDiffusion
    scheduler: ModelScheduler
    executor: ScriptedExecutor
    clock: VirtualClock
    degrader: StepDegrader

    async def generate(
        self, body: dict[str, Any], *, priority: int = 2, timeout_s: float | None = None
    ) -> Generated:
        params = self.pipeline.parse(sd_request(self.pipeline.key.name, body))
        answers = self.pipeline.run(
            params, priority=priority, timeout_s=timeout_s, request_id=None, progress=False
        )
        async with aclosing(answers):
            async for item in answers:
                if isinstance(item, tuple):
                    return item[0]
        raise AssertionError("no result")

    async def finish(self, *tasks: asyncio.Future[Generated]) -> list[Generated]:
        while not all(task.done() for task in tasks):
            await self.clock.advance(0.05)
        return [await task for task in tasks]

    def timesteps(self) -> list[list[float]]:
        """The timestep rows of each denoiser call so far."""
        return [np.asarray(c["timestep"]).ravel().tolist() for c in self.executor.contents]


@pytest.fixture
def arena() -> Iterator[Arena]:
    arena = Arena(1 << 24)
    yield arena
    arena.close()


def make_sd_engine(
    kind: str, arena: Arena, settings: dict[str, Any], *, max_batch: int = 16
) -> SDEngine:
    """The export of ``kind`` with ``settings`` (its ``iterative:``) in a scripted engine."""
    export = KINDS[kind][0]
    iterative = IterativeConfig(**{"reuse": NO_REUSE, **settings})
    sources = sources_for(ModelConfig(name="sd", path=export, iterative=iterative))
    paths = {source.name: source.path for source in sources}
    config = sources[-1].config.iterative
    assert config is not None and sources[-1].name == "sd"
    clock = VirtualClock()
    denoiser = _session(paths["sd"])

    def run(batch: dict[str, Tensor]) -> dict[str, Tensor]:
        inputs = {k: np.ascontiguousarray(v) for k, v in batch.items()}
        (noise,) = denoiser.run([config.noise_output], inputs)
        return {config.noise_output: noise}

    executor = ScriptedExecutor(clock, latency=lambda rows: 0.01, fn=run, arena=arena)
    key = ModelKey("sd", "1")
    scheduler = ModelScheduler(
        key,
        batched=True,
        executor=executor,
        controller=build_controller("manual", BatchPolicy(max_batch=max_batch), slo_s=1.0),
        settings=QueueSettings(priority_levels=3, default_priority=2, max_queue_size=1024),
        clock=clock,
    )

    async def run_model(name: str, inputs: Mapping[str, Tensor]) -> Tensors:
        session = _session(paths[name])
        names = [o.name for o in session.get_outputs()]
        values = session.run(names, {k: np.ascontiguousarray(v) for k, v in inputs.items()})
        return Tensors.of(dict(zip(names, values, strict=True)))

    encoder = _session(paths["sd.text_encoder"]).get_inputs()[0].type
    timestep = next(i.type for i in denoiser.get_inputs() if i.name == "timestep")
    degrader = StepDegrader()
    pipeline = KINDS[kind][2](
        key,
        config,
        scheduler=scheduler,
        arena=lambda: arena,
        degrader=degrader,
        run_model=run_model,
        input_ids_dtype="INT32" if "int32" in encoder else "INT64",
        timestep_dtype="INT64" if "int64" in timestep else "FP32",
    )
    scheduler.start()
    return SDEngine(pipeline, scheduler, executor, clock, degrader)


def _settings(case: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"scheduler": case["scheduler"], "scheduler_options": case["options"], **more}


def _body(kind: str, case: dict[str, Any]) -> dict[str, Any]:
    return {**case["request"], "latents": _references(kind)[f"{case['name']}/latents_in"]}


def _assert_equals_reference(kind: str, case: dict[str, Any], result: Generated) -> None:
    references = _references(kind)
    assert result.sample is not None
    np.testing.assert_allclose(result.sample, references[f"{case['name']}/latents_out"], atol=1e-3)
    image = result.image if result.image.ndim == 4 else result.image[None]
    assert np.abs(image / 255.0 - references[f"{case['name']}/image"]).max() <= 0.5 / 255 + 1e-3


ALL_CASES = [(kind, case) for kind in KINDS for case in _cases(kind)]


# -- step caching --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "case"), ALL_CASES, ids=[f"{k}-{c['name']}" for k, c in ALL_CASES]
)
async def test_step_cache_at_threshold_zero_is_bit_identical_and_equals_diffusers(
    arena: Arena, kind: str, case: dict[str, Any]
) -> None:
    results = []
    for step_cache in ({"enabled": False}, {"enabled": True, "threshold": 0.0}):
        engine = make_sd_engine(kind, arena, _settings(case, step_cache=step_cache))
        try:
            (result,) = await engine.finish(
                asyncio.ensure_future(engine.generate(_body(kind, case)))
            )
        finally:
            await engine.scheduler.close(drain=False)
        assert result.cached_steps == 0
        results.append(result)
    off, zero = results
    assert off.sample is not None and zero.sample is not None
    assert np.array_equal(off.sample, zero.sample) and off.png == zero.png
    _assert_equals_reference(kind, case, zero)
    assert arena.statistics().in_use_bytes == 0


@pytest.mark.parametrize(("kind", "scheduler"), [("sd", "pndm"), ("sd", "euler"), ("sd3", "flow")])
async def test_step_cache_skips_denoiser_calls_and_stays_close(
    arena: Arena, kind: str, scheduler: str
) -> None:
    case = next(c for c in _cases(kind) if c["name"] == scheduler)
    body = {**_body(kind, case), "steps": 20}
    runs = []
    for step_cache in ({"enabled": False}, {"enabled": True, "threshold": 0.2}):
        engine = make_sd_engine(kind, arena, _settings(case, step_cache=step_cache))
        try:
            (result,) = await engine.finish(asyncio.ensure_future(engine.generate(body)))
        finally:
            await engine.scheduler.close(drain=False)
        stats = engine.pipeline.step_cache.statistics()
        assert (stats.computed, stats.skipped) == (
            len(engine.executor.contents),
            result.cached_steps,
        )
        runs.append((result, engine.timesteps()))
    (off, off_calls), (cached, calls) = runs
    assert off.cached_steps == 0 and cached.cached_steps > 0
    assert len(calls) == len(off_calls) - cached.cached_steps < len(off_calls)
    assert cached.steps_used == off.steps_used  # every step of the schedule moved the latents
    # The first call (pure noise) and the last (the image) always run.
    assert calls[0] == off_calls[0] and calls[-1] == off_calls[-1]
    difference = np.abs(cached.image.astype(np.float32) - off.image.astype(np.float32)) / 255
    print(f"{kind}-{scheduler}: {len(calls)}/{len(off_calls)} calls, max {difference.max():.4f}")
    assert 0 < float(difference.mean()) < 0.05


def test_an_embedded_step_cache_hint_turns_it_on_for_an_export(tmp_path: Path) -> None:
    export = tmp_path / "tiny-sd"
    shutil.copytree(KINDS["sd"][0], export)
    unet = export / "unet" / "model.onnx"
    embed_hints(KINDS["sd"][0] / "unet" / "model.onnx", unet, ModelHints(step_cache=0.15))
    (generator,) = [s for s in sources_for(ModelConfig(name="sd", path=export)) if s.name == "sd"]
    assert generator.config.iterative is not None
    cache = generator.config.iterative.step_cache
    assert cache.enabled and cache.threshold == 0.15
    # The configuration wins over the hint.
    configured = ModelConfig(
        name="sd", path=export, iterative=IterativeConfig(step_cache=StepCacheConfig(enabled=False))
    )
    (generator,) = [s for s in sources_for(configured) if s.name == "sd"]
    assert generator.config.iterative is not None
    assert not generator.config.iterative.step_cache.enabled


# -- preemption ----------------------------------------------------------------------


@pytest.mark.parametrize("scheduler", ["pndm", "dpmpp_2m_karras", "euler_ancestral"])
async def test_a_preempted_request_resumes_from_the_arena_and_equals_diffusers(
    arena: Arena, scheduler: str
) -> None:
    case = next(c for c in _cases("sd") if c["name"] == scheduler)
    # One guided request a batch: a premium request's steps take every batch it can.
    engine = make_sd_engine("sd", arena, _settings(case), max_batch=2)
    try:
        low = asyncio.ensure_future(engine.generate(_body("sd", case), priority=3))
        await engine.clock.advance(0.025)  # low has run 2 calls and is in its third
        premium = {**_body("sd", case), "prompt": "a red house", "steps": 3, "seed": 5}
        premium.pop("latents")
        high = asyncio.ensure_future(engine.generate(premium, priority=1))
        while not high.done():
            await engine.clock.advance(0.005)
        assert not low.done()
        assert arena.statistics().in_use_bytes > 0  # low's parked state
        (result,) = await engine.finish(low)
    finally:
        await engine.scheduler.close(drain=False)
    first = np.asarray(engine.executor.contents[0]["encoder_hidden_states"])
    order = [
        "low" if np.array_equal(c["encoder_hidden_states"], first) else "high"
        for c in engine.executor.contents
    ]
    highs = order.count("high")
    start = order.index("high")
    assert order[:start] == ["low"] * 3 and order[start : start + highs] == ["high"] * highs
    assert order[start + highs :] == ["low"] * (len(order) - start - highs)
    assert len(order) - start - highs > 0  # low resumed after the premium request
    _assert_equals_reference("sd", case, result)
    assert arena.statistics().in_use_bytes == 0


# -- degrade -------------------------------------------------------------------------


async def test_the_step_factor_degrades_before_the_first_step_to_diffusers_fewer_steps(
    arena: Arena,
) -> None:
    case = next(c for c in _cases("sd") if c["name"] == "dpmpp_2m_karras")
    engine = make_sd_engine(
        "sd", arena, _settings(case, degrade={"min_steps": 2, "floors": {3: 4}}), max_batch=2
    )
    try:
        (plain,) = await engine.finish(
            asyncio.ensure_future(engine.generate({**_body("sd", case), "steps": 3}))
        )
        engine.degrader.set_step_factor(0.6)  # what the guardian's degrade_steps does
        tasks = [
            asyncio.ensure_future(engine.generate(_body("sd", case), priority=p)) for p in (1, 2, 3)
        ]
        premium, degraded, floored = await engine.finish(*tasks)
    finally:
        await engine.scheduler.close(drain=False)
    assert (plain.steps_used, plain.degraded) == (3, False)
    # Protected: all its steps, diffusers' image.
    assert (premium.steps_used, premium.degraded) == (5, False)
    _assert_equals_reference("sd", case, premium)
    # 5 x 0.6 = 3 steps, planned from the start: exactly the image of asking for 3.
    assert (degraded.steps_used, degraded.steps_requested, degraded.degraded) == (3, 5, True)
    assert degraded.sample is not None and plain.sample is not None
    assert np.array_equal(degraded.sample, plain.sample) and degraded.png == plain.png
    # Priority 3's floor is 4 steps.
    assert (floored.steps_used, floored.degraded) == (4, True)
    assert engine.degrader.statistics().steps_saved == 2 + 1


async def test_a_deadline_degrades_an_export_request_at_the_recent_pace(arena: Arena) -> None:
    case = next(c for c in _cases("sd") if c["name"] == "euler")
    engine = make_sd_engine("sd", arena, _settings(case, degrade={"min_steps": 2}))
    try:
        body = {**_body("sd", case), "steps": 20}
        (full,) = await engine.finish(asyncio.ensure_future(engine.generate(body)))
        # Steps take 10 ms here: 20 of them do not fit 0.105 s, 10 do.
        (late,) = await engine.finish(
            asyncio.ensure_future(engine.generate({**body, "seed": 2}, timeout_s=0.105))
        )
    finally:
        await engine.scheduler.close(drain=False)
    assert (full.steps_used, full.degraded) == (20, False)
    assert late.degraded and 2 <= late.steps_used < 20


# -- approximate reuse ---------------------------------------------------------------


@pytest.mark.parametrize(("kind", "scheduler"), [("sd", "pndm"), ("sd", "euler"), ("sd3", "flow")])
async def test_approximate_reuse_starts_a_same_prompt_request_part_way(
    arena: Arena, kind: str, scheduler: str
) -> None:
    case = next(c for c in _cases(kind) if c["name"] == scheduler)
    reuse = {**NO_REUSE, "approximate": True, "approximate_skip": 0.5}
    engine = make_sd_engine(kind, arena, _settings(case, reuse=reuse))
    body = {**case["request"], "steps": 10}
    try:
        (first,) = await engine.finish(asyncio.ensure_future(engine.generate(body)))
        calls = len(engine.executor.contents)
        (second,) = await engine.finish(
            asyncio.ensure_future(engine.generate({**body, "seed": 12}))
        )
        second_calls = len(engine.executor.contents) - calls
        (other,) = await engine.finish(
            asyncio.ensure_future(engine.generate({**body, "prompt": "a red house"}))
        )
    finally:
        await engine.scheduler.close(drain=False)
    assert first.reused_steps == 0 and other.reused_steps == 0  # another prompt: its own run
    assert second.reused_steps == 5 and second.steps_used == 10
    assert second_calls == calls - 5  # the first half of the schedule did not run
    assert engine.pipeline.states.steps_saved == 5
    # Its own noise on the shared start: another image than the first's, a valid one.
    assert second.sample is not None and first.sample is not None
    assert np.isfinite(second.sample).all() and not np.array_equal(second.sample, first.sample)


@pytest.mark.parametrize(
    ("kind", "scheduler"),
    sorted({(k, c["scheduler"]) for k in ("sd", "sd3") for c in _cases(k) if not c["options"]}),
)
def test_the_clean_estimate_inverts_add_noise(kind: str, scheduler: str) -> None:
    config = json.loads((KINDS[kind][0] / "scheduler" / "scheduler_config.json").read_text())
    sampler = scheduler_from_config({**config, "_class_name": scheduler}).start(10)
    rng = np.random.default_rng(0)
    x0, noise = (rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(2))
    index = 3
    noised = sampler.add_noise(x0, noise, index)
    # What the denoiser predicts for exactly that noise (flow matching: the velocity).
    out = noise - x0 if scheduler.startswith("FlowMatch") else noise
    np.testing.assert_allclose(sampler.predict_x0(out, index, noised), x0, atol=1e-4)


async def test_degrade_keeps_a_step_for_image_to_image(arena: Arena) -> None:
    engine = make_sd_engine("sd", arena, {"degrade": {"min_steps": 1}})
    await engine.scheduler.close(drain=False)
    engine.degrader.set_step_factor(0.2)
    pixels = np.zeros((64, 64, 3), dtype=np.uint8).tobytes()
    body = {"prompt": "a cat", "steps": 10, "strength": 0.25, "image": pixels}
    params = engine.pipeline.parse(sd_request("sd", {**body, "width": 64, "height": 64}))
    # 10 x 0.2 = 2 steps would run int(2 x 0.25) = 0 of them: 4 keep one.
    assert engine.pipeline.planned_steps(params, priority=2, now=0.0, deadline=None) == 4
    text = engine.pipeline.parse(sd_request("sd", {"prompt": "a cat", "steps": 10}))
    assert engine.pipeline.planned_steps(text, priority=2, now=0.0, deadline=None) == 2


# -- through a real server -----------------------------------------------------------


def test_a_served_export_reports_cached_steps_and_the_guardian_factor_degrades_it() -> None:
    sources = [
        *sources_for(
            ModelConfig(
                name="sd-cache",
                path=KINDS["sd"][0],
                isolation="thread",
                iterative=IterativeConfig(
                    step_cache=StepCacheConfig(enabled=True, threshold=0.3, max_skips=3)
                ),
            )
        ),
        *sources_for(ModelConfig(name="sd-plain", path=KINDS["sd"][0], isolation="thread")),
    ]
    with serve_in_thread(sources=sources) as server:
        body = {"prompt": "a red house", "steps": 20, "seed": 3}
        with httpx.Client(base_url=server.url, timeout=60) as client:
            cached = client.post("/v2/models/sd-cache/generate", json=body)
            assert cached.status_code == 200, cached.text
            config = client.get("/v2/models/sd-cache/config").json()
            metrics = client.get("/metrics").text
            server.loop.call_soon_threadsafe(server.runtime.step_degrader.set_step_factor, 0.5)
            low = {**body, "steps": 10, "parameters": {"priority": "low"}}
            degraded = client.post("/v2/models/sd-plain/generate", json=low).json()
            high = {**low, "parameters": {"priority": "high"}}
            premium = client.post("/v2/models/sd-plain/generate", json=high).json()
    skipped = cached.json()["parameters"]["cached_steps"]
    assert skipped > 0 and cached.json()["parameters"]["steps_used"] == 20
    assert config["parameters"]["sordino_step_cache"]["string_value"] == "threshold=0.3,max_skips=3"
    assert (
        f'sordino_generation_step_cache_skipped_total{{model="sd-cache"}} {skipped:.1f}' in metrics
    )
    assert degraded["parameters"]["degraded"] and degraded["parameters"]["steps_used"] == 5
    assert premium["parameters"]["steps_used"] == 10 and not premium["parameters"]["degraded"]
