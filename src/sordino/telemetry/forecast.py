"""Next-hour forecasts of QPS and memory from the journal history.

Exponential smoothing from statsmodels: Holt-Winters with a daily season once two
days of history exist, Holt's damped trend before that, nothing at all with less
than ten points (a forecast from three numbers would be a guess dressed as a
figure). statsmodels is imported only here, inside the fit, so serving never pays
for it and a server without it simply has no forecast.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sordino.telemetry.journal_reader import JournalReader

__all__ = [
    "MIN_POINTS",
    "Forecast",
    "ForecastSeries",
    "forecast_from_journal",
    "forecast_series",
    "minutes_short",
    "short_message",
]

HORIZON_S = 3600
MIN_POINTS = 10
DAY_S = 86400


@dataclass(frozen=True, slots=True)
class ForecastSeries:
    """A forecast of one figure over the next hour: its mean, its peak, and the path."""

    mean: float
    peak: float
    points: tuple[tuple[int, float], ...]
    method: str
    history_points: int
    step_s: int


@dataclass(frozen=True, slots=True)
class Forecast:
    """Forecasts made at ``made_at``: QPS per model, and process memory in bytes.

    ``needs_minutes``: for each model with history but no forecast yet, how many more
    minutes of history its forecast needs; ``memory_needs_minutes`` the same for memory
    (0 once it has a forecast).
    """

    made_at: float
    qps: dict[str, ForecastSeries]
    memory: ForecastSeries | None
    needs_minutes: dict[str, int] = field(default_factory=dict)
    memory_needs_minutes: int = 0

    @property
    def short(self) -> bool:
        """Whether some figure still waits for history (the hub refits sooner then)."""
        return bool(self.needs_minutes) or self.memory_needs_minutes > 0


def minutes_short(points: list[tuple[int, float]]) -> int:
    """How many more minutes of history per-minute ``points`` need for a forecast (0: enough).

    The fit needs ``MIN_POINTS`` minutes on its grid, which spans from the first point's
    minute to the last one's (gaps are interpolated).
    """
    if not points:
        return MIN_POINTS
    span = (points[-1][0] // 60) - (points[0][0] // 60) + 1
    return max(0, MIN_POINTS - span)


def short_message(minutes: int) -> str:
    """What to say while a forecast waits for history."""
    unit = "minute" if minutes == 1 else "minutes"
    return f"no forecast yet: needs {minutes} more {unit} of history ({MIN_POINTS} at least)"


def _regular(points: list[tuple[int, float]], step_s: int) -> tuple[int, np.ndarray]:
    """Resample ``(t, value)`` onto a regular grid of ``step_s``; interpolate the gaps."""
    ts = np.array([t for t, _ in points], dtype=np.int64) // step_s
    values = np.array([v for _, v in points], dtype=np.float64)
    first, last = int(ts.min()), int(ts.max())
    sums = np.zeros(last - first + 1)
    counts = np.zeros(last - first + 1)
    np.add.at(sums, ts - first, values)
    np.add.at(counts, ts - first, 1)
    grid = np.divide(sums, counts, out=np.full_like(sums, np.nan), where=counts > 0)
    known = ~np.isnan(grid)
    grid = np.interp(np.arange(grid.size), np.flatnonzero(known), grid[known])
    return first * step_s, grid


def forecast_series(points: list[tuple[int, float]]) -> ForecastSeries | None:
    """Forecast the hour after the last of ``points`` (``(epoch second, value)`` pairs).

    Returns None when there is too little history for an honest forecast.
    """
    if len(points) < MIN_POINTS:
        return None
    span = points[-1][0] - points[0][0]
    step_s = 60 if span < 6 * 3600 else 300
    start, y = _regular(points, step_s)
    if y.size < MIN_POINTS:
        return None
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    season = DAY_S // step_s
    steps = HORIZON_S // step_s
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter on short or flat series
        if y.size >= 2 * season:
            method = "holt_winters_daily"
            model = ExponentialSmoothing(
                y, trend="add", damped_trend=True, seasonal="add", seasonal_periods=season
            )
        elif np.ptp(y) == 0:
            method = "constant"
            model = None
        else:
            method = "holt_damped"
            model = ExponentialSmoothing(y, trend="add", damped_trend=True)
        if model is None:
            path = np.full(steps, y[-1])
        else:
            path = np.asarray(model.fit().forecast(steps), dtype=np.float64)
    path = np.clip(np.nan_to_num(path, nan=float(y[-1])), 0.0, None)
    t_next = start + y.size * step_s
    return ForecastSeries(
        mean=float(path.mean()),
        peak=float(path.max()),
        points=tuple((t_next + i * step_s, float(v)) for i, v in enumerate(path)),
        method=method,
        history_points=int(y.size),
        step_s=step_s,
    )


def forecast_from_journal(
    path: Path, *, now: float | None = None, history_s: float = 14 * DAY_S
) -> Forecast:
    """Forecast every model's QPS and the process memory from the journal at ``path``."""
    now = time.time() if now is None else now
    with JournalReader(path) as reader:
        per_model = reader.per_minute(now - history_s)
        memory = reader.memory_per_minute(now - history_s)
    qps = {}
    needs = {}
    for model, points in per_model.items():
        series = forecast_series(points)
        if series is not None:
            qps[model] = series
        else:
            needs[model] = max(1, minutes_short(points))
    memory_series = forecast_series(memory)
    return Forecast(
        made_at=now,
        qps=qps,
        memory=memory_series,
        needs_minutes=needs,
        memory_needs_minutes=0 if memory_series is not None else max(1, minutes_short(memory)),
    )
