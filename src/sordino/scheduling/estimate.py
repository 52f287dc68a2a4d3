"""What a model's scheduler foresees: how fast work arrives, and how long it takes.

Two estimates, kept apart from the engine that acts on them (``scheduler.py``):

- :class:`Arrivals` — rows arriving per second, in all (the batcher waits for more
  rows only while more are coming) and per priority level (the work that will
  overtake a lower priority while it waits);
- :class:`BatchCost` — a batch's run time as ``fixed + per_row × rows``, fitted to
  recent batches, and from it the wait a request queued now can expect and how many
  lower-priority rows may ride along in a higher-priority batch.

Both are fed by the scheduler (an accepted request, a finished batch) and read on its
hot path, so each reading is a few arithmetic operations.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = [
    "ARRIVAL_WINDOW_S",
    "BURST_DEVIATIONS",
    "LEVEL_WINDOW_S",
    "RIDE_ALONG",
    "Arrivals",
    "BatchCost",
]

ARRIVAL_WINDOW_S = 0.25
"""The window the arrival rate is counted over (the predictive batcher's estimate)."""
LEVEL_WINDOW_S = 1.0
"""The window higher priorities' arrival rate is counted over for a lower one's wait:
longer than the batcher's, as a share near one amplifies a count's noise."""
RIDE_ALONG = 0.25
"""How much lower-priority rows may lengthen a batch led by higher-priority ones: rows
of a lower level join while they add at most this share to the batch's time."""
BURST_DEVIATIONS = 2.0
"""How many standard deviations of higher priorities' random arrivals a lower
priority's expected wait allows for (see :meth:`BatchCost.wait`)."""
_MAX_HIGHER_LOAD = 0.95
"""The share of the model's time higher priorities' arrivals are taken to use, at most
(past it a lower priority's wait counts as at least twenty times the work ahead)."""


class Arrivals:
    """Rows arriving per second: in all, and per priority level (1 is the highest)."""

    def __init__(self, priority_levels: int, now: float) -> None:
        # Rows per level over ARRIVAL_WINDOW_S (their sum is the arrival rate) and, with
        # more than one level, over LEVEL_WINDOW_S too.
        levels = priority_levels + 1
        self._recent = _LevelCount(ARRIVAL_WINDOW_S, levels)
        self._steady = _LevelCount(LEVEL_WINDOW_S, levels) if priority_levels > 1 else None
        # The most requests in flight at once, this window and the one before: a closed
        # loop of N clients never has more than N, so once all N are here none is coming.
        self._peak_window_start = now
        self._peak_in_flight = self._peak_before = 0

    def note(self, now: float, rows: int, priority: int, in_flight: int) -> None:
        """A request of ``rows`` at ``priority`` was accepted; ``in_flight`` now."""
        self._recent.add(now, rows, priority)
        if self._steady is not None:
            self._steady.add(now, rows, priority)
        if now - self._peak_window_start >= ARRIVAL_WINDOW_S:
            self._peak_before, self._peak_in_flight = self._peak_in_flight, 0
            self._peak_window_start = now
        self._peak_in_flight = max(self._peak_in_flight, in_flight)

    def rate(self, now: float, in_flight: int) -> float:
        """Rows per second over the last ``ARRIVAL_WINDOW_S``; zero once nothing arrives.

        Zero too while as many requests are in flight as ever were at once in the last
        two windows: a closed loop of N clients (one request at a time, say) sends no
        more until one is answered, however fast it sent before, so waiting for more
        would only add the whole batching wait to each request.

        A count over a window, not an average of gaps: requests arrive in bursts (a
        gRPC closed loop is handed to the loop a few calls at a time, with gaps while
        the loop sends answers), and the averaged gaps, stretched by the time since the
        last arrival, read well under the real rate (issue 16: 200-900 rows/s measured
        at 1,200 req/s), so the batcher ran small batches it could have filled.
        """
        if now - self._peak_window_start >= 2 * ARRIVAL_WINDOW_S:
            self._peak_in_flight = self._peak_before = 0  # both windows passed in silence
        if in_flight >= max(self._peak_in_flight, self._peak_before):
            return 0.0
        return self._recent.rows(now) / ARRIVAL_WINDOW_S

    def higher_rate(self, priority: int, now: float) -> float:
        """Rows per second arriving at priorities above ``priority``: the higher of the
        rates over LEVEL_WINDOW_S (steady, read high by two deviations) and
        ARRIVAL_WINDOW_S (quick to see a rise)."""
        if self._steady is None:
            return 0.0
        # The steady count's upper bound: near a full share, a rate read 10 % low made
        # waits 30 % longer than foreseen, and lower priorities expired in the queue.
        steady = self._steady.rate_above(priority, now, margin=2.0)
        return max(steady, self._recent.rate_above(priority, now))


STALE_S = 1.0
"""A batch time measured longer ago than this is stale: an idle model admits a request it
says is late (a probe), and the next batch's time replaces it (``shedding.py``)."""


class BatchCost:
    """A batch's run time as ``fixed + per_row × rows``, from moving moments of recent
    batches' rows and seconds."""

    def __init__(self) -> None:
        self.mean_s: float | None = None
        """Recent batches' mean run time (None until one ran)."""
        self.mean_rows = 0.0
        # Moving second moments (rows², rows·seconds): the split into fixed and per row.
        self._rr = self._rs = 0.0
        self.ended_at: float | None = None
        """When the last batch noted with its end time ended."""

    def stale(self, now: float) -> bool:
        """Whether no batch ended in the last :data:`STALE_S` (or none ever did)."""
        return self.ended_at is None or now - self.ended_at >= STALE_S

    def note(self, rows: int, seconds: float, ended_at: float | None = None) -> None:
        """A batch of ``rows`` ran in ``seconds`` (ending at ``ended_at``, when known).

        A batch that started when the estimate was stale replaces it: the estimate
        says what the model did over a second ago, this batch what it does now (a cold
        first batch of 500 ms, then 1 ms ones).
        """
        if ended_at is not None:
            if self.ended_at is not None and ended_at - seconds - self.ended_at >= STALE_S:
                self.mean_s = None
            self.ended_at = ended_at
        if self.mean_s is None:
            self.mean_s, self.mean_rows = seconds, float(rows)
            self._rr, self._rs = float(rows * rows), rows * seconds
        else:
            self.mean_s = 0.9 * self.mean_s + 0.1 * seconds
            self.mean_rows = 0.9 * self.mean_rows + 0.1 * rows
            self._rr = 0.9 * self._rr + 0.1 * rows * rows
            self._rs = 0.9 * self._rs + 0.1 * rows * seconds

    @property
    def split_seen(self) -> bool:
        """Whether batches of different enough sizes ran to tell fixed from per row."""
        return self.mean_s is not None and self._rr - self.mean_rows * self.mean_rows >= 0.25

    def split(self) -> tuple[float, float]:
        """``(fixed, per_row)`` seconds. Until batches of different sizes were seen, all
        per row (recent rows at recent speed: the cautious reading for a wait)."""
        mean_rows, mean_s = self.mean_rows, self.mean_s or 0.0
        proportional = mean_s / max(mean_rows, 1e-6)
        variance = self._rr - mean_rows * mean_rows
        if not self.split_seen:  # batches all about one size: the split cannot be seen
            return 0.0, proportional
        per_row = (self._rs - mean_rows * mean_s) / variance
        per_row = min(max(per_row, 0.0), proportional)
        return mean_s - per_row * mean_rows, per_row

    def wait(
        self, ahead: int, instances: int, max_batch: int, higher_rate: float = 0.0
    ) -> float | None:
        """About how long a step queued now behind ``ahead`` rows takes to run.

        The rows ahead in batches as large as that backlog allows (up to
        ``max_batch``), each costing what recent batches did, ``instances`` batches at
        a time, plus one batch for its own. ``higher_rate``: rows a second of higher
        priorities, which go first as they arrive — the step starts once the work ahead
        and every higher row arriving until then have run, a busy period of mean
        ``work / (1 − ρ)`` and deviation ``row·√(λ·work) / (1 − ρ)^1.5`` (λ their rate,
        ρ the share of time they take); the wait allowed for is the mean plus
        :data:`BURST_DEVIATIONS` deviations. Without the arrivals, a low-priority
        request was accepted, then overtaken until its deadline passed: refused late,
        not at once; without their deviation, so was one in a hundred (a burst of high
        ones during its wait, amplified by the small share they leave it). None until a
        batch ran.
        """
        if self.mean_s is None:
            return None
        fixed, per_row = self.split()
        size = max(self.mean_rows, min(float(ahead), float(max_batch)))
        work = ((ahead / max(size, 1.0)) * fixed + ahead * per_row) / instances
        if higher_rate > 0.0:
            row = self.mean_s / max(self.mean_rows, 1.0) / instances
            free = 1.0 - min(higher_rate * row, _MAX_HIGHER_LOAD)
            deviation = row * math.sqrt(higher_rate * work) / free**1.5
            work = work / free + BURST_DEVIATIONS * deviation
        return work + self.mean_s

    def ride_along(self, rows: int) -> int:
        """Rows of lower priority that may join a batch holding ``rows`` of a higher one.

        As many as add at most :data:`RIDE_ALONG` of the batch's time: nearly all where
        a batch's time is mostly fixed (a small MLP), none or few where it grows with
        each row (a CNN on a CPU). No bound until the split is seen: all batches of one
        size say nothing of what a row costs, and keeping rows out of a batch whose time
        is mostly fixed would cost a whole batch for each.
        """
        if not self.split_seen:
            return 1 << 30
        fixed, per_row = self.split()
        if per_row <= 0.0:
            return 1 << 30
        return int(RIDE_ALONG * (fixed / per_row + rows))


class _LevelCount:
    """Rows arrived per priority level over a sliding window of ``window_s``.

    While arrivals have run for less than the window (after a silence), the count is
    divided by the time they have run (at least a fifth of the window), not by the
    whole window: at the onset of a surge the rate reads right at once instead of
    growing from nothing over the window — lower priorities admitted meanwhile against
    a rate read low were the ones that later expired in the queue.
    """

    def __init__(self, window_s: float, levels: int) -> None:
        self.window_s = window_s
        self._arrivals: deque[tuple[float, int, int]] = deque()
        self._rows = [0] * levels
        self._total = 0
        self._since = 0.0  # when the arrivals in the window began (after a silence)

    def add(self, now: float, rows: int, level: int) -> None:
        self._prune(now)
        if not self._arrivals:
            self._since = now
        self._arrivals.append((now, rows, level))
        self._rows[level] += rows
        self._total += rows

    def _prune(self, now: float) -> None:
        arrivals, counts = self._arrivals, self._rows
        since = now - self.window_s
        while arrivals and arrivals[0][0] < since:
            _, rows, old = arrivals.popleft()
            counts[old] -= rows
            self._total -= rows

    def rows(self, now: float) -> int:
        """Rows arrived, at every level, in the window that ends ``now``."""
        self._prune(now)
        return self._total

    def rate_above(self, level: int, now: float, *, margin: float = 0.0) -> float:
        """Rows per second at levels above ``level`` (1 is the highest).

        ``margin`` adds that many standard deviations of a Poisson count (``√n``): an
        upper bound on the rate rather than the count's reading.
        """
        self._prune(now)
        above = sum(self._rows[1:level])
        span = min(self.window_s, max(now - self._since, self.window_s / 5))
        return (above + margin * math.sqrt(above)) / span
