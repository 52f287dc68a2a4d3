"""The guardian's control loop on virtual time: detect, act, verify, escalate, roll back."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sordino.config.self_healing import SelfHealingConfig
from sordino.events import EventSink
from sordino.guardian import Guardian
from sordino.inference import ModelKey
from sordino.records import QueueStatistics, RequestDone, SchedulerStatistics
from sordino.telemetry.series import SeriesRecorder
from sordino.testing import VirtualClock
from sordino.testing.guardian import RecordingActions, ScriptedSeries


def _config(**trigger: Any) -> SelfHealingConfig:
    budget = trigger.pop("budget", 30)
    base: dict[str, Any] = {"metric": "error_rate", "threshold": "5%", "window": "2s"}
    if "actions" not in trigger:
        base["action"] = "alert"
    return SelfHealingConfig.model_validate(
        {"enabled": True, "triggers": [{**base, **trigger}], "max_actions_per_hour": budget}
    )


class Harness:
    """A guardian over scripted rows; ``second(err)`` adds one second and evaluates twice."""

    def __init__(self, config: SelfHealingConfig, *, reversible: bool = True) -> None:
        self.clock = VirtualClock(start=0.0)
        self.series = ScriptedSeries()
        self.events = EventSink()
        self.actions = RecordingActions(self.clock.now, reversible=reversible)
        self.guardian = Guardian(
            config,
            series=self.series,
            make_action=self.actions,
            events=self.events,
            clock=self.clock,
            wall=self.clock.now,
        )
        self.t = 0

    async def second(self, errors: int = 0, requests: int = 100, p99_ms: float = 10.0) -> None:
        self.series.add(self.t, requests=requests, errors=errors, p99_ms=p99_ms)
        self.t += 1
        for _ in range(2):
            await self.clock.advance(0.5)
            self.guardian.evaluate()
            await self.clock.settle()

    def records(self) -> list[dict[str, Any]]:
        """The verdicts and reverts (each action's first record, at action time, left out)."""
        return [e.payload for e in self.events.recent("guardian") if e.payload["phase"] != "acted"]


async def test_fires_once_the_window_holds_and_records_the_verdict() -> None:
    """A full window over the threshold fires the action; its record says it cleared."""
    h = Harness(_config(action="restart_worker"), reversible=False)
    await h.second(errors=20)
    assert h.actions.applied == []  # the window (2 s) is not full yet
    await h.second(errors=20)
    assert [a for _, a in h.actions.applied] == ["restart_worker"]
    for _ in range(4):
        await h.second(errors=0)
    (record,) = h.records()
    assert record["verify"] == "cleared" and record["rolled_back"] is False
    assert record["action"] == "restart_worker" and record["observed"] == [0.2, 0.2]
    assert "error_rate of m was 20 % over 2 s (threshold 5 %)" in record["explanation"]
    assert "error rate 0 %" in record["explanation"]


async def test_escalates_when_the_first_action_does_not_clear() -> None:
    """actions: [a, b] — b runs when a left the condition standing."""
    h = Harness(_config(actions=["shed_low_priority", "scale_workers +2"], cooldown="3s"))
    for _ in range(12):
        await h.second(errors=30)
    names = [a for _, a in h.actions.applied]
    assert names[:2] == ["shed_low_priority", "scale_workers +2"]
    assert h.records()[0]["verify"] == "not cleared"


async def test_a_change_that_makes_p99_worse_is_rolled_back() -> None:
    """A reversible action after which p99 latency grew 5x is reverted at once."""
    h = Harness(_config(action="throttle_requests_by 20%"))
    for _ in range(2):
        await h.second(errors=20, p99_ms=10)
    assert len(h.actions.applied) == 1
    for _ in range(4):
        await h.second(errors=0, p99_ms=80)
    record = h.records()[0]
    assert record["verify"] == "worse" and record["rolled_back"] is True
    assert "p99 latency went from 10 ms to 80 ms" in record["explanation"]
    assert [a for _, a in h.actions.reverted] == ["throttle_requests_by 20%"]


async def test_a_change_that_cleared_is_reverted_after_the_cooldown_clear() -> None:
    """A throttle that worked stays while needed, then is lifted with a second record."""
    h = Harness(_config(action="throttle_requests_by 20%", cooldown="4s"))
    for _ in range(2):
        await h.second(errors=20)
    for _ in range(4):
        await h.second(errors=0)
    assert h.actions.reverted == []  # cleared, but not yet for the whole cooldown
    for _ in range(5):
        await h.second(errors=0)
    assert [a for _, a in h.actions.reverted] == ["throttle_requests_by 20%"]
    first, second = h.records()
    assert first["verify"] == "cleared" and second["reverted"] is True
    assert second["action"] == "revert throttle_requests_by 20%"


@settings(max_examples=40, deadline=None)
@given(
    pattern=st.lists(st.booleans(), min_size=10, max_size=80),
    cooldown=st.integers(min_value=0, max_value=12),
    window=st.integers(min_value=1, max_value=4),
    budget=st.integers(min_value=1, max_value=6),
)
async def test_no_action_during_cooldown_and_budget_never_exceeded(
    pattern: list[bool], cooldown: int, window: int, budget: int
) -> None:
    """Whatever the metric does: actions are at least a cooldown apart, at most budget/hour."""
    h = Harness(
        _config(
            action="throttle_requests_by 10%",
            cooldown=f"{cooldown}s",
            window=f"{window}s",
            verify_window="1s",
            budget=budget,
        )
    )
    for bad in pattern:
        await h.second(errors=50 if bad else 0)
    times = [t for t, _ in h.actions.applied]
    assert all(b - a >= cooldown for a, b in itertools.pairwise(times))
    assert len(times) <= budget  # the whole run lies within one hour
    assert h.guardian.statistics().actions_last_hour == len(times)


@settings(max_examples=25, deadline=None)
@given(
    pattern=st.lists(st.tuples(st.booleans(), st.booleans()), min_size=10, max_size=60),
    budget=st.integers(min_value=1, max_value=5),
)
async def test_the_budget_holds_across_triggers(
    pattern: list[tuple[bool, bool]], budget: int
) -> None:
    """Two triggers firing independently never start more than the budget in an hour."""
    config = SelfHealingConfig.model_validate(
        {
            "max_actions_per_hour": budget,
            "triggers": [
                {"metric": "error_rate", "threshold": "5%", "window": "1s", "cooldown": "1s",
                 "action": "restart_worker"},
                {"metric": "p99_latency", "threshold": "50ms", "window": "1s", "cooldown": "1s",
                 "actions": ["shed_low_priority", "scale_workers +1"]},
            ],
        }
    )  # fmt: skip
    h = Harness(config)
    for errors, slow in pattern:
        await h.second(errors=50 if errors else 0, p99_ms=90 if slow else 5)
    assert len(h.actions.applied) <= budget
    if any(e for e, _ in pattern[2:]) and budget:
        assert h.actions.applied  # the triggers do act when allowed


async def test_a_wall_clock_set_back_leaves_the_guardian_watching() -> None:
    """The series goes on from the new time after the wall clock is set back; the
    guardian counted its windows from its start (a second now in the future), so it saw
    no row and acted on nothing until the clock came back to it."""

    class Wall:
        t = 1000.5

        def __call__(self) -> float:
            return self.t

    queue = QueueStatistics.__new__(QueueStatistics)
    object.__setattr__(queue, "depth", 0)
    stats = SchedulerStatistics.__new__(SchedulerStatistics)
    for name, value in {"model": "m", "version": "1", "queue": queue}.items():
        object.__setattr__(stats, name, value)
    wall, clock = Wall(), VirtualClock(start=0.0)
    series = SeriesRecorder(
        models=lambda: [stats], instances=lambda key: 1, slo_s=lambda key: 1.0, wall=wall
    )
    actions = RecordingActions(clock.now, reversible=False)
    guardian = Guardian(
        _config(action="restart_worker"),
        series=series,
        make_action=actions,
        events=EventSink(),
        clock=clock,
        wall=wall,
    )

    async def second(at: int, errors: int) -> None:
        wall.t = at + 0.5
        for n in range(20):
            failed = n < errors
            outcome, reason = ("failure", "model_error") if failed else ("success", "ok")
            series.request_done(
                RequestDone(ModelKey("m", "1"), outcome, reason, 2, 0.001, 0.001, 0.002)
            )
        series.close_until(at + 1)
        await clock.advance(1.0)
        guardian.evaluate()
        await clock.settle()

    for at in range(1000, 1004):
        await second(at, errors=0)
    for at in range(100, 106):  # set back 904 s, and now one request in two fails
        await second(at, errors=10)
    assert [a for _, a in actions.applied][:1] == ["restart_worker"]  # before: none
