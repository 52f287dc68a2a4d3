"""One observer for the scheduler, fanning each event out to every telemetry store.

A scheduler reports what happens to its requests and batches to one
:class:`~sordino.records.SchedulerObserver`. :class:`SchedulerObservers` is that one:
it passes each event, in order, to the Prometheus metrics, the Triton statistics and
the per-second series, so adding a store is one line here and never a change to the
scheduler.
"""

from __future__ import annotations

from sordino.inference import ModelKey
from sordino.records import Outcome, SchedulerObserver

__all__ = ["SchedulerObservers"]


class SchedulerObservers:
    """A :class:`SchedulerObserver` that forwards every event to several observers."""

    def __init__(self, *observers: SchedulerObserver) -> None:
        self._observers = observers

    def request_done(
        self,
        model: ModelKey,
        outcome: Outcome,
        reason: str,
        *,
        priority: int,
        queue_s: float,
        compute_s: float,
        total_s: float,
    ) -> None:
        for observer in self._observers:
            observer.request_done(
                model,
                outcome,
                reason,
                priority=priority,
                queue_s=queue_s,
                compute_s=compute_s,
                total_s=total_s,
            )

    def batch_done(
        self,
        model: ModelKey,
        *,
        rows: int,
        requests: int,
        input_s: float,
        infer_s: float,
        output_s: float,
        ok: bool,
    ) -> None:
        for observer in self._observers:
            observer.batch_done(
                model,
                rows=rows,
                requests=requests,
                input_s=input_s,
                infer_s=infer_s,
                output_s=output_s,
                ok=ok,
            )

    def queue_changed(self, model: ModelKey, depth: int) -> None:
        for observer in self._observers:
            observer.queue_changed(model, depth)
