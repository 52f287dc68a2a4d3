"""One observer for the scheduler, fanning each event out to every telemetry store.

A scheduler reports what happens to its requests and batches to one
:class:`~sordino.records.SchedulerObserver`. :class:`SchedulerObservers` is that one:
it passes each event, in order, to the Prometheus metrics, the Triton statistics and
the per-second series, so adding a store is one line here and never a change to the
scheduler.
"""

from __future__ import annotations

from sordino.inference import ModelKey
from sordino.records import BatchDone, RequestDone, SchedulerObserver

__all__ = ["SchedulerObservers"]


class SchedulerObservers:
    """A :class:`SchedulerObserver` that forwards every event to several observers."""

    def __init__(self, *observers: SchedulerObserver) -> None:
        self._observers = observers

    def request_done(self, done: RequestDone) -> None:
        for observer in self._observers:
            observer.request_done(done)

    def batch_done(self, done: BatchDone) -> None:
        for observer in self._observers:
            observer.batch_done(done)

    def queue_changed(self, model: ModelKey, depth: int) -> None:
        for observer in self._observers:
            observer.queue_changed(model, depth)
