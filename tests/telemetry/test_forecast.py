"""Forecasts: honest about too little history, follow trends and daily seasons."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sordino.telemetry.forecast import forecast_from_journal, forecast_series
from sordino.telemetry.journal import Journal
from sordino.telemetry.series import ResourceRow, SecondRow


def test_too_little_history_gives_no_forecast() -> None:
    assert forecast_series([(60 * i, 5.0) for i in range(5)]) is None


def test_a_flat_series_forecasts_its_level() -> None:
    series = forecast_series([(60 * i, 7.0) for i in range(30)])
    assert series is not None
    assert series.mean == pytest.approx(7.0) and series.peak == pytest.approx(7.0)
    assert len(series.points) == 60 and series.step_s == 60


def test_a_rising_series_forecasts_higher_than_its_last_value() -> None:
    series = forecast_series([(60 * i, 10.0 + i) for i in range(60)])
    assert series is not None and series.method == "holt_damped"
    assert series.mean > 69


def test_a_daily_season_is_followed() -> None:
    # Three days of 5-minute points with a daily sine; forecast at the trough vs the crest.
    day = 86400
    points = [(t, 100 + 50 * math.sin(2 * math.pi * t / day)) for t in range(0, 3 * day - 300, 300)]
    series = forecast_series(points)
    assert series is not None and series.method == "holt_winters_daily"
    expected = 100 + 50 * math.sin(2 * math.pi * (3 * day) / day)
    assert series.points[0][1] == pytest.approx(expected, abs=15)


def test_forecast_from_the_journal(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3", wall=lambda: 1e9)
    journal.open()
    for second in range(1_000_000 - 1800, 1_000_000):
        row = SecondRow(second, "m", "1", 20, 0, {}, 1.0, 2.0, None, None, 1, 1.0, 0, 0.1, 20)
        journal.write_rows([row], ResourceRow(second, 200 << 20, 1.0, *[None] * 7))
    assert journal.flush()
    journal.close()
    forecast = forecast_from_journal(tmp_path / "j.sqlite3", now=1_000_000)
    assert forecast.qps["m"].mean == pytest.approx(20.0, rel=0.01)
    assert forecast.memory is not None
    assert forecast.memory.mean == pytest.approx(200 << 20, rel=0.01)
