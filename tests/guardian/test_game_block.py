"""The brief's in-game block: max_batch 1, frame_sync, aggressive reuse, and
frame_delay > 16 ms → skip_non_critical, end to end on the virtual clock."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from sordino.admission.chain import AdmissionContext
from sordino.admission.gate import TrafficGate
from sordino.config import ModelConfig, RuntimeConfig
from sordino.errors import Unavailable
from sordino.events import EventSink
from sordino.execution.chain import ChainExecutor
from sordino.guardian import Controls, Guardian, build_action
from sordino.inference import InferRequest, ModelKey
from sordino.memory.arena import Arena
from sordino.memory.refs import TensorsBuilder
from sordino.scheduling.modes import build_controller
from sordino.scheduling.scheduler import ModelScheduler
from sordino.scheduling.settings import scheduling_for
from sordino.telemetry.timings import TimingSeries
from sordino.testing import ScriptedExecutor, VirtualClock
from sordino.testing.guardian import ScriptedSeries

KEY = ModelKey("m", "1")

# The brief's block as written (runtime read as sordino), comments included.
GAME_BLOCK = """
# 游戏内实时生成配置
scheduler:
  mode: "ultra_low_latency"
  max_batch: 1  # 禁用批处理，保障实时性
  priority: "frame_sync"  # 与游戏帧率同步

memory:
  pool_size: "512MB"  # 严格限制，避免影响游戏主逻辑
  reuse_strategy: "aggressive"

self_healing:
  triggers:
    - metric: "frame_delay"
      threshold: "16ms"  # 超过1帧（60FPS）
      action: "skip_non_critical"  # 跳过非关键生成
"""


def _game() -> RuntimeConfig:
    return RuntimeConfig.model_validate(yaml.safe_load(GAME_BLOCK))


def test_the_game_block_loads_and_each_key_takes_effect() -> None:
    """max_batch is the batch cap, frame_sync gives one-frame deadlines that run late
    instead of being refused, aggressive reuse evicts the largest entry first."""
    config = _game()
    scheduling = scheduling_for(config.scheduler, ModelConfig(name="m"), batched=True)
    assert scheduling.policy.max_batch == 1 and scheduling.mode == "ultra_low_latency"
    assert scheduling.queue.default_timeout_s == pytest.approx(1 / 60)
    assert scheduling.queue.timeout_action == "DELAY" and not scheduling.queue.shed_late
    assert config.memory.reuse_strategy == "largest" and config.memory.pool_size == 512 << 20
    (trigger,) = config.self_healing.triggers
    assert config.self_healing.enabled and trigger.metric == "frame_delay"


def test_max_batch_is_the_dynamic_batching_max_batch_with_its_bounds() -> None:
    """The alias keeps the strategy's bounds and refuses a second, different value."""
    with pytest.raises(ValidationError, match="max_batch"):
        RuntimeConfig.model_validate({"scheduler": {"max_batch": 0}})
    with pytest.raises(ValidationError, match="disagree"):
        RuntimeConfig.model_validate(
            {"scheduler": {"max_batch": 4, "strategies": [
                {"name": "dynamic_batching", "max_batch": 8}]}}
        )  # fmt: skip
    config = RuntimeConfig.model_validate(
        {"scheduler": {"max_batch": 4, "strategies": [
            {"name": "dynamic_batching", "timeout_ms": 2}]}}
    )  # fmt: skip
    assert config.scheduler.dynamic_batching.max_batch == 4
    assert config.scheduler.dynamic_batching.timeout_ms == 2


def _admitted(gate: TrafficGate, tag: str) -> bool:
    request = InferRequest("m", {}, parameters={"tag": tag})
    try:
        gate(request, AdmissionContext("m", scheduling_queue(), {}, priority=2))
    except Unavailable:
        return False
    return True


def scheduling_queue() -> Any:
    return scheduling_for(_game().scheduler, ModelConfig(name="m"), batched=True).queue


async def test_frames_later_than_16ms_make_the_guardian_skip_non_critical() -> None:
    """Generation taking 50 ms a frame: frames run late (not refused), frame_delay goes
    over 16 ms, the guardian skips non-critical requests and still serves critical ones."""
    config = _game()
    scheduling = scheduling_for(config.scheduler, ModelConfig(name="m"), batched=True)
    clock = VirtualClock(start=0.0)
    timings = TimingSeries(wall=clock.now)
    timings.enabled = True
    arena = Arena(1 << 16)
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.05, fn=lambda b: b, arena=arena)
    scheduler = ModelScheduler(
        KEY,
        batched=True,
        executor=executor,
        controller=build_controller(scheduling.mode, scheduling.policy, slo_s=scheduling.slo_s),
        settings=scheduling.queue,
        clock=clock,
        observers=(timings,),
    )
    scheduler.start()
    gate = TrafficGate(config.self_healing.non_critical_tags)
    controls = Controls(
        executor=ChainExecutor(RuntimeConfig(), clock=clock, events=EventSink()),
        gate=gate,
        config=config.self_healing,
        models=list,
        worst_instance=lambda key: None,
    )
    series, events = ScriptedSeries(), EventSink()
    guardian = Guardian(
        config.self_healing,
        series=series,
        make_action=lambda spec, model: build_action(spec, model, controls),
        events=events,
        clock=clock,
        wall=clock.now,
        timings=timings.recent,
    )
    assert _admitted(gate, "non-critical")
    served, readers = 0, list[asyncio.Future[None]]()
    for t in range(40):
        for _ in range(3):  # three frames a second, each taking 50 ms of a 16.7 ms budget
            builder = TensorsBuilder(arena)
            builder.put("x", np.zeros((1, 1), dtype=np.float32))
            request = scheduler.submit(
                builder.finish(), priority=2, timeout_s=scheduling.queue.default_timeout_s
            )
            readers.append(asyncio.ensure_future(_drain(scheduler, request)))
        series.add(t, "m", requests=3)
        await clock.advance(1.0)
        guardian.evaluate()
        await clock.settle()
        served = scheduler.statistics().succeeded
    await asyncio.gather(*readers)
    await scheduler.close()
    arena.close()
    assert served >= 100 and scheduler.statistics().rejected == 0
    (trigger,) = guardian.statistics().triggers
    assert trigger.fired >= 1 and trigger.active == ("skip_non_critical",)
    assert trigger.value is not None and trigger.value > 0.016
    assert not _admitted(gate, "non-critical")
    assert _admitted(gate, "critical")
    assert gate.statistics().refused_non_critical == 1


async def _drain(scheduler: ModelScheduler, request: Any) -> None:
    async for step in scheduler.responses(request):
        step.outputs.release()
