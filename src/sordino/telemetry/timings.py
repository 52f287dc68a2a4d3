"""Per-second request timings the main series does not keep: body read and lateness.

- ``network_latency``: the time from a request's arrival at the HTTP application (its
  headers read) to its body fully read — what a slow or lossy client network costs;
- ``frame_delay``: how long after its deadline a request with a deadline finished (0
  when on time) — the delay of a late frame.

:class:`TimingSeries` is a scheduler observer (for lateness) that the HTTP transport
also calls (:meth:`TimingSeries.body_read`). It keeps, per model and wall-clock
second, the 99th percentile of each, for the last ``window_s`` seconds, in memory
only (the guardian reads them; they are not journaled). It records nothing until
:attr:`TimingSeries.enabled` is set (by the guardian, for a trigger on one of them),
so a server without such a trigger pays one attribute check per request.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

from sordino.inference import ModelKey
from sordino.records import BatchDone, RequestDone

__all__ = ["TIMINGS", "TimingSeries"]

TIMINGS = ("network_latency", "frame_delay")


class TimingSeries:
    """Per model and second: the p99 of body read time and of lateness, in seconds."""

    def __init__(self, *, wall: Callable[[], float] = time.time, window_s: int = 900) -> None:
        self._wall = wall
        self._window = window_s
        self._open: dict[tuple[str, ModelKey, int], list[float]] = {}
        self._closed: dict[tuple[str, ModelKey], deque[tuple[int, float]]] = {}
        self._second = 0
        self.enabled = False

    def body_read(self, model: ModelKey, seconds: float) -> None:
        """One request's body took ``seconds`` to arrive after its headers."""
        if self.enabled:
            self._add("network_latency", model, seconds)

    def _add(self, name: str, model: ModelKey, value: float) -> None:
        second = int(self._wall())
        if second != self._second:
            # A new second: close the past ones, so nothing grows while nobody reads.
            self._second = second
            self._close(second)
        key = (name, model, second)
        values = self._open.get(key)
        if values is None:
            values = self._open[key] = []
        values.append(value)

    # -- SchedulerObserver -----------------------------------------------------------

    def request_done(self, done: RequestDone) -> None:
        if self.enabled and done.late_s is not None:
            self._add("frame_delay", done.model, done.late_s)

    def batch_done(self, done: BatchDone) -> None:
        pass

    def queue_changed(self, model: ModelKey, depth: int) -> None:
        pass

    # -- reading ---------------------------------------------------------------------

    def recent(self, name: str) -> dict[ModelKey, list[tuple[int, float]]]:
        """``(second, p99 in seconds)`` per model for the closed seconds kept, oldest first."""
        self._close(int(self._wall()))
        return {model: list(rows) for (kind, model), rows in self._closed.items() if kind == name}

    def _close(self, now_s: int) -> None:
        for key in sorted((k for k in self._open if k[2] < now_s), key=lambda k: k[2]):
            name, model, second = key
            p99 = float(np.percentile(self._open.pop(key), 99))
            rows = self._closed.setdefault((name, model), deque())
            rows.append((second, p99))
        for rows in self._closed.values():
            while rows and rows[0][0] < now_s - self._window:
                rows.popleft()
