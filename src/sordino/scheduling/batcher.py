"""Batch formation: given the queue and the current policy, run now or wait.

The batcher is a pure decision over the queue's state; the scheduler owns the
waiting. It never polls: it returns the time at which waiting stops helping, and
the scheduler sleeps until then or until something arrives.
"""

from __future__ import annotations

from dataclasses import dataclass

from sordino.scheduling.queue import RequestQueue
from sordino.scheduling.work import Signature

__all__ = ["BatchPolicy", "Decision", "Dispatch", "Wait", "decide"]


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """How batches are formed for one model at this moment.

    ``max_batch`` caps the rows of one batch (1 disables batching). ``min_batch``
    rows are waited for until ``max_delay_s`` passes. A batch that reaches one of the
    ``preferred`` sizes runs at once. With ``predictive`` set, the batcher does not
    wait when the recent arrival rate says not even one more row will come before the
    delay passes, so at light load a request never pays the delay.
    """

    max_batch: int
    min_batch: int = 1
    max_delay_s: float = 0.0
    preferred: tuple[int, ...] = ()
    predictive: bool = False


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run a batch now: up to ``rows`` rows of items matching ``signature``."""

    signature: Signature
    rows: int


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to run yet; decide again at ``until`` (or when something arrives)."""

    until: float


Decision = Dispatch | Wait


def decide(
    queue: RequestQueue, policy: BatchPolicy, now: float, arrival_rate: float
) -> Decision | None:
    """Return the batch to run next, or when to look again; None if the queue is empty.

    ``arrival_rate`` is the recent rate of new rows per second (used only when the
    policy is predictive).
    """
    head = queue.head()
    if head is None:
        return None
    target = max(1, policy.max_batch)
    available = queue.compatible_rows(head.signature, target)
    if available >= target:
        return Dispatch(head.signature, target)
    if available >= policy.min_batch:
        reached = [p for p in policy.preferred if p <= available]
        if reached:
            return Dispatch(head.signature, max(reached))
    oldest = queue.oldest_arrival()
    expiry = (oldest if oldest is not None else now) + policy.max_delay_s
    if now >= expiry:
        return Dispatch(head.signature, target)
    # Run at once only when not even one more row is expected before expiry (light
    # load). Asking that the wait fill the batch was self-fulfilling under a closed
    # loop whose requests trickle in (grpc.aio hands the loop a few calls at a
    # time): each lone request ran at once, small batches made the server slower,
    # the trickle thinner and the batches smaller (issue 16: mean batch 1.7 at 64
    # in flight over gRPC). Asking that it double the batch still left them small
    # (bench/bench_grpc.py; docs/benchmarks.md, "Issue 16"). The wait stays bounded
    # by max_delay_s, which the adaptive controller cuts when p99 passes the SLO.
    expected = arrival_rate * (expiry - now)
    if policy.predictive and available >= policy.min_batch and expected < 1.0:
        return Dispatch(head.signature, target)
    return Wait(expiry)
