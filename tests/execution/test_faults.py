"""The fault registry: targets, rates, expiry on the clock, events."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sordino.errors import InvalidRequest, NotFound
from sordino.events import EventSink
from sordino.execution.devices import Device
from sordino.execution.faults import (
    FaultAction,
    FaultRegistry,
    InjectedFault,
    check_target,
    parse_target,
    perform,
)
from sordino.inference import ModelKey
from sordino.testing import VirtualClock


def test_targets_parse() -> None:
    """device:NAME, worker:MODEL and worker:MODEL/N are the three forms."""
    assert str(parse_target("device:gpu0")) == "device:gpu0"
    assert parse_target("worker:digits/2").index == 2
    assert parse_target("worker:digits").index is None
    with pytest.raises(InvalidRequest, match="device:NAME"):
        parse_target("gpu0")


async def test_faults_match_their_target_and_expire_with_an_event() -> None:
    """A fault hits matching batches only, and clears itself after its duration."""
    clock, events = VirtualClock(), EventSink()
    registry = FaultRegistry(clock, events, seed=1)
    registry.inject(parse_target("worker:digits/1"), "latency", latency_s=0.3, duration_s=10)
    assert registry.pick("digits", 0, "cpu") is None
    action = registry.pick("digits", 1, "cpu")
    assert action is not None and (action.kind, action.latency_s) == ("latency", 0.3)
    await clock.advance(10)
    assert registry.pick("digits", 1, "cpu") is None
    kinds = [(e.kind, e.cause) for e in events.recent()]
    assert kinds == [("fault_injected", "chaos API"), ("fault_cleared", "duration elapsed")]


def test_a_tenant_scoped_fault_hits_only_batches_holding_that_tenant() -> None:
    """The batch's tenants (its context's) decide whether a scoped fault hits it."""
    registry = FaultRegistry(VirtualClock(), EventSink(), seed=1)
    registry.inject(parse_target("worker:digits"), "error", tenant="acme")
    assert registry.pick("digits", 0, "cpu") is None
    assert registry.pick("digits", 0, "cpu", frozenset({"beta"})) is None
    action = registry.pick("digits", 0, "cpu", frozenset({"beta", "acme"}))
    assert action is not None and action.kind == "error"


def test_rate_is_a_probability_per_batch() -> None:
    """At rate 0.3 about 30% of batches are hit."""
    registry = FaultRegistry(VirtualClock(), EventSink(), seed=3)
    registry.inject(parse_target("device:cpu"), "error", rate=0.3)
    hits = sum(registry.pick("m", 0, "cpu") is not None for _ in range(2000))
    assert 500 < hits < 700


def test_bad_faults_are_refused() -> None:
    """Unknown kinds and rates outside (0, 1] are refused."""
    registry = FaultRegistry(VirtualClock(), EventSink())
    with pytest.raises(InvalidRequest, match="unknown fault"):
        registry.inject(parse_target("device:cpu"), "meltdown")
    with pytest.raises(InvalidRequest, match="rate"):
        registry.inject(parse_target("device:cpu"), "error", rate=1.5)


def test_oom_is_a_real_allocation_failure() -> None:
    """The oom fault asks the allocator for 1 PiB and gets a real MemoryError."""
    with pytest.raises(MemoryError):
        perform(FaultAction("oom"), in_process=True)


def test_crash_and_hang_never_run_inside_the_server() -> None:
    """On a thread-isolated instance crash and hang become plain errors."""
    for kind in ("crash", "hang"):
        with pytest.raises(InjectedFault, match="thread-isolated"):
            perform(FaultAction(kind), in_process=True)  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Instance:
    key: ModelKey
    index: int
    device: Device
    isolation: str


def test_targets_are_checked_against_what_is_loaded() -> None:
    """A target must name a loaded model, instance or known device; crash needs a process."""
    cpu = Device("cpu", ("CPUExecutionProvider",))
    instances = [
        _Instance(ModelKey("digits", "1"), 0, cpu, "process"),
        _Instance(ModelKey("text", "1"), 1, cpu, "thread"),
    ]
    assert check_target("worker:digits/0", "crash", instances=instances).index == 0
    assert check_target("device:gpu", "error", instances=instances, devices=["gpu"]).name == "gpu"
    with pytest.raises(NotFound, match="devices: cpu, gpu"):
        check_target("device:tpu", "error", instances=instances, devices=["gpu"])
    with pytest.raises(NotFound, match="models: digits, text"):
        check_target("worker:other", "error", instances=instances)
    with pytest.raises(NotFound, match="no instance 3"):
        check_target("worker:digits/3", "error", instances=instances)
    with pytest.raises(InvalidRequest, match="needs process isolation"):
        check_target("device:cpu", "hang", instances=instances)
