"""Restart backoff, Kubernetes-like: 1 s doubling to a 60 s cap, reset after a clean run."""

from __future__ import annotations

__all__ = ["RestartBackoff"]


class RestartBackoff:
    """Delays between restarts of one worker.

    Each failure waits twice as long as the previous one (``initial_s``, then double,
    up to ``max_s``). A worker that stayed up ``reset_after_s`` since its last start
    failed "for the first time" again: its next delay is ``initial_s``.
    """

    def __init__(
        self, initial_s: float = 1.0, max_s: float = 60.0, reset_after_s: float = 600.0
    ) -> None:
        self._initial = initial_s
        self._max = max(max_s, initial_s)
        self._reset_after = reset_after_s
        self._next = initial_s
        self._started_at: float | None = None

    def started(self, now: float) -> None:
        """Note that the worker is up (again) at ``now``."""
        self._started_at = now

    def next_delay(self, now: float) -> float:
        """Return the delay before the next restart of a worker that failed at ``now``."""
        if self._started_at is not None and now - self._started_at >= self._reset_after:
            self._next = self._initial
        delay = self._next
        self._next = min(self._next * 2, self._max)
        self._started_at = None
        return delay
