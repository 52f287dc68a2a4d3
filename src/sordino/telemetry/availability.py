"""Availability by priority: accepted requests tallied per model, priority and outcome.

The per-second series (``series.py``) counts requests by model only. A postmortem
asks more: of the requests each priority class had accepted, how many succeeded,
how many were refused under load (503: queue full, shed, not ready, out of memory,
shutting down) and how many timed out. :class:`AvailabilityTally` is a
:class:`~sordino.records.SchedulerObserver` that buckets every finished request by
``bucket_s`` wall-clock seconds; :meth:`flush` turns each closed bucket that saw
traffic into one ``availability`` event, written to the journal only (it is
bookkeeping: the event sink's recent events, the dashboard and the monitor never show
it, and diagnose never takes it for a cause), whose payload
is ``{"start": t, "seconds": 10, "counts": [{"model", "priority", "accepted", "ok",
"unavailable", "timeout", "failed", "cancelled", "client_error", "refused"}, ...]}``.
Requests refused before acceptance (:meth:`AvailabilityTally.rejected`) are tallied too,
under priority 0: ``client_error`` (a 4xx, the request was wrong) and ``refused`` (503
or 429: the server would not take it now), neither of them ``accepted``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sordino import errors
from sordino.inference import ModelKey
from sordino.protocol.status import http_status
from sordino.records import BatchDone, RequestDone

__all__ = ["AvailabilityTally", "outcome_class", "rejection_class"]

_FIELDS = (
    "accepted", "ok", "unavailable", "timeout", "failed", "cancelled", "client_error", "refused",
)  # fmt: skip


def _unavailable_reasons() -> frozenset[str]:
    found: set[str] = set()
    pending: list[type[errors.SordinoError]] = [errors.Unavailable]
    while pending:
        cls = pending.pop()
        found.add(cls.reason)
        pending += cls.__subclasses__()
    return frozenset(found)


_UNAVAILABLE = _unavailable_reasons()


def _client_reasons() -> frozenset[str]:
    """The reasons of every error answered with a 4xx status other than 429."""
    found: set[str] = set()
    pending: list[type[errors.SordinoError]] = [errors.SordinoError]
    while pending:
        cls = pending.pop()
        pending += cls.__subclasses__()
        # The status of an error depends only on its class (a too-large body aside, a
        # 413, a 4xx as well): an instance made without __init__ answers it.
        error = cls.__new__(cls)
        if isinstance(error, errors.MalformedBody):
            error.too_large = False
        status = http_status(error)
        if 400 <= status < 500 and status != 429:
            found.add(cls.reason)
    return frozenset(found)


_CLIENT = _client_reasons()


def rejection_class(reason: str) -> str:
    """How a request refused before acceptance for ``reason`` counts.

    ``client_error``: the request itself was wrong (a 4xx: bad input, unknown model,
    no credential; 429 aside); ``refused``: the server would not take it now (503 shed,
    queue full, not ready; 429 over a tenant's rate); ``failed``: the server failed
    (a 500). Client errors are the caller's to fix and do not count against
    availability; refusals do.
    """
    if reason in _CLIENT:
        return "client_error"
    if reason in _UNAVAILABLE or reason == errors.RateLimited.reason:
        return "refused"
    return "failed"


def outcome_class(outcome: str, reason: str) -> str:
    """``ok``, ``timeout``, ``unavailable`` (answered 503), ``cancelled``,
    ``client_error`` (the model answered the request with an error of the client's
    kind: ``model_rejected``, a 4xx) or ``failed``."""
    if outcome == "success":
        return "ok"
    if outcome == "cancelled":
        return "cancelled"
    if reason in _CLIENT:
        return "client_error"
    if "timeout" in reason or "deadline" in reason:
        return "timeout"
    return "unavailable" if reason in _UNAVAILABLE else "failed"


class AvailabilityTally:
    """Counts finished requests by (bucket, model, priority, outcome class)."""

    def __init__(
        self,
        emit: Callable[..., Any],
        *,
        bucket_s: int = 10,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._emit = emit
        self._bucket_s = bucket_s
        self._wall = wall
        self._counts: dict[tuple[int, str, int], dict[str, int]] = {}

    def request_done(self, done: RequestDone) -> None:
        start = int(self._wall()) // self._bucket_s * self._bucket_s
        key = (start, done.model.name, done.priority)
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = dict.fromkeys(_FIELDS, 0)
        kind = outcome_class(done.outcome, done.reason)
        if kind != "client_error":  # a model's answer of the client's kind: as refused
            counts["accepted"] += 1
        counts[kind] += 1

    def rejected(self, model: str, reason: str, count: int = 1) -> None:
        """Count ``count`` requests for ``model`` refused before acceptance for ``reason``.

        They have no priority yet (admission assigns it) and are tallied under 0; they
        are not ``accepted``: a ``client_error`` or a ``refused`` (a server failure
        refusing them counts as ``failed``, with ``accepted``).
        """
        start = int(self._wall()) // self._bucket_s * self._bucket_s
        key = (start, model, 0)
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = dict.fromkeys(_FIELDS, 0)
        kind = rejection_class(reason)
        if kind == "failed":
            counts["accepted"] += count
        counts[kind] += count

    def batch_done(self, done: BatchDone) -> None:
        pass

    def queue_changed(self, model: ModelKey, depth: int) -> None:
        pass

    def flush(self, now: float | None = None) -> int:
        """Emit every bucket that closed before ``now`` (all of them when None)."""
        limit = None if now is None else int(now) // self._bucket_s * self._bucket_s
        starts = sorted({k[0] for k in self._counts if limit is None or k[0] < limit})
        for start in starts:
            keys = sorted(k for k in self._counts if k[0] == start)
            rows = [
                {"model": model, "priority": priority, **self._counts.pop((start, model, priority))}
                for _, model, priority in keys
            ]
            self._emit(
                "availability", "requests", "", start=start, seconds=self._bucket_s, counts=rows
            )
        return len(starts)
