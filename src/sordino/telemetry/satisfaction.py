"""How ratings go with latency, degradation and errors: the business layer's correlation.

:func:`correlate` reads ``feedback`` event payloads (journaled by
:mod:`sordino.telemetry.feedback`) and returns a :class:`Satisfaction`: the mean rating,
the mean rating per latency band, of failed and of degraded requests against the rest,
per tag, and Pearson's coefficient between latency and rating. ``sordino diagnose``,
``sordino postmortem`` and the live snapshot show it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["BANDS_MS", "Band", "Satisfaction", "correlate", "satisfaction_lines"]

BANDS_MS = (100.0, 500.0, 1000.0, 3000.0)
"""Upper edges of the latency bands (the last band is open): 3 s is the brief's P99 target."""
_MIN_FOR_R = 3


@dataclass(frozen=True, slots=True)
class Band:
    """Ratings of requests whose latency was in ``[low_ms, high_ms)``."""

    low_ms: float
    high_ms: float | None
    count: int
    mean: float

    @property
    def label(self) -> str:
        def ms(v: float) -> str:
            return f"{v / 1000:g} s" if v >= 1000 else f"{v:g} ms"

        return f"≥ {ms(self.low_ms)}" if self.high_ms is None else f"< {ms(self.high_ms)}"


@dataclass(frozen=True, slots=True)
class Satisfaction:
    """The ratings of a period and how they go with the rated requests' figures.

    ``latency_r``: Pearson's r between latency and rating over rated requests (None with
    fewer than three, or when either does not vary). ``failed_mean``/``ok_mean`` and
    ``degraded_mean``/``undegraded_mean`` are None when no rating falls on that side.
    """

    count: int
    mean: float | None
    rated_requests: int
    bands: tuple[Band, ...]
    latency_r: float | None
    failed_mean: float | None
    ok_mean: float | None
    degraded_mean: float | None
    undegraded_mean: float | None
    tags: dict[str, tuple[int, float]] = field(default_factory=dict)
    points: tuple[tuple[float, int], ...] = ()
    """(latency ms, rating) of each rated request, for a chart."""


def _mean(values: list[int]) -> float | None:
    return float(np.mean(values)) if values else None


def correlate(payloads: Iterable[Mapping[str, Any]]) -> Satisfaction:
    """Correlate the ratings in ``payloads`` (``feedback`` events) with their requests."""
    ratings: list[int] = []
    points: list[tuple[float, int]] = []
    failed: list[int] = []
    ok: list[int] = []
    degraded: list[int] = []
    undegraded: list[int] = []
    tags: dict[str, list[int]] = {}
    for p in payloads:
        rating = p.get("rating")
        if not isinstance(rating, int) or isinstance(rating, bool):
            continue
        ratings.append(rating)
        if isinstance(p.get("tag"), str):
            tags.setdefault(p["tag"], []).append(rating)
        latency = p.get("latency_ms")
        if not isinstance(latency, int | float) or not math.isfinite(latency):
            continue
        points.append((float(latency), rating))
        (ok if p.get("outcome") == "success" else failed).append(rating)
        (degraded if p.get("degraded") else undegraded).append(rating)
    bands = []
    edges = (0.0, *BANDS_MS)
    for i, low in enumerate(edges):
        high = edges[i + 1] if i + 1 < len(edges) else None
        inside = [r for ms, r in points if ms >= low and (high is None or ms < high)]
        if inside:
            bands.append(Band(low, high, len(inside), float(np.mean(inside))))
    r = None
    if len(points) >= _MIN_FOR_R:
        xs = np.array([ms for ms, _ in points])
        ys = np.array([v for _, v in points], dtype=float)
        if np.ptp(xs) > 0 and np.ptp(ys) > 0:
            r = float(np.corrcoef(xs, ys)[0, 1])
    return Satisfaction(
        count=len(ratings),
        mean=_mean(ratings),
        rated_requests=len(points),
        bands=tuple(bands),
        latency_r=r,
        failed_mean=_mean(failed),
        ok_mean=_mean(ok),
        degraded_mean=_mean(degraded),
        undegraded_mean=_mean(undegraded),
        tags={t: (len(v), float(np.mean(v))) for t, v in sorted(tags.items())},
        points=tuple(points),
    )


def satisfaction_lines(s: Satisfaction) -> list[str]:
    """The correlation in sentences, for the reports and the monitor."""
    if not s.count:
        return ["no ratings in this period (clients rate requests with POST /v2/feedback)"]
    lines = [f"{s.count} ratings, mean {s.mean:.2f}/5 ({s.rated_requests} of rated requests)"]
    if s.bands:
        lines.append(
            "mean rating by latency: "
            + ", ".join(f"{b.label}: {b.mean:.2f} ({b.count})" for b in s.bands)
        )
    if s.latency_r is not None:
        lines.append(
            f"latency vs rating: Pearson r = {s.latency_r:+.2f}"
            + (" (slower answers are rated lower)" if s.latency_r <= -0.3 else "")
        )
    if s.failed_mean is not None:
        ok = f"{s.ok_mean:.2f}" if s.ok_mean is not None else "none"
        lines.append(f"failed requests rated {s.failed_mean:.2f}, successful ones {ok}")
    if s.degraded_mean is not None:
        rest = f"{s.undegraded_mean:.2f}" if s.undegraded_mean is not None else "none"
        lines.append(f"degraded answers rated {s.degraded_mean:.2f}, full ones {rest}")
    for tag, (count, mean) in s.tags.items():
        lines.append(f"tag {tag}: mean {mean:.2f} ({count})")
    return lines
