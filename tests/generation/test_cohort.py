"""Cohort: request-level batching lets generations in one whole cohort at a time."""

from __future__ import annotations

import asyncio

import pytest

from sordino.generation.cohort import Cohort


async def _settle() -> None:
    """Let every task run until it waits (a shielded wait takes a few loop turns)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def _entered(cohort: Cohort) -> asyncio.Task[None]:
    task = asyncio.create_task(cohort.enter())
    await _settle()
    return task


async def test_step_batching_never_waits() -> None:
    cohort = Cohort(enabled=False)
    for _ in range(3):
        assert (await _entered(cohort)).done()


async def test_requests_arriving_meanwhile_start_together_after_the_cohort() -> None:
    cohort = Cohort(enabled=True)
    assert (await _entered(cohort)).done()  # the first one runs at once
    second, third = await _entered(cohort), await _entered(cohort)
    assert not second.done() and not third.done()
    cohort.leave()  # the running cohort ended: the two waiting form the next one
    await _settle()
    assert second.done() and third.done()
    fourth = await _entered(cohort)
    cohort.leave()
    await _settle()
    assert not fourth.done()  # one of the cohort is still running
    cohort.leave()
    await _settle()
    assert fourth.done()


async def test_a_request_cancelled_while_waiting_is_not_counted_in_the_cohort() -> None:
    cohort = Cohort(enabled=True)
    await _entered(cohort)
    leaving, staying = await _entered(cohort), await _entered(cohort)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    cohort.leave()
    await _settle()
    assert staying.done()
    cohort.leave()  # the only one of its cohort: the next request runs at once
    assert (await _entered(cohort)).done()
