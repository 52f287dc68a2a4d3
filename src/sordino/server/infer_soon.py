"""A one-shot request answered by callback: ``InferenceService.infer_soon``.

The engine link (``server/engine_link.py``) answers many requests a loop turn for its
front ends; a task and a chain of coroutines for each cost more of the engine's one
core than the rest of the link's path together. A :class:`Soon` is the same request
lifecycle as ``InferenceService._infer_one`` without them: the scheduler's outbox
sets a future, whose callback takes the result, gives back the ticket with the
scheduler's outcome and calls the transport's ``done`` with the response or the error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sordino.errors import SordinoError
from sordino.inference import InferRequest, InferResponse
from sordino.scheduling.outcomes import discard_outputs
from sordino.scheduling.work import Request
from sordino.server import answers
from sordino.server.route import Route
from sordino.server.ticket import Ticket

__all__ = ["Soon"]


class Soon:
    """An accepted one-shot request whose answer goes to ``done`` once (see the module)."""

    __slots__ = ("_accepted", "_done", "_request", "_route", "_ticket", "_waiter")

    def __init__(
        self,
        route: Route,
        request: InferRequest,
        accepted: Request,
        ticket: Ticket,
        done: Callable[[InferResponse | Exception], None],
    ) -> None:
        self._route, self._request, self._accepted = route, request, accepted
        self._ticket, self._done = ticket, done
        self._waiter: asyncio.Future[None] | None = accepted.outputs.ready()
        self._waiter.add_done_callback(self._ready)

    def _ready(self, waiter: asyncio.Future[None]) -> None:
        if waiter.cancelled() or self._waiter is None:
            return
        self._waiter = None
        accepted = self._accepted
        answer: InferResponse | Exception
        try:
            try:
                result = accepted.outputs.get_nowait()
            finally:
                # The scheduler's outcome, which it also counted in sordino_requests_total;
                # given back whether or not the result could be taken.
                self._ticket.release(accepted.outcome or "cancelled")
            if isinstance(result, SordinoError):
                answer = result
            else:
                answer = answers.response(self._route, self._request, result.outputs)
        except Exception as exc:  # as InferenceService.infer would raise it: answered
            answer = exc
        self._done(answer)

    def cancel(self) -> None:
        """The client left: drop the request (counted cancelled); ``done`` is not called."""
        waiter, self._waiter = self._waiter, None
        if waiter is None:
            return  # answered already
        waiter.cancel()
        accepted = self._accepted
        self._route.scheduler.cancel(accepted)
        discard_outputs(accepted)
        self._ticket.release(accepted.outcome or "cancelled")
