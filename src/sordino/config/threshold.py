"""Thresholds: ``"error_rate>5% for 30s"``, ``"80°C"``, ``"sudden_drop>40% in 1m"``.

One parser serves the fallback chain's ``switch_threshold`` (the metric is part of the
text) and the guardian's triggers (the metric is its own key, the text holds the rest).

Grammar (spaces optional)::

    [<metric>] <condition> <value>[<unit>] [for|in|over <window>]

- ``condition``: ``>``, ``>=``, ``<``, ``<=``; ``above`` (``>``) and ``below`` (``<``);
  ``sudden_drop>`` / ``sudden_rise>`` (a relative change of the metric between the last
  ``window`` and the one before it, given in percent); nothing (a trigger's bare
  ``"5%"`` means ``> 5%``).
- ``value``: in the metric's unit — a percentage (``5%``) or a fraction (``0.05``) for
  rates and shares; a duration with a unit (``250ms``, ``1.5s``) for latencies; ``°C``
  (or ``C``, or nothing) for temperatures; ``W`` for power; a size (``2GiB``) for bytes;
  a plain number for counts (``qps``, ``queue_depth``).
- ``window``: a duration (``30s``, ``1m``); the metric is measured over its last
  ``window``. Without one the window is 30 s (a trigger's own ``window:`` key wins).

A switch threshold names one of :data:`BREAKER_METRICS` (what a device breaker
measures); a trigger names one of :data:`METRICS`.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sordino.config.units import parse_duration, parse_size
from sordino.errors import ConfigError

__all__ = [
    "BREAKER_METRICS",
    "METRICS",
    "THRESHOLD_FORMS",
    "Threshold",
    "parse_threshold",
]

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
_LATENCY = re.compile(r"^(?:p(?P<a>\d{2})_latency|latency_p(?P<b>\d{2}))$")

MetricKind = Literal["fraction", "duration", "temperature", "count", "bytes", "power"]

METRICS: dict[str, MetricKind] = {
    "error_rate": "fraction",
    "p50_latency": "duration",
    "p90_latency": "duration",
    "p95_latency": "duration",
    "p99_latency": "duration",
    "qps": "count",
    "queue_depth": "count",
    "memory_fragmentation": "fraction",
    "memory_in_use": "bytes",
    "worker_busy": "fraction",
    "device_temperature": "temperature",
    "power": "power",
    "slo_attainment": "fraction",
    "network_latency": "duration",
    "frame_delay": "duration",
}
"""What a guardian trigger can watch, and the kind of value each takes."""

BREAKER_METRICS = ("error_rate", "p50_latency", "p90_latency", "p95_latency", "p99_latency")
"""What a device breaker measures (``latency_pNN`` is accepted for ``pNN_latency``)."""

_FORM = (
    "write '<metric> <op> <value> for <window>', e.g. 'error_rate>5% for 30s' or "
    "'p99_latency>250ms for 1m'; metrics: error_rate, p50_latency, p90_latency, "
    "p95_latency, p99_latency; ops: >, >=, <, <="
)
THRESHOLD_FORMS = (
    "accepted forms: '5%', '> 2000', '500ms', '80°C', 'above 0.7 for 5m', 'below 20', "
    "'sudden_drop>40% in 1m', 'sudden_rise>200% in 1m' (ops: >, >=, <, <=, above, below)"
)

_WINDOW = re.compile(r"^(?P<body>.*?)\s+(?:for|in|over)\s+(?P<window>\S.*?)\s*$", re.IGNORECASE)
_NUMBER = r"(?P<value>[0-9]*\.?[0-9]+)\s*(?P<unit>%|°\s*[cf]|[a-zµ]+)?"
_COMPARE = re.compile(
    r"^\s*(?P<metric>[a-z_][a-z_0-9]*?)?\s*(?P<op>>=|<=|>|<)?\s*" + _NUMBER + r"\s*$",
    re.IGNORECASE,
)
_WORDED = re.compile(r"^\s*(?P<word>above|below)\s+" + _NUMBER + r"\s*$", re.IGNORECASE)
_CHANGE = re.compile(
    r"^\s*sudden_(?P<dir>drop|rise)\s*(?P<op>>=|>)\s*" + _NUMBER + r"\s*$", re.IGNORECASE
)


@dataclass(frozen=True, slots=True)
class Threshold:
    """A parsed threshold.

    ``value`` is in the metric's base unit: a fraction (rates, shares), seconds
    (latencies), °C, W, bytes or a count. For a ``change`` threshold (``"drop"`` or
    ``"rise"``) ``value`` is the relative change (0.4 for 40 %) between the last
    ``window_s`` and the one before it. ``window_given`` says whether the text named
    a window.
    """

    metric: str
    op: str
    value: float
    window_s: float
    text: str
    change: Literal["drop", "rise"] | None = None
    window_given: bool = True

    @property
    def quantile(self) -> float | None:
        """The latency quantile (0.99 for ``p99_latency``), or None for other metrics."""
        match = _LATENCY.match(self.metric)
        if match is None:
            return None
        return int(match.group("a") or match.group("b")) / 100

    def holds(self, measured: float) -> bool:
        """True when ``measured`` (same unit as ``value``) crosses the threshold."""
        return _OPS[self.op](measured, self.value)

    def __str__(self) -> str:
        return self.text


def _convert(metric: str, kind: MetricKind, number: str, unit: str, text: str) -> float:
    """``number`` with ``unit`` in ``metric``'s base unit; ConfigError saying what fits."""
    value = float(number)
    unit = unit.replace(" ", "")
    if kind == "fraction":
        if unit == "%":
            value /= 100
        elif unit != "":
            raise ConfigError(
                f"threshold {text!r}: {metric} takes a percentage ('5%') or a fraction "
                f"('0.05'), not {unit!r}"
            )
        if not 0 <= value <= 1:
            raise ConfigError(f"threshold {text!r}: {metric} lies in 0%..100%")
        return value
    if kind == "duration":
        if unit in ("", "%") or unit.startswith("°"):
            raise ConfigError(
                f"threshold {text!r}: {metric} is a latency and needs a unit (us, ms, s), "
                "e.g. '250ms'"
            )
        return parse_duration(f"{number}{unit}")
    if kind == "temperature":
        if unit not in ("", "°c", "c"):
            raise ConfigError(
                f"threshold {text!r}: {metric} is in degrees Celsius ('80°C', '80C' or '80'), "
                f"not {unit!r}"
            )
        return value
    if kind == "power":
        if unit not in ("", "w"):
            raise ConfigError(f"threshold {text!r}: {metric} is in watts ('300W'), not {unit!r}")
        return value
    if kind == "bytes":
        return float(parse_size(f"{number}{unit}"))
    if unit != "":
        raise ConfigError(
            f"threshold {text!r}: {metric} is a plain number ('> 2000'), not {unit!r}"
        )
    return value


def parse_threshold(text: str, metric: str | None = None) -> Threshold:
    """Parse ``text``; raise :class:`ConfigError` saying what is wrong and the valid forms.

    Without ``metric`` (a switch threshold) the text names the metric and the
    comparison (``"error_rate>5% for 30s"``) and only :data:`BREAKER_METRICS` are
    allowed. With ``metric`` (a guardian trigger) the text is the rest (``"5%"``,
    ``"sudden_drop>40% in 1m"``, ``"above 0.7 for 5m"``).
    """
    if not isinstance(text, str):
        raise ConfigError(f"threshold {text!r} is not text; {THRESHOLD_FORMS}")
    windowed = _WINDOW.match(text)
    body = windowed.group("body") if windowed else text
    window_text = windowed.group("window") if windowed else None
    change: Literal["drop", "rise"] | None = None
    forms = _FORM if metric is None else THRESHOLD_FORMS
    if metric is None:
        match = _COMPARE.match(body)
        if match is None or match.group("metric") is None or match.group("op") is None:
            raise ConfigError(f"cannot parse switch threshold {text!r}: {_FORM}")
        name = match.group("metric").lower()
        canonical = _canonical(name)
        if canonical not in BREAKER_METRICS:
            raise ConfigError(f"switch threshold {text!r}: unknown metric {name!r}; {_FORM}")
        op = match.group("op")
    else:
        name = metric
        canonical = _canonical(metric)
        if canonical not in METRICS:
            raise ConfigError(
                f"unknown metric {metric!r}; metrics: {', '.join(METRICS)} "
                "(latency_pNN is accepted for pNN_latency)"
            )
        if (match := _CHANGE.match(body)) is not None:
            change = "drop" if match.group("dir").lower() == "drop" else "rise"
            op = match.group("op")
        elif (match := _WORDED.match(body)) is not None:
            op = ">" if match.group("word").lower() == "above" else "<"
        elif (match := _COMPARE.match(body)) is not None and match.group("metric") in (
            None,
            metric,
        ):
            op = match.group("op") or ">"
        else:
            raise ConfigError(f"cannot parse threshold {text!r} for {metric}; {THRESHOLD_FORMS}")
    number, unit = match.group("value"), (match.group("unit") or "").lower()
    try:
        if change is not None:
            if unit not in ("%", ""):
                raise ConfigError(f"threshold {text!r}: give the change in percent, e.g. 40%")
            value = float(number) / 100 if unit == "%" else float(number)
            if change == "drop" and value > 1:
                raise ConfigError(f"threshold {text!r}: a drop lies in 0%..100%")
        else:
            value = _convert(name, METRICS[canonical], number, unit, text)
    except ConfigError as exc:
        if metric is None:
            raise ConfigError(str(exc).replace("threshold", "switch threshold", 1)) from None
        raise ConfigError(f"{exc}; {forms}") from None
    window = parse_duration(window_text) if window_text else 30.0
    if window <= 0:
        raise ConfigError(
            f"{'switch ' if metric is None else ''}threshold {text!r}: the window must be "
            "longer than 0 s"
        )
    return Threshold(name, op, value, window, text.strip(), change, window_text is not None)


def _canonical(name: str) -> str:
    match = _LATENCY.match(name)
    if match is not None:
        return f"p{match.group('a') or match.group('b')}_latency"
    return name
