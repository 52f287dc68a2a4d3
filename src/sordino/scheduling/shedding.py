"""Overload control at arrival: the wait a request has ahead, and whether to shed it.

Only the engine knows the work ahead of a request. At arrival a request is shed (503
:class:`~sordino.errors.Shed`) when the rows queued at its priority and higher, at the
rate recent batches ran and in the time higher priorities arriving meanwhile leave it,
would take more than :data:`ADMIT_SHARE` of its deadline; and a batch never starts work
whose deadline is nearer than a batch takes (docs/scheduling.md, "Overload"). Neither
rule applies to an idle model (nothing else accepted and unfinished) whose batch time
is stale (no batch ended in the last :data:`~sordino.scheduling.estimate.STALE_S`):
there it would refuse on that old figure alone, which only running a batch measures
again, so one slow batch (a cold start) refused every request with a shorter deadline
for ever. The arrival rate the batcher waits for is counted here too.
"""

from __future__ import annotations

from collections.abc import Callable

from sordino.clock import Clock
from sordino.errors import QueueTimeout, Shed
from sordino.execution.executor import Executor
from sordino.inference import ModelKey
from sordino.records import QueueSettings
from sordino.scheduling.estimate import Arrivals, BatchCost
from sordino.scheduling.modes import ModeController
from sordino.scheduling.outcomes import Outcomes
from sordino.scheduling.queue import RequestQueue
from sordino.scheduling.work import WorkItem

__all__ = ["ADMIT_SHARE", "Shedder", "late_refusal"]

ADMIT_SHARE = 0.8
"""A request is admitted while the wait expected for it is at most this share of its
deadline: the rest is the margin for the estimate's error (a queue's wait varies), so
a request admitted is one that finishes in time, and one refused is refused at once,
not after waiting out its deadline."""


def late_refusal(
    model: object,
    priority: int,
    timeout_s: float | None,
    expected_s: float | None,
    rows_ahead: Callable[[], int],
) -> Shed | None:
    """The arrival rule, the one place it lives: the :class:`Shed` for a request at
    ``priority`` with ``timeout_s`` to go when ``expected_s`` of work is ahead of it
    (None: unknown), or None to admit it.

    The scheduler applies it to its own queue (:meth:`Shedder.late`); a front end in
    another process to the figures the engine published (``server/load_board.py``).
    ``rows_ahead`` is asked only for a refusal's message.
    """
    if not timeout_s or expected_s is None or expected_s <= ADMIT_SHARE * timeout_s:
        return None
    return Shed(
        f"model {model} is overloaded: {rows_ahead()} rows at "
        f"priority {priority} or higher are ahead, about {expected_s * 1000:.0f} ms of "
        f"work, more than {ADMIT_SHARE:.0%} of the request's "
        f"{timeout_s * 1000:.0f} ms deadline; retry later, raise the deadline or the "
        "priority",
        retry_after_s=expected_s,
    )


class Shedder:
    """The admission estimate of one model version: expected waits, sheds, hopeless work.

    ``controller`` and ``settings`` are the scheduler's current ones (a hot
    reconfiguration replaces them here too).
    """

    def __init__(
        self,
        model: ModelKey,
        *,
        executor: Executor,
        queue: RequestQueue,
        clock: Clock,
        controller: ModeController,
        settings: QueueSettings,
        outcomes: Outcomes,
        arrivals: Arrivals,
        cost: BatchCost,
    ) -> None:
        self.model = model
        self.controller = controller
        self.settings = settings
        self._executor = executor
        self._queue = queue
        self._clock = clock
        self._outcomes = outcomes
        self._arrivals = arrivals
        self._cost = cost

    def note_arrival(self, now: float, rows: int, priority: int) -> None:
        """A request was accepted: count its rows among the arrivals."""
        self._arrivals.note(now, rows, priority, self._outcomes.in_flight())

    def shed_if_late(self, item: WorkItem, timeout_s: float | None) -> None:
        """Refuse ``item`` now if the work ahead of it would make it miss its deadline."""
        error = self.late(item.priority, timeout_s)
        if error is not None:
            raise error

    def late(self, priority: int, timeout_s: float | None) -> Shed | None:
        """Whether a request at ``priority`` queued now would miss its deadline.

        Ahead of it are the rows queued at its priority and higher, served at the rate
        the model's recent batches ran at (``instances`` batches at a time), plus one
        batch's time for its own. Lower priorities have more ahead, so they are shed
        first and fast, while higher ones are still accepted. Never under
        ``frame_sync`` (``settings.shed_late`` false): a late frame runs late.
        """
        if not timeout_s or not self.settings.shed_late:
            return None
        return late_refusal(
            self.model,
            priority,
            timeout_s,
            self.admission_wait(priority),
            lambda: self._queue.rows_ahead(priority),
        )

    def admission_wait(self, priority: int) -> float | None:
        """:meth:`expected_wait` as the arrival rule reads it: None (admit) while the
        model is idle and its batch time stale, where the wait is that old figure alone
        — one only running a batch corrects (a cold first batch of 500 ms refused every
        later request with a 100 ms deadline, and none ever ran to correct it)."""
        if self._probe():
            return None
        return self.expected_wait(priority)

    def _probe(self, in_flight: int = 0) -> bool:
        """Whether the model has nothing in flight but ``in_flight`` requests and its
        batch time is stale: what arrives (or is batched) now runs whatever that says."""
        return self._outcomes.in_flight() <= in_flight and self._cost.stale(self._clock.now())

    def rows_ahead(self, priority: int) -> int:
        """Rows queued now at ``priority`` and higher."""
        return self._queue.rows_ahead(priority)

    def expected_wait(self, priority: int) -> float | None:
        """About how long a step queued now at ``priority`` takes to run (None: unknown).

        The rows queued at its priority and higher, and the higher priorities that
        will arrive meanwhile, at what recent batches cost (:meth:`BatchCost.wait
        <sordino.scheduling.estimate.BatchCost.wait>`), plus one batch: what
        :meth:`late` compares to a deadline. An iterative request's steps each take
        about this long.
        """
        instances = max(1, self._executor.instances(self.model))
        higher = self._arrivals.higher_rate(priority, self._clock.now()) if priority > 1 else 0.0
        return self._cost.wait(
            self._queue.rows_ahead(priority), instances, self.controller.policy().max_batch, higher
        )

    def arrival_rate(self) -> float:
        """Rows a second arriving now (:meth:`Arrivals.rate
        <sordino.scheduling.estimate.Arrivals.rate>`): what the batcher waits for."""
        return self._arrivals.rate(self._clock.now(), self._outcomes.in_flight())

    def drop_hopeless(self, batch: list[WorkItem], now: float) -> list[WorkItem]:
        """Never start work that cannot finish before its deadline (REJECT action only).

        A batch takes about the recent batches' run time; an item whose deadline is
        nearer than that is answered now (503) instead of computed for a client that
        will have given up. Not when the batch is all the model has in flight and the
        batch time is stale: running it measures that again (see :meth:`admission_wait`).
        """
        batch_s = self._cost.mean_s
        settings = self.settings
        if batch_s is None or (settings.timeout_action != "REJECT" and not settings.levels):
            return batch
        if self._probe(len(batch)):
            return batch
        finish = now + batch_s
        kept = []
        for item in batch:
            deadline = item.deadline
            if (
                deadline is not None
                and deadline < finish
                and (not settings.levels or settings.rejects_late(item.priority))
            ):
                self._outcomes.timed_out += 1
                self._outcomes.drop(
                    item,
                    QueueTimeout(
                        f"request to model {self.model} cannot finish before its deadline "
                        f"({(deadline - now) * 1000:.0f} ms left, a batch takes about "
                        f"{batch_s * 1000:.0f} ms); it was not run. Raise its timeout "
                        "or reduce load"
                    ),
                )
            else:
                kept.append(item)
        return kept
