"""A postmortem's incidents: when clients saw errors (or a fault was journaled) and the repair.

:func:`incidents` groups the seconds with failed requests and the fault events
(:data:`FAULT_KINDS`) of a :class:`JournalWindow` into :class:`Incident` records; an
incident is repaired once clients have seen :data:`QUIET_S` seconds without an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from sordino.telemetry.availability import rejection_class
from sordino.telemetry.journal_reader import JournalEvent, JournalWindow
from sordino.telemetry.series import SecondRow

__all__ = ["FAULT_KINDS", "QUIET_S", "Incident", "incidents"]

QUIET_S = 5
"""An incident is repaired once clients have seen no error for this many seconds."""
FAULT_KINDS = (
    "fault_injected", "worker_failed", "device_unavailable", "instance_ejected", "guardian",
)  # fmt: skip
"""Events that open an incident (or explain one) even before any client saw an error."""


@dataclass(frozen=True, slots=True)
class Incident:
    """A stretch when clients saw errors, or a fault was journaled, and its repair.

    ``start`` is the earlier of the first second with errors and the first fault event
    (:data:`FAULT_KINDS`); ``repaired`` the first moment after which clients saw no
    error for :data:`QUIET_S` seconds (the end of the last second with errors, or the
    last fault event when later), ``None`` when the period ended before that was seen.
    ``failed`` counts the requests that failed: errors of accepted requests (503,
    timeout, failure) and refusals at admission (503, 429, 500); 4xx client errors
    are the client's mistake and never count.
    """

    start: float
    repaired: float | None
    cause: str
    failed: int
    seconds_with_errors: int

    @property
    def time_to_repair(self) -> float | None:
        return None if self.repaired is None else self.repaired - self.start


def _failed(row: SecondRow) -> int:
    """Requests of ``row`` a client saw fail: errors, refusals and 500s at admission."""
    refused = sum(
        n
        for reason, n in row.rejected_by_reason.items()
        if rejection_class(reason) != "client_error"
    )
    return row.errors + refused


def _fault_cause(event: JournalEvent) -> str | None:
    """What a fault event says happened; ``None`` for events that are no fault."""
    if event.kind not in FAULT_KINDS:
        return None
    p = event.payload
    if event.kind == "guardian":
        if p.get("phase") == "verdict":
            return None  # the verdict of an action already counted when it acted
        return f"guardian {p.get('action', event.subject)} ({p.get('trigger', event.cause)})"
    if event.kind == "fault_injected":
        return f"chaos {p.get('fault', '?')} fault on {event.subject}"
    because = f": {event.cause}" if event.cause else ""
    return f"{event.kind} on {event.subject}{because}"


def incidents(window: JournalWindow, quiet_s: int = QUIET_S) -> list[Incident]:
    """The period's incidents, in order (see :class:`Incident`).

    A second with failed requests, or a fault event, joins the incident in progress
    when it comes before clients had seen ``quiet_s`` seconds without errors since that
    incident's last one; otherwise it opens a new incident. A second without a series
    row saw no failure. A repair is confirmed only when the ``quiet_s`` clean seconds
    after it lie in the period.
    """
    failed: dict[int, int] = {}
    for row in window.series:
        n = _failed(row)
        if n:
            failed[row.t] = failed.get(row.t, 0) + n
    # (time, failed requests, cause): a second with errors, or a fault event.
    items: list[tuple[float, int, str | None]] = [(t, n, None) for t, n in failed.items()]
    for event in window.events:
        cause = _fault_cause(event)
        if cause is not None:
            items.append((event.t, 0, cause))
    items.sort(key=lambda item: item[0])
    groups: list[list[tuple[float, int, str | None]]] = []
    repaired = 0.0
    for item in items:
        t, n, _ = item
        if not groups or t >= repaired + quiet_s:
            groups.append([])
        groups[-1].append(item)
        # Clients see no error from the end of a failing second, or from a fault's moment.
        end = t + 1 if n else t
        repaired = end if len(groups[-1]) == 1 else max(repaired, end)
    out = []
    for group in groups:
        causes = [c for _, _, c in group if c is not None]
        ends = [t + 1 if n else t for t, n, _ in group]
        fixed = max(ends)
        out.append(
            Incident(
                start=group[0][0],
                repaired=fixed if fixed + quiet_s <= window.end else None,
                cause="; ".join(dict.fromkeys(causes)) or "no journaled fault explains it",
                failed=sum(n for _, n, _ in group),
                seconds_with_errors=sum(1 for _, n, _ in group if n),
            )
        )
    return out
