"""The circuit breaker on a virtual clock: open on the threshold, half-open probes, close."""

from __future__ import annotations

from sordino.config import parse_threshold
from sordino.execution.breaker import CircuitBreaker
from sordino.records import BreakerState
from sordino.testing import VirtualClock


def make(clock: VirtualClock, changes: list[tuple[str, str]] | None = None) -> CircuitBreaker:
    def note(
        breaker: CircuitBreaker, before: BreakerState, after: BreakerState, cause: str
    ) -> None:
        if changes is not None:
            changes.append((after, cause))

    return CircuitBreaker(
        "gpu",
        parse_threshold("error_rate>5% for 30s"),
        clock=clock,
        min_requests=10,
        cooldown_s=5.0,
        probes=3,
        on_change=note,
    )


def test_minimum_requests_keep_one_error_from_tripping() -> None:
    """One failure among few batches does not open the breaker."""
    breaker = make(VirtualClock())
    breaker.record(False, 0.01, probe=False)
    for _ in range(3):
        breaker.record(True, 0.01, probe=False)
    assert breaker.state == "closed"


def test_opens_when_the_error_rate_crosses_with_enough_requests() -> None:
    """Past min_requests, an error rate above the threshold opens the breaker."""
    changes: list[tuple[str, str]] = []
    breaker = make(VirtualClock(), changes)
    for _ in range(9):
        breaker.record(True, 0.01, probe=False)
    breaker.record(False, 0.01, probe=False, cause="boom")
    assert breaker.state == "open" and not breaker.allows()
    assert changes[0][0] == "open" and "error_rate 10%" in changes[0][1]


def test_old_failures_leave_the_window() -> None:
    """Failures older than the window no longer count."""
    clock = VirtualClock()
    breaker = make(clock)
    for _ in range(5):
        breaker.record(False, 0.01, probe=False)
    clock._now += 31  # window is 30 s
    for _ in range(10):
        breaker.record(True, 0.01, probe=False)
    assert breaker.state == "closed"


async def test_half_open_after_cooldown_then_probes_close_it() -> None:
    """After the cooldown one probe runs at a time; three successes close the breaker."""
    clock = VirtualClock()
    changes: list[tuple[str, str]] = []
    breaker = make(clock, changes)
    for _ in range(10):
        breaker.record(False, 0.01, probe=False)
    assert breaker.state == "open"
    await clock.advance(4.9)
    assert not breaker.allows()
    await clock.advance(0.2)
    assert breaker.state == "half_open" and breaker.allows()
    for _ in range(3):
        assert breaker.begin() is True
        assert not breaker.allows()  # one probe at a time
        breaker.record(True, 0.01, probe=True)
    assert breaker.state == "closed"
    assert [state for state, _ in changes] == ["open", "half_open", "closed"]
    assert breaker.statistics().window_requests == 0  # a fresh window


async def test_failed_probe_opens_again() -> None:
    """A failing probe reopens the breaker for another cooldown."""
    clock = VirtualClock()
    breaker = make(clock)
    for _ in range(10):
        breaker.record(False, 0.01, probe=False)
    await clock.advance(5)
    assert breaker.begin()
    breaker.record(False, 0.01, probe=True, cause="still broken")
    assert breaker.state == "open"
    assert breaker.statistics().opened == 2


def test_latency_threshold_uses_the_percentile() -> None:
    """A p99 latency threshold opens when slow batches dominate the tail."""
    breaker = CircuitBreaker(
        "cpu", parse_threshold("p99_latency>100ms for 10s"), clock=VirtualClock(), min_requests=5
    )
    for _ in range(4):
        breaker.record(True, 0.01, probe=False)
    breaker.record(True, 0.5, probe=False)
    assert breaker.state == "open"
