"""Switch thresholds: metric, comparison, value with unit, window; clear errors otherwise."""

from __future__ import annotations

import pytest

from sordino.config import parse_threshold
from sordino.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "metric", "op", "value", "window"),
    [
        ("error_rate>5% for 30s", "error_rate", ">", 0.05, 30.0),
        ("error_rate >= 0.2 for 1m", "error_rate", ">=", 0.2, 60.0),
        ("p99_latency>250ms for 10s", "p99_latency", ">", 0.25, 10.0),
        ("latency_p95 > 1.5s", "latency_p95", ">", 1.5, 30.0),
    ],
)
def test_parses(text: str, metric: str, op: str, value: float, window: float) -> None:
    """Each part is read, units converted (percent to fraction, ms to s)."""
    threshold = parse_threshold(text)
    assert (threshold.metric, threshold.op, threshold.window_s) == (metric, op, window)
    assert threshold.value == pytest.approx(value)


def test_holds_compares_with_the_operator() -> None:
    """holds() applies the comparison to a measured value."""
    threshold = parse_threshold("error_rate>5% for 30s")
    assert threshold.holds(0.06) and not threshold.holds(0.05)
    assert parse_threshold("p99_latency>100ms").quantile == 0.99


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("error_rate 5%", "cannot parse"),
        ("errors>5%", "unknown metric 'errors'"),
        ("error_rate>5ms", "percentage"),
        ("error_rate>150%", "0%..100%"),
        ("p99_latency>250", "needs a unit"),
        ("error_rate>5% for soon", "invalid duration 'soon'"),
        ("error_rate>5% for 0s", "longer than 0"),
    ],
)
def test_malformed_is_refused_clearly(text: str, message: str) -> None:
    """Malformed expressions raise ConfigError naming the problem."""
    with pytest.raises(ConfigError, match=message):
        parse_threshold(text)
