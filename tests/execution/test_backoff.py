"""Restart backoff: 1 s doubling to a 60 s cap, reset after a clean period."""

from __future__ import annotations

from sordino.execution.backoff import RestartBackoff
from sordino.testing import VirtualClock


def test_doubles_up_to_the_cap() -> None:
    """Each failure without a clean period waits twice as long, never more than the cap."""
    backoff = RestartBackoff(1.0, 60.0, 600.0)
    clock = VirtualClock()
    delays = []
    for _ in range(9):
        delays.append(backoff.next_delay(clock.now()))
        backoff.started(clock.now() + delays[-1])
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]


async def test_resets_after_a_clean_period() -> None:
    """A worker up longer than reset_after restarts with the first delay again."""
    clock = VirtualClock()
    backoff = RestartBackoff(1.0, 60.0, 600.0)
    for _ in range(4):
        backoff.next_delay(clock.now())
    backoff.started(clock.now())
    await clock.advance(599)
    assert backoff.next_delay(clock.now()) == 16
    backoff.started(clock.now())
    await clock.advance(600)
    assert backoff.next_delay(clock.now()) == 1


def test_failures_while_starting_keep_doubling() -> None:
    """A replacement that fails to start never resets the delay."""
    backoff = RestartBackoff(0.5, 4.0, 10.0)
    assert [backoff.next_delay(100.0) for _ in range(5)] == [0.5, 1, 2, 4, 4]
