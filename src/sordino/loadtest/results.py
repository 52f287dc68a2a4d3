"""What a run measured: latency in HDR histograms, errors by status, targets and verdicts.

Every latency is in microseconds, from the request's *intended* send time to its
answer (so time the request spent waiting to leave — a slow client, a full in-flight
cap — counts, as it does for a user). Histograms are HdrHistogram's (``hdrh``): a
recording is O(1), percentiles are exact to three significant digits, and histograms
of groups and windows add up.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram

from sordino.config.units import parse_duration
from sordino.errors import ConfigError

__all__ = [
    "FIRST_RESPONSE",
    "PERCENTILES",
    "Condition",
    "LatencySummary",
    "Recorder",
    "parse_conditions",
    "status_class",
]

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
FIRST_RESPONSE = "first response"  # group kind: streaming requests' first event
_HIGHEST_US = 600_000_000  # ten minutes; slower answers are recorded as ten minutes


_MESSAGES = 32  # distinct error messages kept; later ones are counted as "other"
_MESSAGE_CHARS = 300


def status_class(status: str) -> str:
    """How an answer's ``status`` counts: ``ok``, ``client_error`` (a 4xx but 429: the
    request itself was refused), ``refused`` (503 or 429: the server would not take it
    now), ``server_error`` (another 5xx, a failed stream) or ``transport`` (a timeout,
    a connection error)."""
    if status == "ok":
        return "ok"
    if status in ("503", "429"):
        return "refused"
    if status.isdigit():
        return "client_error" if status.startswith("4") else "server_error"
    if status.startswith("stream-"):
        return "server_error"
    return "transport"


def new_histogram() -> HdrHistogram:
    return HdrHistogram(1, _HIGHEST_US, 3)


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Percentiles (milliseconds) and counts of one group or window."""

    count: int
    errors: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    max_ms: float | None
    mean_ms: float | None

    @classmethod
    def of(cls, histogram: HdrHistogram, errors: int = 0) -> LatencySummary:
        n = histogram.get_total_count()
        if n == 0:
            return cls(0, errors, None, None, None, None, None, None)
        p = histogram.get_percentile_to_value_dict(list(PERCENTILES))
        return cls(
            count=n,
            errors=errors,
            p50_ms=p[50.0] / 1000,
            p90_ms=p[90.0] / 1000,
            p99_ms=p[99.0] / 1000,
            p999_ms=p[99.9] / 1000,
            max_ms=histogram.get_max_value() / 1000,
            mean_ms=histogram.get_mean_value() / 1000,
        )

    def value(self, metric: str) -> float | None:
        """``p50``/``p90``/``p99``/``p99.9``/``max``/``mean`` in ms; ``errors`` as a share."""
        if metric == "errors":
            total = self.count + self.errors
            return self.errors / total if total else 0.0
        name = {"p99.9": "p999_ms", "max": "max_ms", "mean": "mean_ms"}.get(metric, f"{metric}_ms")
        value: float | None = getattr(self, name, None)
        return value


@dataclass(slots=True)
class _Group:
    histogram: HdrHistogram = field(default_factory=new_histogram)
    errors: int = 0


class Recorder:
    """Collects the outcome of every request, by group and by time window."""

    def __init__(self, window_s: float, windows: int) -> None:
        self.window_s = window_s
        self.total = _Group()
        self.groups: dict[tuple[str, str], _Group] = {}
        self.windows = [_Group() for _ in range(windows)]
        self.sent = [0] * windows
        self.window_errors: list[Counter[str]] = [Counter() for _ in range(windows)]
        self.errors: Counter[str] = Counter()
        # (status, the server's message) -> answers; at most _MESSAGES distinct ones.
        self.messages: Counter[tuple[str, str]] = Counter()
        self.lag = new_histogram()  # actual send time - intended send time

    def _window(self, t: float) -> int:
        return min(len(self.windows) - 1, max(0, int(t / self.window_s)))

    def record_send(self, intended: float, lag_s: float) -> None:
        self.sent[self._window(intended + lag_s)] += 1  # when it really left
        self.lag.record_value(max(1, int(lag_s * 1e6)))

    def record(
        self,
        intended: float,
        latency_s: float,
        status: str,
        keys: list[tuple[str, str]],
        message: str | None = None,
    ) -> None:
        """One answer: ``status`` is "ok", an HTTP status code, or a transport failure;
        ``message`` is what the server said with a refusal (its ``error``)."""
        if message is not None:
            text = message if len(message) <= _MESSAGE_CHARS else message[:297] + "..."
            key = (status, text)
            if key not in self.messages and len(self.messages) >= _MESSAGES:
                key = (status, "(other messages)")
            self.messages[key] += 1
        groups = [self.total, self.windows[self._window(intended)]]
        groups += [self.groups.setdefault(key, _Group()) for key in keys]
        if status == "ok":
            value = max(1, int(latency_s * 1e6))
            for group in groups:
                group.histogram.record_value(value)
        else:
            self.errors[status] += 1
            self.window_errors[self._window(intended)][status] += 1
            for group in groups:
                group.errors += 1

    def record_first(self, label: str, latency_s: float) -> None:
        """A streaming request's first event: the group (``first response``, class)."""
        group = self.groups.setdefault((FIRST_RESPONSE, label), _Group())
        group.histogram.record_value(max(1, int(latency_s * 1e6)))

    def summary(self, key: tuple[str, str] | None = None) -> LatencySummary:
        group = self.total if key is None else self.groups.get(key, _Group())
        return LatencySummary.of(group.histogram, group.errors)

    def window_summaries(self) -> list[LatencySummary]:
        return [LatencySummary.of(w.histogram, w.errors) for w in self.windows]


_CONDITION = re.compile(
    r"^\s*(?:(?P<selector>[^:<>]+):)?\s*(?P<metric>p\d+(?:\.\d+)?|max|mean|errors)\s*"
    r"(?P<op>[<>])\s*(?P<value>[^\s]+)\s*$"
)
_METRICS = ("p50", "p90", "p99", "p99.9", "max", "mean", "errors")


@dataclass(frozen=True, slots=True)
class Condition:
    """``[selector:]metric<value`` (an SLO) or ``[selector:]metric>value`` (a failure).

    ``selector`` names a traffic class (its tag or tenant) or a model; None is all
    traffic. Latency values are milliseconds, ``errors`` a share (0..1).
    """

    text: str
    selector: str | None
    metric: str
    op: str
    value: float

    def holds(self, summary: LatencySummary) -> bool | None:
        """Whether the measured value satisfies ``op value``; None if nothing was measured."""
        measured = summary.value(self.metric)
        if measured is None:
            return None
        return measured < self.value if self.op == "<" else measured > self.value

    def describe_value(self, value: float | None) -> str:
        if value is None:
            return "n/a"
        return f"{value:.2%}" if self.metric == "errors" else f"{value:.1f} ms"

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "selector": self.selector,
            "metric": self.metric,
            "op": self.op,
            "value": self.value,
        }


def parse_conditions(text: str, *, option: str, op: str) -> list[Condition]:
    """Parse comma-separated conditions such as ``premium:p99<3s,p50<200ms``."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = _CONDITION.match(part)
        hint = (
            f"write [CLASS:]METRIC{op}VALUE, METRIC one of {', '.join(_METRICS)}, e.g. "
            f"'premium:p99{op}3s' or 'errors{op}1%'"
        )
        if match is None or match["metric"] not in _METRICS:
            raise ConfigError(f"{option} {part!r} is not a condition: {hint}")
        if match["op"] != op:
            raise ConfigError(f"{option} {part!r} must use '{op}': {hint}")
        raw = match["value"]
        try:
            if match["metric"] == "errors":
                value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
            else:
                value = parse_duration(raw) * 1000
        except (ValueError, ConfigError) as exc:
            raise ConfigError(f"{option} {part!r}: bad value {raw!r} ({exc}); {hint}") from None
        selector = match["selector"].strip() if match["selector"] else None
        out.append(Condition(part, selector, match["metric"], op, value))
    return out
