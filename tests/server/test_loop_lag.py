"""The event-loop lag detector: CoDel's standing-queue test and AIMD on the admitted share.

Driven with explicit times (the clock is the caller's), so no real waiting.
"""

from __future__ import annotations

import pytest

from sordino.server.loop_lag import LoopLag

TICK = 1 / 64
INTERVAL = 1 / 8


def _lag() -> LoopLag:
    return LoopLag(0.01, interval_s=INTERVAL, tick_s=TICK)


def _feed(lag: LoopLag, start: float, ticks: int, lag_s: float, busy: float = 0.1) -> float:
    """Observe ``lag_s`` on each of ``ticks`` ticks from ``start``, the loop's thread on
    CPU ``busy`` of the time; return the end time."""
    now = start
    for _ in range(ticks):
        now += TICK
        _cpu[id(lag)] = _cpu.get(id(lag), 0.0) + TICK * busy
        lag.observe(now, lag_s, _cpu[id(lag)])
    return now


_cpu: dict[int, float] = {}
"""Each LoopLag's thread CPU time so far, as ``_feed`` has run it."""


def test_a_loop_on_time_admits_everything() -> None:
    lag = _lag()
    _feed(lag, 0.0, 128, 0.001)
    assert lag.share == 1.0
    assert all(lag.admit() for _ in range(100))


def test_a_standing_lag_halves_the_share_each_interval() -> None:
    lag = _lag()
    _feed(lag, 0.0, 17, 0.015)  # the first tick opens the first interval
    assert lag.share == 0.25


def test_a_lag_standing_far_above_the_target_cuts_in_proportion() -> None:
    """30 times the target: a thirtieth at once, not a half each 100 ms."""
    lag = _lag()
    _feed(lag, 0.0, 9, 0.3)
    assert lag.share == pytest.approx(1 / 30)
    assert lag.top_share == 1.0


def test_a_burst_that_drains_within_the_interval_is_left_alone() -> None:
    """CoDel looks at the smallest lag in an interval: one late tick is not a queue."""
    lag = _lag()
    now = 0.0
    for i in range(128):
        now += TICK
        lag.observe(now, 0.5 if i % 4 == 0 else 0.0)
    assert lag.share == 1.0


def test_the_highest_priority_is_cut_only_once_the_others_are_at_their_floor() -> None:
    """Criticality first: while the lower priorities' share can still fall, the highest
    is admitted whole; once it is at its floor and the loop is still late, a share of
    the highest is admitted, and nothing below it."""
    lag = _lag()
    end = _feed(lag, 0.0, 57, 0.015)  # seven intervals late: 1/128, held at the floor
    assert lag.share == 0.01 and lag.top_share == 1.0
    assert all(lag.admit_top() for _ in range(100))
    assert sum(lag.admit() for _ in range(100)) == 1
    _feed(lag, end, 8, 0.015)  # one more
    assert lag.share == 0.01 and lag.top_share == 0.5
    assert sum(lag.admit_top() for _ in range(100)) == 50
    assert not any(lag.admit() for _ in range(100))


def test_on_the_way_back_the_highest_priority_recovers_first() -> None:
    lag = _lag()
    end = _feed(lag, 0.0, 128, 0.2)
    assert lag.share == 0.01 and lag.top_share == 0.01  # both floors: some still get in
    end = _feed(lag, end, 24, 0.0)  # three intervals on time
    assert lag.top_share == pytest.approx(0.31) and lag.share == 0.01
    assert not lag.admit()
    end = _feed(lag, end, 56, 0.0)  # seven more: the highest is whole again
    assert lag.top_share == 1.0 and lag.share == 0.01
    end = _feed(lag, end, 16, 0.0)  # then the others come back, additively
    assert lag.share == pytest.approx(0.21)
    _feed(lag, end, 128, 0.0)
    assert lag.share == 1.0 and lag.top_share == 1.0


def test_on_time_but_busy_the_share_comes_back_by_a_fiftieth() -> None:
    """A loop on time whose thread was on CPU nearly all the while is on time only
    just: the share comes back five times slower than with time to spare."""
    lag = _lag()
    end = _feed(lag, 0.0, 128, 0.2, busy=0.95)
    assert lag.share == 0.01 and lag.top_share == 0.01
    end = _feed(lag, end, 24, 0.0, busy=0.95)  # three intervals, on time, busy
    assert lag.top_share == pytest.approx(0.07)
    # Then time to spare: the interval under way was busy for most of it (+0.02),
    # the three after it not (+0.1 each).
    end = _feed(lag, end, 32, 0.0, busy=0.5)
    assert lag.top_share == pytest.approx(0.39)
    # Measured on a running loop: CPU time unknown counts as busy.
    unknown = _lag()
    unknown.top_share = unknown.share = 0.01
    now = 0.0
    for _ in range(9):
        now += TICK
        unknown.observe(now, 0.0)
    assert unknown.top_share == pytest.approx(0.03)


def test_exactly_the_share_is_admitted() -> None:
    lag = _lag()
    _feed(lag, 0.0, 17, 0.015)
    assert lag.share == 0.25
    assert sum(lag.admit() for _ in range(400)) == 100


def test_reset_admits_everything_again() -> None:
    lag = _lag()
    _feed(lag, 0.0, 64, 0.5)
    lag.reset()
    assert lag.share == 1.0 and lag.top_share == 1.0 and lag.admit() and lag.admit_top()


def test_target_must_be_positive() -> None:
    with pytest.raises(ValueError, match="target_s"):
        LoopLag(0.0)
