"""Restart backoff for a crash loop only: a worker that served well is restarted at once.

A worker killed after it served (an OOM kill, an operator's ``kill -9``, a hang) is
replaced immediately: waiting would only turn one lost worker into minutes without an
instance. Backing off helps only when restarting does not: a worker that dies while
starting, or before it has shown healthy service, is in a crash loop, and each such
failure in a row waits twice as long as the previous one (capped).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from sordino.clock import Clock
from sordino.events import EventSink

log = logging.getLogger("sordino.workers")

__all__ = ["RestartBackoff", "start_again"]


class RestartBackoff:
    """The delay before restarting one worker slot's failed worker.

    A worker is *healthy* once it has run ``healthy_batches`` batches, or stayed up
    ``healthy_after_s``, since it started. When a healthy worker fails, the delay is 0
    and the crash loop count starts over. A worker that fails while starting (no
    :meth:`started` since the last failure) or before it was healthy waits ``initial_s``,
    then double on each further such failure in a row, up to ``max_s``.
    """

    def __init__(
        self,
        initial_s: float = 1.0,
        max_s: float = 60.0,
        healthy_after_s: float = 30.0,
        healthy_batches: int = 10,
    ) -> None:
        self._initial = initial_s
        self._max = max(max_s, initial_s)
        self._healthy_after = healthy_after_s
        self._healthy_batches = healthy_batches
        self._next = initial_s
        self._started_at: float | None = None
        self._batches = 0
        self.crash_loop = 0
        """Failures in a row of workers that never became healthy (0 after a healthy one)."""

    def started(self, now: float) -> None:
        """Note that a worker is up (again) at ``now``: ready, warmed up, taking traffic."""
        self._started_at = now
        self._batches = 0

    def served(self) -> None:
        """Note one batch the current worker ran successfully."""
        self._batches += 1

    def healthy(self, now: float) -> bool:
        """Whether the current worker has shown healthy service by ``now``."""
        if self._started_at is None:
            return False
        return (
            self._batches >= self._healthy_batches or now - self._started_at >= self._healthy_after
        )

    def next_delay(self, now: float) -> float:
        """Return the delay before restarting the worker that failed at ``now`` (0: at once)."""
        if self.healthy(now):
            self._next = self._initial
            self.crash_loop = 0
            delay = 0.0
        else:
            self.crash_loop += 1
            delay = self._next
            self._next = min(self._next * 2, self._max)
        self._started_at = None
        self._batches = 0
        return delay


async def start_again(
    start: Callable[[], Awaitable[object]],
    delay: float,
    *,
    backoff: RestartBackoff,
    clock: Clock,
    events: EventSink,
    subject: str,
    closing: Callable[[], bool],
    failed: Callable[[str], None],
) -> None:
    """Wait ``delay``, then call ``start`` until it succeeds or ``closing()`` says stop.

    Each failed start is a ``worker_start_failed`` event, is passed to ``failed`` (as
    ``restart failed: …``) and waits the backoff's next delay. The one restart loop of
    worker processes (``instances.py``) and Ray actors (``ray_instance.py``).
    """
    if delay:
        await clock.sleep(delay)
    while not closing():
        try:
            await start()
            return
        except Exception as exc:
            retry = backoff.next_delay(clock.now())
            log.warning(
                "worker %s did not start again: %s; trying again in %g s", subject, exc, retry
            )
            failed(f"restart failed: {exc}")
            events.emit("worker_start_failed", subject, str(exc), retry_in_s=retry)
            await clock.sleep(retry)
