"""Restart backoff: at once after healthy service; 1 s doubling to a cap in a crash loop."""

from __future__ import annotations

import asyncio

from sordino.events import EventSink
from sordino.execution.backoff import RestartBackoff, start_again
from sordino.testing import VirtualClock


def test_a_crash_loop_doubles_up_to_the_cap() -> None:
    """Workers that die right after starting wait twice as long each time, never over the cap."""
    backoff = RestartBackoff(1.0, 60.0, healthy_after_s=30.0, healthy_batches=10)
    clock = VirtualClock()
    delays = []
    for _ in range(9):
        delays.append(backoff.next_delay(clock.now()))
        backoff.started(clock.now() + delays[-1])
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert backoff.crash_loop == 9


def test_failures_while_starting_keep_doubling() -> None:
    """A replacement that fails to start (never started) is a crash loop."""
    backoff = RestartBackoff(0.5, 4.0, healthy_after_s=10.0)
    assert [backoff.next_delay(100.0) for _ in range(5)] == [0.5, 1, 2, 4, 4]


async def test_a_worker_up_for_the_healthy_period_restarts_at_once() -> None:
    """Up restart_backoff_reset without failing: no delay, and the loop starts over."""
    clock = VirtualClock()
    backoff = RestartBackoff(1.0, 60.0, healthy_after_s=30.0, healthy_batches=10)
    for _ in range(4):
        backoff.next_delay(clock.now())
    backoff.started(clock.now())
    await clock.advance(29)
    assert backoff.next_delay(clock.now()) == 16  # not healthy yet: still a crash loop
    backoff.started(clock.now())
    await clock.advance(30)
    assert backoff.next_delay(clock.now()) == 0
    assert backoff.crash_loop == 0
    assert backoff.next_delay(clock.now()) == 1  # the restart failed: the loop starts at 1 s


async def test_a_worker_that_served_enough_batches_restarts_at_once() -> None:
    """A worker killed 2 s after it started, having run its batches, is not a crash loop."""
    clock = VirtualClock()
    backoff = RestartBackoff(1.0, 60.0, healthy_after_s=30.0, healthy_batches=10)
    backoff.started(clock.now())
    for _ in range(9):
        backoff.served()
    await clock.advance(2)
    assert backoff.next_delay(clock.now()) == 1  # 9 batches: not yet healthy
    backoff.started(clock.now() + 1)
    for _ in range(10):
        backoff.served()
    await clock.advance(2)
    assert backoff.next_delay(clock.now()) == 0


async def test_repeated_kills_of_a_serving_worker_never_back_off() -> None:
    """The drill's pattern: killed every 10 s while serving, each restart is immediate."""
    clock = VirtualClock()
    backoff = RestartBackoff(1.0, 60.0, healthy_after_s=30.0, healthy_batches=10)
    delays = []
    for _ in range(30):
        backoff.started(clock.now())
        for _ in range(100):  # 10 s at a modest rate
            backoff.served()
        await clock.advance(10)
        delays.append(backoff.next_delay(clock.now()))
        await clock.advance(1)  # the replacement loads
    assert delays == [0] * 30


def test_batches_of_an_earlier_worker_do_not_count_for_the_next() -> None:
    """The count starts again with each worker: a replacement must earn its own health."""
    backoff = RestartBackoff(1.0, 60.0, healthy_after_s=30.0, healthy_batches=10)
    backoff.started(0.0)
    for _ in range(10):
        backoff.served()
    assert backoff.next_delay(1.0) == 0
    backoff.started(2.0)
    for _ in range(3):
        backoff.served()
    assert backoff.next_delay(3.0) == 1


async def test_start_again_retries_a_failing_start_with_backoff_until_it_starts() -> None:
    """Two failed starts: each an event and a cause, each waiting the next delay; then up."""
    clock, events = VirtualClock(start=0.0), EventSink()
    backoff = RestartBackoff(1.0, 60.0)
    attempts: list[float] = []
    causes: list[str] = []

    async def start() -> None:
        attempts.append(clock.now())
        if len(attempts) < 3:
            raise OSError(f"cannot read model.onnx (try {len(attempts)})")

    restarting = asyncio.create_task(
        start_again(
            start,
            0.5,
            backoff=backoff,
            clock=clock,
            events=events,
            subject="m/1/0",
            closing=lambda: False,
            failed=causes.append,
        )
    )
    await clock.advance(10.0)
    await restarting
    assert attempts == [0.5, 1.5, 3.5]  # after the delay, then 1 s, then 2 s
    assert causes == [
        "restart failed: cannot read model.onnx (try 1)",
        "restart failed: cannot read model.onnx (try 2)",
    ]
    failed = events.recent("worker_start_failed")
    assert [e.payload["retry_in_s"] for e in failed] == [1.0, 2.0]


async def test_start_again_stops_trying_once_closing() -> None:
    """A server going away ends the loop without another start."""
    clock, events = VirtualClock(start=0.0), EventSink()
    closing = False
    attempts = 0

    async def start() -> None:
        nonlocal attempts, closing
        attempts += 1
        closing = True
        raise OSError("no")

    restarting = asyncio.create_task(
        start_again(
            start,
            0.0,
            backoff=RestartBackoff(1.0, 60.0),
            clock=clock,
            events=events,
            subject="m/1/0",
            closing=lambda: closing,
            failed=lambda cause: None,
        )
    )
    await clock.advance(10.0)
    await restarting
    assert attempts == 1
