"""A batch that failed or was cancelled: which of its requests fail, and how.

A batch the model raised on (:class:`~sordino.errors.ModelError`) is run again one
request at a time, so only the request the model cannot take fails: a poisoned batch
costs its size, never its neighbours (docs/scheduling.md, "Overload"). So too a batch
refused because a tenant is over its quota in a Ray node's pool
(:class:`~sordino.errors.RateLimited`). Any other error fails every request of the
batch with it; a cancelled batch (a close without drain) answers them
:class:`~sordino.errors.ShuttingDown`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from sordino.clock import Clock
from sordino.errors import InferenceFailed, ModelError, RateLimited, ShuttingDown, SordinoError
from sordino.inference import ModelKey
from sordino.scheduling.outcomes import Outcomes
from sordino.scheduling.work import WorkItem

__all__ = ["BatchFailures"]


class BatchFailures:
    """Answers the requests of one model version's failed and cancelled batches.

    ``rerun`` runs a list of work items as one batch (the batch runner's own ``run``):
    a poisoned batch's items go through it one at a time.
    """

    def __init__(
        self,
        model: ModelKey,
        *,
        clock: Clock,
        outcomes: Outcomes,
        rerun: Callable[[list[WorkItem]], Awaitable[None]],
    ) -> None:
        self.model = model
        self._clock = clock
        self._outcomes = outcomes
        self._rerun = rerun

    async def failed(
        self, live: list[WorkItem], exc: Exception, rows: int, t0: float, t1: float
    ) -> None:
        """The executor raised ``exc`` on the batch ``live`` of ``rows`` rows, started
        at ``t0`` (its input phase ended at ``t1``): fail its requests, or run each alone."""
        t2 = self._clock.now()
        self._outcomes.batches += 1
        message = str(exc) if isinstance(exc, SordinoError) else f"{type(exc).__name__}: {exc}"
        error: SordinoError = (
            exc
            if isinstance(exc, SordinoError)
            else InferenceFailed(f"model {self.model} failed on a batch of {rows}: {message}")
        )
        self._outcomes.batch_observed(rows, len(live), t1 - t0, t2 - t1, 0.0, ok=False)
        if isinstance(error, ModelError | RateLimited) and len(live) > 1:
            # One request the model cannot take must not fail the others: run each
            # alone, so only the offender fails (a poisoned batch costs its size).
            # So too a tenant over its quota in a Ray node's pool (RateLimited).
            self._outcomes.isolated += 1
            try:
                for item in live:
                    if item.request is None or not item.request.finished:
                        await self._rerun([item])
            except asyncio.CancelledError:
                self.cancelled(live, t0)  # those not run alone yet
                raise
            return
        for item in live:
            self._outcomes.step_failed(item, error, t2 - t0)

    def cancelled(self, live: list[WorkItem], t0: float) -> None:
        """The batch's task was cancelled (a close without drain): answer its requests
        ShuttingDown, so none is left without an outcome."""
        stopped = ShuttingDown(
            f"model {self.model} is being unloaded or the server is stopping; its batch "
            "was cancelled before it finished: retry on another replica"
        )
        for item in live:
            self._outcomes.step_failed(item, stopped, self._clock.now() - t0)
