"""Events: every decision leaves a trace.

Components emit :class:`Event` records (kind, subject, cause, payload) to one
:class:`EventSink`. Telemetry journals them; diagnostics read the same stream. The
sink keeps the most recent events in memory and calls subscribers synchronously,
so emitting never blocks on I/O.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Event", "EventSink"]

log = logging.getLogger("sordino.events")


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened: what (``kind``), to what (``subject``), and why (``cause``)."""

    kind: str
    subject: str
    cause: str = ""
    payload: dict[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)


class EventSink:
    """Collects events; keeps the last ``capacity`` and fans them out to subscribers."""

    def __init__(self, capacity: int = 1000) -> None:
        self._recent: deque[Event] = deque(maxlen=capacity)
        self._subscribers: list[Callable[[Event], None]] = []

    def emit(self, kind: str, subject: str, cause: str = "", **payload: Any) -> Event:
        """Record an event and hand it to every subscriber."""
        event = Event(kind, subject, cause, payload)
        self._recent.append(event)
        for subscriber in self._subscribers:
            try:
                subscriber(event)
            except Exception:  # a broken subscriber must not break the emitter
                log.exception("event subscriber failed on %s", event.kind)
        return event

    def keep(self, event: Event) -> None:
        """Keep ``event`` among the recent ones without handing it to the subscribers:
        it was recorded elsewhere already (a mark another process journaled)."""
        self._recent.append(event)

    def subscribe(self, callback: Callable[[Event], None]) -> None:
        """Call ``callback`` for every event emitted from now on."""
        self._subscribers.append(callback)

    def recent(self, kind: str | None = None) -> list[Event]:
        """Return the kept events, oldest first, optionally only those of ``kind``."""
        return [e for e in self._recent if kind is None or e.kind == kind]
