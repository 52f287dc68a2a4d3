"""The arrival schedule: when each request is meant to leave, and which class it is.

The whole schedule is drawn before the first request goes out, so sending costs no
random draws and the intended send time of every request is known in advance — the
time its latency is measured from. A non-homogeneous Poisson process is drawn by
time rescaling: unit-rate exponential gaps in "cumulative intended requests" are
mapped back through the integral of the rate; constant arrivals put the ``n``-th
request where that integral reaches ``n``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sordino.loadtest.profiles import Profile

__all__ = ["Schedule", "make_schedule"]

_STEP_S = 0.005  # resolution of the rate integral...
_MAX_STEPS = 2_000_000  # ...coarser for long profiles (a day: 43 ms), to bound memory


@dataclass(frozen=True, slots=True)
class Schedule:
    """``times[i]`` (seconds from the start) and ``classes[i]`` (index into the mix)."""

    times: np.ndarray
    classes: np.ndarray
    duration: float

    def __len__(self) -> int:
        return len(self.times)

    def intended_rate(self, window_s: float) -> np.ndarray:
        """Requests scheduled per second in each ``window_s`` window."""
        bins = max(1, int(np.ceil(self.duration / window_s)))
        counts, _ = np.histogram(self.times, bins=bins, range=(0.0, bins * window_s))
        return counts / window_s


def make_schedule(profile: Profile, *, seed: int = 0) -> Schedule:
    """Draw the arrival times and classes of a whole run of ``profile``."""
    rng = np.random.default_rng(seed)
    duration = profile.duration
    step = max(_STEP_S, duration / _MAX_STEPS)
    grid = np.arange(0.0, duration + step, step)
    rates = profile.rate_at(grid)
    cumulative = np.concatenate(([0.0], np.cumsum((rates[1:] + rates[:-1]) / 2 * step)))
    total = cumulative[-1]
    if profile.arrivals == "constant":
        marks = np.arange(0.5, total, 1.0)
    else:
        expected = int(total + 6 * np.sqrt(total) + 16)
        marks = np.cumsum(rng.exponential(1.0, size=expected))
        while marks[-1] < total:  # vanishingly rare: draw more
            more = marks[-1] + np.cumsum(rng.exponential(1.0, size=expected))
            marks = np.concatenate((marks, more))
        marks = marks[marks < total]
    # Invert the integral (it is non-decreasing; flat stretches have rate 0).
    keep = np.concatenate(([True], np.diff(cumulative) > 0))
    times = np.interp(marks, cumulative[keep], grid[keep])
    weights = np.array([c.weight for c in profile.mix], dtype=float)
    classes = rng.choice(len(weights), size=len(times), p=weights / weights.sum())
    return Schedule(times=times, classes=classes.astype(np.int32), duration=duration)
