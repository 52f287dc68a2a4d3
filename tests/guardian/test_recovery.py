"""Progressive recovery: a ramping instance takes its share of the batches, no more."""

from __future__ import annotations

import asyncio

from sordino.backends.base import ModelRunOptions
from sordino.config.self_healing import RecoveryConfig
from sordino.events import EventSink
from sordino.execution.devices import Device
from sordino.execution.placement import PlacedModel, Signal, TierSlot, choose
from sordino.execution.thread_instance import ThreadInstance
from sordino.guardian import Recovery
from sordino.inference import ModelKey, ModelMetadata
from sordino.testing import VirtualClock

KEY = ModelKey("m", "1")


def _instance(index: int) -> ThreadInstance:
    instance = ThreadInstance(
        KEY,
        index,
        "cpu",
        Device("cpu", ("CPUExecutionProvider",), None, 1),
        "m.onnx",
        run=ModelRunOptions("onnxruntime"),
    )
    instance.state = "ready"
    return instance


async def test_a_ramping_instance_takes_its_share_of_batches() -> None:
    """At share 0.1 the new instance runs 1 batch in 10; at 1.0 it is an equal again."""
    old, new = _instance(0), _instance(1)
    model = PlacedModel(
        KEY,
        "thread",
        ModelMetadata("m", "1", "onnx", (), (), batched=True),
        [TierSlot("cpu", None, [old, new])],
        Signal(),
    )
    new.share = 0.1
    picks = []
    for _ in range(100):
        choice = await choose(model, set(), set())
        assert choice is not None
        picks.append(choice[1].index)
        choice[1].busy = False
    assert picks.count(1) == 10
    new.share = 1.0
    choice = await choose(model, set(), set())
    assert choice is not None and choice[1].index == 0  # equals again: the first idle one


class _Executor:
    async def warm_up(self, key: ModelKey, instance: object, batches: int) -> int:
        return batches


async def test_recovery_warms_then_ramps_and_holds_while_health_fails() -> None:
    """Warm-up first, then 10 % → 50 % → 100 %, each step after a passing deep health
    check; a failing check holds the step (one event per held step)."""
    clock, sink = VirtualClock(start=0.0), EventSink()
    answers = iter(["warming", "warming", None, None, None])
    shares: list[float] = []
    instance = _instance(1)

    async def health(key: ModelKey) -> str | None:
        shares.append(instance.share)
        return next(answers)

    recovery = Recovery(
        RecoveryConfig(warmup_requests=3, ramp_step=1.0),
        executor=_Executor(),  # type: ignore[arg-type]
        health=health,
        clock=clock,
        events=sink,
        start_timeout_s=10,
    )
    task = asyncio.ensure_future(recovery(KEY, [instance]))
    await clock.advance(0.0)
    assert instance.share == 0.0  # no live traffic while warming and held
    for _ in range(6):
        await clock.advance(1.0)
    await task
    assert shares == [0.0, 0.0, 0.0, 0.1, 0.5]
    assert instance.share == 1.0
    (held,) = sink.recent("recovery_held")
    assert "held at 0%: deep health check failed: warming" in held.cause
    (done,) = sink.recent("recovery_done")
    assert done.payload["warmup_requests"] == 3 and done.payload["ramp"] == [0.1, 0.5, 1.0]
