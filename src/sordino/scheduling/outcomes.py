"""How each request of one model version ends, once, and the counts that leaves.

Every accepted request ends in exactly one outcome — success, failure or cancellation
— through :meth:`Outcomes.finish`, which releases what the request holds (its own
inputs, its step region, its stepper, a decoupled model's channel) and tells the
observers once. The counts :meth:`ModelScheduler.statistics
<sordino.scheduling.scheduler.ModelScheduler.statistics>` reports are kept here, beside
the observers they mirror.

The observers hear of a request's end and of a batch a moment later, in order: the
events wait in a list that one callback, scheduled on the event loop behind the
requests' own wake-ups, hands on. So a request answered by a batch is on its way to its
client before the telemetry of its batch is counted (at one request in flight that
is the response's latency), and a batch's events cost one callback, however many
requests it held. A queue change told while events wait joins them, so every observer
sees the events in the order they happened; :meth:`Outcomes.flush` hands them on at
once (a scheduler that closes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from sordino.clock import Clock
from sordino.errors import SordinoError
from sordino.inference import ModelKey
from sordino.records import BatchDone, Outcome, RequestDone, SchedulerObserver
from sordino.scheduling.parking import release_unrun
from sordino.scheduling.queue import RequestQueue
from sordino.scheduling.work import Request, StepOutput, WorkItem

__all__ = ["Outcomes", "discard_outputs"]


class Outcomes:
    """The ends of one model version's requests: outcomes, counts and observers."""

    def __init__(
        self,
        model: ModelKey,
        *,
        clock: Clock,
        queue: RequestQueue,
        observers: Sequence[SchedulerObserver] = (),
    ) -> None:
        self.model = model
        self._clock = clock
        self._queue = queue
        self._observers = tuple(observers)
        self._later: list[tuple[int, Any]] = []  # (event, its record or the depth)
        self.accepted = self.succeeded = self.failed = self.cancelled = 0
        self.rejected = self.timed_out = self.batches = self.batched_rows = 0
        self.isolated = 0
        self._answering: set[Request] = set()  # decoupled requests whose batch has run
        self.answered = asyncio.Event()
        """Set while no decoupled request is being answered."""
        self.answered.set()

    def in_flight(self) -> int:
        """Requests accepted and not ended yet."""
        return self.accepted - self.succeeded - self.failed - self.cancelled

    def answering(self, request: Request) -> None:
        """A decoupled ``request`` is answered by its model until it ends."""
        self._answering.add(request)
        self.answered.clear()

    def unanswered(self, request: Request) -> None:
        """A decoupled ``request`` goes back to the queue (its model runs it again): the
        model of its last batch no longer answers it."""
        request.stop = None
        self._not_answering(request)

    def _not_answering(self, request: Request) -> None:
        self._answering.discard(request)
        if not self._answering:
            self.answered.set()

    def still_answering(self) -> list[Request]:
        """The decoupled requests being answered now."""
        return list(self._answering)

    def drop(self, item: WorkItem, error: SordinoError) -> None:
        """A queued item will never run: release its inputs and fail its request."""
        release_unrun(item.inputs)
        if item.request is not None:
            item.request.item = None
            self.fail(item.request, error)

    def step_failed(self, item: WorkItem, error: SordinoError, compute_s: float) -> None:
        request = item.request
        if request is None or request.finished:
            return
        request.item = None
        request.compute_s += compute_s
        self.fail(request, error)

    def fail(self, request: Request, error: SordinoError) -> None:
        if request.finished:
            return
        request.outputs.put_nowait(error)
        self.finish(request, "failure", error.reason)

    def finish(
        self, request: Request, outcome: Outcome, reason: str, now: float | None = None
    ) -> None:
        """End ``request`` with ``outcome``; ``now``: the time it ended, when the caller
        read it already (once for a whole batch)."""
        request.state = "finished"
        request.outcome = outcome
        request.inputs.release()
        stop, request.stop = request.stop, None
        if stop is not None:
            stop()  # a request that ended before the model did: the model is told
            self._not_answering(request)
        region = request.region
        if region is not None:
            region.close()  # back to the arena once its last outputs are released
        if request.stepper is not None:
            request.stepper.close()
        if outcome == "success":
            self.succeeded += 1
        elif outcome == "cancelled":
            self.cancelled += 1
            discard_outputs(request)
        else:
            self.failed += 1
        if now is None:
            now = self._clock.now()
        late = None
        if request.timeout_s:
            late = max(0.0, now - request.arrival - request.timeout_s)
        done = RequestDone(
            self.model,
            outcome,
            reason,
            request.priority,
            request.queue_s,
            request.compute_s,
            now - request.arrival,
            late,
            tuple(request.step_bytes) if request.step_bytes else (),
            (region.planned_bytes, region.peak_bytes, region.fallbacks)
            if region is not None and region.planned_bytes
            else (),
            request.id,
        )
        self._tell(_REQUEST_DONE, done)

    def answered_elsewhere(self, priority: int, total_s: float, request_id: str | None) -> None:
        """A request answered without being queued (from the response cache): accepted
        and succeeded at once, and so told to the observers."""
        self.accepted += 1
        self.succeeded += 1
        done = RequestDone(
            self.model, "success", "ok", priority, 0.0, 0.0, total_s, request_id=request_id
        )
        self._tell(_REQUEST_DONE, done)

    def batch_observed(
        self, rows: int, requests: int, input_s: float, infer_s: float, output_s: float, *, ok: bool
    ) -> None:
        done = BatchDone(self.model, rows, requests, input_s, infer_s, output_s, ok)
        self._tell(_BATCH_DONE, done)

    def queue_changed(self) -> None:
        if self._later:  # after the events waiting, as it happened after them
            self._later.append((_QUEUE_CHANGED, len(self._queue)))
            return
        for observer in self._observers:
            observer.queue_changed(self.model, len(self._queue))

    def _tell(self, event: int, record: Any) -> None:
        """Have the observers hear of ``record`` from the flush scheduled next."""
        if not self._observers:
            return
        if not self._later:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no event loop runs (a direct call): tell them now
                self._later.append((event, record))
                self.flush()
                return
            # Two hops: the first runs behind the wake-up of the batch's first request,
            # and puts the flush behind every wake-up the batch scheduled after it.
            loop.call_soon(loop.call_soon, self.flush)
        self._later.append((event, record))

    def flush(self) -> None:
        """Hand the events waiting to the observers now, in order."""
        later, self._later = self._later, []
        model = self.model
        for event, record in later:
            for observer in self._observers:
                if event == _REQUEST_DONE:
                    observer.request_done(record)
                elif event == _BATCH_DONE:
                    observer.batch_done(record)
                else:
                    observer.queue_changed(model, record)


_REQUEST_DONE, _BATCH_DONE, _QUEUE_CHANGED = 0, 1, 2


def discard_outputs(request: Request) -> None:
    """Release step outputs nobody will read (the reader left or the request was cancelled)."""
    while not request.outputs.empty():
        result = request.outputs.get_nowait()
        if isinstance(result, StepOutput):
            result.outputs.release()
