"""Request-level batching, the baseline: generations run in cohorts, one at a time.

With ``iterative.batching: request`` a generation runs as one unit: a request that
arrives while a cohort is running waits, with every other request that arrives
meanwhile, until the whole cohort has finished; then they all start together as the
next cohort. (The default, ``step``, lets requests join and leave between steps; the
benchmark compares the two, ``bench/bench_diffusion.py``.)
"""

from __future__ import annotations

import asyncio

__all__ = ["Cohort"]


class Cohort:
    """Who may generate now under request-level batching (a no-op when not ``enabled``).

    Each :meth:`enter` that returned is paired with one :meth:`leave`.
    """

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._running = 0
        self._next_cohort: asyncio.Future[None] | None = None
        self._cohort_waiting = 0

    async def enter(self) -> None:
        """With ``batching: request``, wait until the running cohort has finished."""
        if not self.enabled:
            return
        if self._running == 0 and self._next_cohort is None:
            self._running += 1
            return
        if self._next_cohort is None:
            self._next_cohort = asyncio.get_running_loop().create_future()
        cohort = self._next_cohort
        self._cohort_waiting += 1
        try:
            await asyncio.shield(cohort)
        except BaseException:
            if not cohort.done():
                self._cohort_waiting -= 1
            else:
                self.leave()
            raise

    def leave(self) -> None:
        """A generation of the running cohort ended; the last one lets the next cohort in."""
        if not self.enabled:
            return
        self._running -= 1
        if self._running == 0 and self._next_cohort is not None:
            cohort, self._next_cohort = self._next_cohort, None
            self._running, self._cohort_waiting = self._cohort_waiting, 0
            cohort.set_result(None)
