"""Actions on their own: defrag and step degrading through their protocols, the gate."""

from __future__ import annotations

from typing import Any

import pytest

from sordino.admission.chain import AdmissionContext
from sordino.admission.gate import TrafficGate
from sordino.config import RuntimeConfig
from sordino.config.self_healing import SelfHealingConfig, parse_action
from sordino.errors import ConfigError, Unavailable
from sordino.events import EventSink
from sordino.execution.chain import ChainExecutor
from sordino.guardian import Controls, Guardian, build_action
from sordino.inference import InferRequest
from sordino.records import QueueSettings
from sordino.testing import VirtualClock
from sordino.testing.guardian import FakeDefragmenter, FakeStepDegrader, ScriptedSeries


def _controls(**extra: Any) -> Controls:
    config = RuntimeConfig()
    executor = ChainExecutor(config, clock=VirtualClock(), events=EventSink())
    return Controls(
        executor=executor,
        gate=TrafficGate(),
        config=SelfHealingConfig(),
        models=list,
        worst_instance=lambda key: None,
        **extra,
    )


async def test_trigger_defrag_reports_before_and_after() -> None:
    """trigger_defrag calls the memory manager and puts its figures in the parameters."""
    memory = FakeDefragmenter(0.8)
    action = build_action(parse_action("trigger_defrag"), None, _controls(defragmenter=memory))
    applied = await action.apply("memory_fragmentation was 80 %")
    assert memory.reasons == ["memory_fragmentation was 80 %"]
    assert applied.parameters["fragmentation_before"] == 0.8
    assert applied.parameters["fragmentation_after"] == 0.05
    assert "fragmentation 80% → 5%" in applied.did
    assert not action.reversible


async def test_degrade_steps_sets_and_restores_the_factor() -> None:
    """degrade_steps 40% asks for 40 % of the steps; revert restores them all."""
    degrader = FakeStepDegrader()
    action = build_action(
        parse_action("degrade_steps 40%"), None, _controls(step_degrader=degrader)
    )
    await action.apply("frame_delay")
    await action.revert()
    assert degrader.factors == [0.4, None]


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ("trigger_defrag", "trigger_defrag needs the memory manager"),
        ("degrade_steps", "degrade_steps needs the step degrader"),
        ("switch_device", "switch_device needs a device chain"),
    ],
)
def test_an_action_this_build_cannot_run_is_refused(action: str, message: str) -> None:
    """Without the capability an action needs, building it fails with what is missing."""
    with pytest.raises(ConfigError, match=message):
        build_action(parse_action(action), None, _controls())


def _context(priority: int, model: str = "m") -> AdmissionContext:
    return AdmissionContext(model, QueueSettings(), {}, priority=priority)


def _admitted(gate: TrafficGate, priority: int, n: int, tag: str | None = None) -> int:
    ok = 0
    for _ in range(n):
        request = InferRequest("m", {}, parameters={"tag": tag} if tag else {})
        try:
            gate(request, _context(priority))
            ok += 1
        except Unavailable:
            pass
    return ok


def test_throttle_lowers_only_the_lowest_priority_by_its_share() -> None:
    """A 20 % throttle refuses exactly 1 in 5 low-priority requests, no high ones."""
    gate = TrafficGate()
    gate.throttle("m", 0.2)
    assert _admitted(gate, 3, 100) == 80
    assert _admitted(gate, 1, 100) == 100
    gate.throttle("m", 0.0)
    assert _admitted(gate, 3, 100) == 100


def test_skip_non_critical_and_shed_low_priority() -> None:
    """Non-critical tags get 503 while skipping; shedding refuses the lowest level."""
    gate = TrafficGate(("non-critical",))
    gate.skip_non_critical(None, True)
    assert _admitted(gate, 2, 10, tag="non-critical") == 0
    assert _admitted(gate, 2, 10, tag="other") == 10
    gate.shed_low_priority("m", True)
    assert _admitted(gate, 3, 10) == 0 and _admitted(gate, 2, 10) == 10
    stats = gate.statistics()
    assert stats.refused_non_critical == 10 and stats.refused_shed == 10


async def test_fragmentation_over_the_threshold_is_defragmented_with_a_record() -> None:
    """memory_fragmentation over 65 % for the window → trigger_defrag → below it; the
    record carries the manager's before/after figures."""
    clock = VirtualClock(start=0.0)
    memory = FakeDefragmenter(0.8)
    controls = _controls(defragmenter=memory)
    series, sink = ScriptedSeries(), EventSink()
    config = SelfHealingConfig.model_validate(
        {"triggers": [{"metric": "memory_fragmentation", "threshold": "65%", "window": "2s",
                       "action": "trigger_defrag"}]}
    )  # fmt: skip
    guardian = Guardian(
        config,
        series=series,
        make_action=lambda spec, model: build_action(spec, model, controls),
        events=sink,
        clock=clock,
        wall=clock.now,
    )
    for t in range(7):
        series.add(t, "m", fragmentation=memory.fragmentation)
        await clock.advance(1.0)
        guardian.evaluate()
        await clock.settle()
    acted, record = [e.payload for e in sink.recent("guardian")]  # at the action, the verdict
    assert acted["verify"] == "pending" and acted["parameters"] == record["parameters"]
    assert record["action"] == "trigger_defrag" and record["verify"] == "cleared"
    assert record["parameters"]["fragmentation_before"] == 0.8
    assert record["parameters"]["fragmentation_after"] == 0.05
    assert record["observed"] == [0.8, 0.8] and record["after"] == 0.05


def test_worse_follows_the_direction_of_the_threshold() -> None:
    """For '> x' a rise past +10 % is worse; for 'below x' a fall past -10 % is."""
    action = build_action(parse_action("alert"), None, _controls())
    assert action.verify(0.10, 0.12, True, ">") == "worse"
    assert action.verify(0.10, 0.105, True, ">") == "not cleared"
    assert action.verify(0.80, 0.70, True, "<") == "worse"
    assert action.verify(0.80, 0.90, True, "<") == "not cleared"
    assert action.verify(0.80, 0.50, False, "<") == "cleared"
