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
"unavailable", "timeout", "failed", "cancelled"}, ...]}``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sordino import errors
from sordino.inference import ModelKey
from sordino.records import BatchDone, RequestDone

__all__ = ["AvailabilityTally", "outcome_class"]

_FIELDS = ("accepted", "ok", "unavailable", "timeout", "failed", "cancelled")


def _unavailable_reasons() -> frozenset[str]:
    found: set[str] = set()
    pending: list[type[errors.SordinoError]] = [errors.Unavailable]
    while pending:
        cls = pending.pop()
        found.add(cls.reason)
        pending += cls.__subclasses__()
    return frozenset(found)


_UNAVAILABLE = _unavailable_reasons()


def outcome_class(outcome: str, reason: str) -> str:
    """``ok``, ``timeout``, ``unavailable`` (answered 503), ``cancelled`` or ``failed``."""
    if outcome == "success":
        return "ok"
    if outcome == "cancelled":
        return "cancelled"
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
        counts["accepted"] += 1
        counts[outcome_class(done.outcome, done.reason)] += 1

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
