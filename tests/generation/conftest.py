"""Fixtures for the generation tests: the built-in denoiser in a scripted engine.

The model is the real ``digits-diffusion`` ONNX file run by ONNX Runtime in-process
(the scripted executor calls it), on a virtual clock: each batch takes 10 ms of
virtual time, so step order, preemption and degradation are exact and fast.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from sordino.config.iterative import IterativeConfig
from sordino.generation.degrade import StepDegrader
from sordino.generation.pipeline import GenerateParams, Pipeline
from sordino.generation.reuse import Generated
from sordino.inference import ModelKey, Tensor
from sordino.memory.arena import Arena
from sordino.memory.refs import Tensors
from sordino.records import QueueSettings
from sordino.scheduling.batcher import BatchPolicy
from sordino.scheduling.modes import build_controller
from sordino.scheduling.scheduler import ModelScheduler
from sordino.testing import ScriptedExecutor, VirtualClock

KEY = ModelKey("digits-diffusion", "1")


@pytest.fixture(scope="session")
def denoiser() -> ort.InferenceSession:
    data = (
        importlib.resources.files("sordino.models.builtin") / "digits-diffusion.onnx"
    ).read_bytes()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


@dataclass
class Engine:
    pipeline: Pipeline
    scheduler: ModelScheduler
    executor: ScriptedExecutor
    clock: VirtualClock
    arena: Arena
    degrader: StepDegrader

    def params(
        self, prompt: str = "7", *, seed: int = 0, steps: int = 10, guidance: float = 3.0
    ) -> GenerateParams:
        return GenerateParams(prompt, seed, steps, guidance, "default", True)

    async def generate(
        self, params: GenerateParams, *, priority: int = 2, timeout_s: float | None = None
    ) -> tuple[Generated, str]:
        answers = self.pipeline.run(
            params, priority=priority, timeout_s=timeout_s, request_id=None, progress=False
        )
        async with aclosing(answers):
            async for item in answers:
                if isinstance(item, tuple):
                    return item
        raise AssertionError("no result")


@pytest.fixture
def arena() -> Iterator[Arena]:
    arena = Arena(1 << 20)
    yield arena
    arena.close()


def make_engine(
    denoiser: ort.InferenceSession,
    arena: Arena,
    config: IterativeConfig,
    max_batch: int = 16,
    max_queue_size: int = 1024,
) -> tuple[Engine, Any]:
    clock = VirtualClock()

    def run(batch: dict[str, Tensor]) -> dict[str, Tensor]:
        (noise,) = denoiser.run(None, {k: np.ascontiguousarray(v) for k, v in batch.items()})
        return {"noise": noise}

    executor = ScriptedExecutor(clock, latency=lambda rows: 0.01, fn=run, arena=arena)
    scheduler = ModelScheduler(
        KEY,
        batched=True,
        executor=executor,
        controller=build_controller("manual", BatchPolicy(max_batch=max_batch), slo_s=1.0),
        settings=QueueSettings(
            priority_levels=3, default_priority=2, max_queue_size=max_queue_size
        ),
        clock=clock,
    )

    async def no_models(name: str, inputs: object) -> Tensors:
        raise AssertionError("the digits pipeline runs no other model")

    degrader = StepDegrader()
    pipeline = Pipeline(
        KEY,
        config,
        scheduler=scheduler,
        arena=lambda: arena,
        degrader=degrader,
        run_model=no_models,
    )
    return Engine(pipeline, scheduler, executor, clock, arena, degrader), scheduler


@pytest.fixture
async def engine(denoiser: ort.InferenceSession, arena: Arena) -> AsyncIterator[Engine]:
    built, scheduler = make_engine(denoiser, arena, IterativeConfig(guidance=3.0))
    scheduler.start()
    yield built
    await scheduler.close(drain=False)
