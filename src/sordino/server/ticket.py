"""A ticket: what an admitted request holds until it ends, given back exactly once.

Passing admission may take a slot of the request's tenant (its concurrency limit and
breaker, ``admission/tenants.py``); with memory quotas or node pools the request's
staged bytes are then charged to its tenant and its model. Whatever ends the request —
refused after admission (a full queue, a closing scheduler, no room in the quota), a
failure, a cancellation, a success — :meth:`Ticket.release` gives all of it back once,
with the outcome that feeds the tenant's breaker and the per-tenant request count. A
second call does nothing, so every way out of the service may call it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sordino.admission.chain import AdmissionContext
from sordino.admission.tenants import Tenants
from sordino.execution.staging import row_bytes
from sordino.inference import InferRequest
from sordino.memory.quotas import QuotaLedger
from sordino.server.route import Route
from sordino.telemetry.hub import Telemetry

__all__ = ["Ticket", "Tickets"]

Learn = Callable[[str, int, int, float], None]
"""Told ``(model, rows, bytes, seconds)`` of every request that succeeded."""


class Tickets:
    """Issues the tickets of one service: the parts a ticket gives back to."""

    __slots__ = ("charging", "learn", "pools", "quotas", "telemetry", "tenants", "waits")

    def __init__(
        self,
        telemetry: Telemetry,
        *,
        tenants: Tenants | None = None,
        quotas: QuotaLedger | None = None,
        pools: QuotaLedger | None = None,
        learn: Learn | None = None,
    ) -> None:
        """``quotas`` charges each request's staged bytes to its tenant, ``pools`` to its
        model (the node pools); ``learn`` is told of every request that succeeded."""
        self.telemetry = telemetry
        self.tenants = tenants
        self.quotas = quotas
        self.pools = pools
        self.learn = learn
        self.charging = quotas is not None or pools is not None or learn is not None
        """Whether a ticket weighs its request's bytes (:meth:`Ticket.charge`)."""
        self.waits = quotas is not None or pools is not None
        """Whether charging may wait for room (else :meth:`Ticket.weigh` is all of it)."""

    def issue(self, model: str, context: AdmissionContext) -> Ticket:
        """The ticket of a request to ``model`` that admission passed with ``context``."""
        return Ticket(self, model, context)


class Ticket:
    """What one admitted request holds: its tenant slot and charged bytes, given back once."""

    __slots__ = ("_held", "_nbytes", "_owner", "_pool", "_rows", "_started", "context", "model")

    def __init__(self, tickets: Tickets, model: str, context: AdmissionContext) -> None:
        self._held: Tickets | None = tickets
        self.model = model
        self.context = context
        self._owner: str | None = None
        self._pool: str | None = None
        self._nbytes = 0
        self._rows = 0
        self._started = 0.0

    def weigh(self, route: Route, request: InferRequest) -> None:
        """Note the request's rows and staged bytes (what ``learn`` is told at a success);
        the whole of :meth:`charge` when there are neither quotas nor node pools."""
        inputs = request.inputs
        rows = 1
        metadata = route.metadata
        if metadata.batched and inputs:
            rows = max(1, int(next(iter(inputs.values())).shape[0]))
        self._nbytes, self._rows = rows * row_bytes(inputs, metadata), rows
        self._started = time.perf_counter()

    async def charge(self, route: Route, request: InferRequest) -> None:
        """Weigh the request's staged bytes; with quotas charge its tenant, with node
        pools its model, waiting for room (429 when none comes, 400 when it can never
        fit). Raises having given back what it took; :meth:`release` gives back the rest.
        """
        tickets = self._held
        assert tickets is not None, "charge() before release()"
        self.weigh(route, request)
        nbytes = self._nbytes
        owner = pool = None
        try:
            if tickets.quotas is not None:
                owner = await tickets.quotas.acquire(self.context.tenant, nbytes)
            if tickets.pools is not None:
                pool = await tickets.pools.acquire(route.key.name, nbytes)
        except BaseException:
            if owner is not None and tickets.quotas is not None:
                tickets.quotas.release(owner, nbytes)
            self._nbytes = self._rows = 0
            raise
        self._owner, self._pool = owner, pool
        self._started = time.perf_counter()

    def release(self, outcome: str | None) -> None:
        """Give back what the request holds, once; later calls do nothing.

        ``outcome`` is how an accepted request ended (``success``, ``failure``,
        ``cancelled``: it feeds the tenant's breaker and is counted per tenant), or
        None for one refused after admission (counted as rejected by the service).
        """
        tickets = self._held
        if tickets is None:
            return
        self._held = None
        nbytes = self._nbytes
        if self._owner is not None and tickets.quotas is not None:
            tickets.quotas.release(self._owner, nbytes)
        if self._pool is not None and tickets.pools is not None:
            tickets.pools.release(self._pool, nbytes)
        if outcome == "success" and self._rows and tickets.learn is not None:
            tickets.learn(self.model, self._rows, nbytes, time.perf_counter() - self._started)
        context = self.context
        if context.slot and tickets.tenants is not None:
            tickets.tenants.finished(context, outcome)
        if outcome is not None:
            tickets.telemetry.request_finished(
                self.model, context.tenant, context.priority, outcome
            )
