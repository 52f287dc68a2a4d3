"""Switch thresholds such as ``"error_rate>5% for 30s"``: metric, comparison, value, window.

Grammar (spaces optional)::

    <metric> <op> <value>[<unit>] [for <window>]

- ``metric``: ``error_rate``, or a latency percentile ``p50_latency``, ``p90_latency``,
  ``p95_latency``, ``p99_latency`` (``latency_p99`` is accepted too).
- ``op``: ``>``, ``>=``, ``<``, ``<=``.
- ``value``: for ``error_rate`` a percentage (``5%``) or a fraction (``0.05``); for a
  latency a duration with a unit (``250ms``, ``1.5s``, ``800us``).
- ``window``: a duration (``30s``, ``1m``); the metric is measured over the last
  ``window`` of requests. Without ``for ...`` the window is 30 s.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

from sordino.config.units import parse_duration
from sordino.errors import ConfigError

__all__ = ["Threshold", "parse_threshold"]

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
_PATTERN = re.compile(
    r"^\s*(?P<metric>[a-z_0-9]+)\s*(?P<op>>=|<=|>|<)\s*(?P<value>[0-9]*\.?[0-9]+)\s*"
    r"(?P<unit>%|[a-zµ]+)?\s*(?:for\s+(?P<window>\S.*?))?\s*$",
    re.IGNORECASE,
)
_LATENCY = re.compile(r"^(?:p(?P<a>\d{2})_latency|latency_p(?P<b>\d{2}))$")
_FORM = (
    "write '<metric> <op> <value> for <window>', e.g. 'error_rate>5% for 30s' or "
    "'p99_latency>250ms for 1m'; metrics: error_rate, p50_latency, p90_latency, "
    "p95_latency, p99_latency; ops: >, >=, <, <="
)


@dataclass(frozen=True, slots=True)
class Threshold:
    """A parsed threshold. ``value`` is a fraction (error rate) or seconds (latency)."""

    metric: str
    op: str
    value: float
    window_s: float
    text: str

    @property
    def quantile(self) -> float | None:
        """The latency quantile (0.99 for ``p99_latency``), or None for ``error_rate``."""
        match = _LATENCY.match(self.metric)
        if match is None:
            return None
        return int(match.group("a") or match.group("b")) / 100

    def holds(self, measured: float) -> bool:
        """True when ``measured`` (same unit as ``value``) crosses the threshold."""
        return _OPS[self.op](measured, self.value)

    def __str__(self) -> str:
        return self.text


def parse_threshold(text: str) -> Threshold:
    """Parse ``text``; raise :class:`ConfigError` saying what is wrong and the valid form."""
    match = _PATTERN.match(text)
    if match is None:
        raise ConfigError(f"cannot parse switch threshold {text!r}: {_FORM}")
    metric = match.group("metric").lower()
    number = float(match.group("value"))
    unit = (match.group("unit") or "").lower()
    if metric == "error_rate":
        if unit == "%":
            value = number / 100
        elif unit == "":
            value = number
        else:
            raise ConfigError(
                f"switch threshold {text!r}: error_rate takes a percentage ('5%') or a "
                f"fraction ('0.05'), not {unit!r}"
            )
        if not 0 <= value <= 1:
            raise ConfigError(f"switch threshold {text!r}: an error rate lies in 0%..100%")
    elif _LATENCY.match(metric):
        if unit in ("", "%"):
            raise ConfigError(
                f"switch threshold {text!r}: a latency needs a unit (us, ms, s), e.g. '250ms'"
            )
        value = parse_duration(f"{match.group('value')}{unit}")
    else:
        raise ConfigError(f"switch threshold {text!r}: unknown metric {metric!r}; {_FORM}")
    window_text = match.group("window")
    window = parse_duration(window_text) if window_text else 30.0
    if window <= 0:
        raise ConfigError(f"switch threshold {text!r}: the window must be longer than 0 s")
    return Threshold(metric, match.group("op"), value, window, text.strip())
