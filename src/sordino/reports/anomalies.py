"""Anomalies in a journal window, and the events that most likely caused them.

Each detector compares the window with its own baseline (robust statistics over the
seconds that are not anomalous: the median and the median absolute deviation), so a
busy service and a quiet one are judged by their own normal. Anomalous seconds close
to each other are merged into one :class:`Anomaly` with the figures around it.
:func:`correlate` ranks the journaled events near an anomaly's onset as causes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from sordino.telemetry.journal_reader import JournalEvent
from sordino.telemetry.series import ResourceRow, SecondRow

__all__ = [
    "NOT_CAUSES",
    "Anomaly",
    "Cause",
    "correlate",
    "error_bursts",
    "fragmentation_climbs",
    "is_chaos",
    "latency_spikes",
    "memory_growth",
]

MAX_GAP_S = 3
LOOKBACK_S = 60.0

# The events of chaos: ``fault_injected`` and ``fault_cleared`` (execution/faults.py).
CHAOS_PREFIX = "fault_"

# Bookkeeping, never a cause: the per-priority tallies (telemetry/availability.py), journaled
# every 10 s, and the named periods of `sordino event mark`.
NOT_CAUSES = frozenset({"availability", "event_mark", "utilisation", "feedback"})

# How much an event kind says about a sudden change, by prefix (first match wins).
_KIND_WEIGHTS = (
    (CHAOS_PREFIX, 1.0),
    ("config", 0.8),
    ("worker", 0.8),
    ("device", 0.8),
    ("breaker", 0.7),
    ("guardian", 0.6),
    ("model_", 0.5),
    ("operator_profile", 0.4),
    ("server_", 0.2),
)


@dataclass(frozen=True, slots=True)
class Cause:
    """An event ranked as a possible cause of an anomaly, and why."""

    event: JournalEvent
    score: float
    why: str


@dataclass(frozen=True, slots=True)
class Anomaly:
    """A stretch ``[start, end)`` where ``metric`` left its baseline."""

    kind: str
    model: str | None
    metric: str
    unit: str
    start: int
    end: int
    baseline: float
    peak: float
    during: float
    context: dict[str, float | None] = field(default_factory=dict)
    detail: dict[str, int] = field(default_factory=dict)
    causes: tuple[Cause, ...] = ()

    @property
    def duration_s(self) -> int:
        return self.end - self.start

    @property
    def ratio(self) -> float:
        return self.peak / self.baseline if self.baseline > 0 else math.inf

    @property
    def likely_cause(self) -> Cause | None:
        """The best-ranked event when it is a credible explanation, else None."""
        return self.causes[0] if self.causes and self.causes[0].score >= 0.5 else None


def _windows(flagged: Sequence[int], min_len: int) -> list[tuple[int, int]]:
    """Merge flagged seconds less than ``MAX_GAP_S`` apart into ``[start, end)`` windows."""
    out: list[tuple[int, int]] = []
    for t in sorted(flagged):
        if out and t - (out[-1][1] - 1) <= MAX_GAP_S:
            out[-1] = (out[-1][0], t + 1)
        else:
            out.append((t, t + 1))
    return [w for w in out if sum(1 for t in flagged if w[0] <= t < w[1]) >= min_len]


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None


def _context(
    rows: Sequence[SecondRow], start: int, end: int, others: Sequence[tuple[int, int]] = ()
) -> dict[str, float | None]:
    """The figures inside ``[start, end)`` and outside every window (the baseline)."""
    inside = [r for r in rows if start <= r.t < end]
    windows = [(start, end), *others]
    outside = [r for r in rows if not any(a <= r.t < b for a, b in windows)]
    return {
        "qps_baseline": _mean([r.requests for r in outside]),
        "qps_during": _mean([r.requests for r in inside]),
        "queue_depth_max": float(max((r.queue_depth for r in inside), default=0)),
        "busy_baseline": _mean([r.busy for r in outside]),
        "busy_during": _mean([r.busy for r in inside]),
        "batch_baseline": _mean([r.batch_size for r in outside]),
        "batch_during": _mean([r.batch_size for r in inside]),
        "compute_ms_baseline": _mean([r.compute_ms for r in outside]),
        "compute_ms_during": _mean([r.compute_ms for r in inside]),
        "queue_ms_baseline": _mean([r.queue_ms for r in outside]),
        "queue_ms_during": _mean([r.queue_ms for r in inside]),
        "temperature_during": _mean([r.temperature_c for r in inside]),
        "temperature_baseline": _mean([r.temperature_c for r in outside]),
    }


def latency_spikes(
    rows: Sequence[SecondRow], *, factor: float = 3.0, min_increase_ms: float = 10.0
) -> list[Anomaly]:
    """Stretches where one model's per-second p99 rose well above its median.

    A second is anomalous when its p99 exceeds ``factor`` times the baseline (the
    lower quartile of the window's p99s), the baseline plus six robust standard
    deviations, and the baseline plus ``min_increase_ms``; two such seconds at least
    make a spike.
    """
    timed = [(r.t, r.p99_ms) for r in rows if r.p99_ms is not None]
    if len(timed) < 10:
        return []
    values = np.array([v for _, v in timed])
    # The baseline is the lower quartile and the spread is measured on the lower half,
    # so a spike covering up to half the window cannot raise its own threshold.
    median = float(np.percentile(values, 25))
    lower = values[values <= np.median(values)]
    mad = float(np.median(np.abs(lower - median))) * 1.4826
    threshold = max(factor * median, median + 6 * mad, median + min_increase_ms)
    flagged = [t for t, v in timed if v > threshold]
    out = []
    model = rows[0].model
    spans = _windows(flagged, min_len=2)
    for start, end in spans:
        inside = [v for t, v in timed if start <= t < end]
        normal = [v for t, v in timed if not start <= t < end and v <= threshold]
        out.append(
            Anomaly(
                kind="latency_spike",
                model=model,
                metric="p99_ms",
                unit="ms",
                start=start,
                end=end,
                baseline=float(np.median(normal)) if normal else median,
                peak=float(max(inside)),
                during=float(np.mean(inside)),
                context=_context(rows, start, end, spans),
            )
        )
    return out


def error_bursts(
    rows: Sequence[SecondRow], *, min_rate: float = 0.05, min_errors: int = 3
) -> list[Anomaly]:
    """Stretches where one model's error rate rose above its usual rate."""
    if not rows:
        return []
    rates = np.array([r.error_rate for r in rows if r.requests])
    usual = float(np.median(rates)) if rates.size else 0.0
    flagged = [
        r.t for r in rows if r.errors >= min_errors and r.error_rate >= max(min_rate, 3 * usual)
    ]
    out = []
    for start, end in _windows(flagged, min_len=1):
        inside = [r for r in rows if start <= r.t < end]
        outside = [r for r in rows if not start <= r.t < end]
        reasons: dict[str, int] = {}
        for row in inside:
            for reason, count in row.errors_by_reason.items():
                reasons[reason] = reasons.get(reason, 0) + count
        requests_out = sum(r.requests for r in outside)
        errors_in, requests_in = sum(r.errors for r in inside), sum(r.requests for r in inside)
        out.append(
            Anomaly(
                kind="error_burst",
                model=rows[0].model,
                metric="error_rate",
                unit="%",
                start=start,
                end=end,
                baseline=sum(r.errors for r in outside) / requests_out if requests_out else 0.0,
                peak=max(r.error_rate for r in inside),
                during=errors_in / requests_in if requests_in else 0.0,
                context=_context(rows, start, end) | {"errors": float(errors_in)},
                detail=reasons,
            )
        )
    return out


def fragmentation_climbs(
    resources: Sequence[ResourceRow], *, min_rise: float = 0.15, min_peak: float = 0.3
) -> list[Anomaly]:
    """A climb of the memory pool's fragmentation from its early level."""
    timed = [(r.t, r.fragmentation) for r in resources if r.fragmentation is not None]
    if len(timed) < 10:
        return []
    values = np.array([v for _, v in timed])
    baseline = float(np.median(values[: max(3, len(values) // 4)]))
    peak = float(values.max())
    if peak - baseline < min_rise or peak < min_peak:
        return []
    level = baseline + (peak - baseline) / 2
    above = [t for t, v in timed if v >= level]
    return [
        Anomaly(
            kind="fragmentation_climb",
            model=None,
            metric="fragmentation",
            unit="ratio",
            start=min(above),
            end=max(above) + 1,
            baseline=baseline,
            peak=peak,
            during=float(np.mean([v for t, v in timed if v >= level])),
        )
    ]


def memory_growth(
    resources: Sequence[ResourceRow], *, min_share: float = 0.10, min_bytes: float = 64 * 2**20
) -> list[Anomaly]:
    """Process memory that grew steadily over the window (a leak, or a cache filling)."""
    if len(resources) < 30:
        return []
    t = np.array([r.t for r in resources], dtype=np.float64)
    rss = np.array([r.rss_bytes for r in resources], dtype=np.float64)
    tenth = max(3, len(rss) // 10)
    first, last = float(np.median(rss[:tenth])), float(np.median(rss[-tenth:]))
    if last - first < max(min_share * first, min_bytes):
        return []
    slope = float(np.polyfit(t - t[0], rss, 1)[0])
    return [
        Anomaly(
            kind="memory_growth",
            model=None,
            metric="rss_bytes",
            unit="bytes",
            start=int(t[0]),
            end=int(t[-1]) + 1,
            baseline=first,
            peak=float(rss.max()),
            during=last,
            context={"bytes_per_hour": slope * 3600},
        )
    ]


def is_chaos(kind: str) -> bool:
    """Whether an event of ``kind`` records an injected fault (chaos) or its end."""
    return kind.startswith(CHAOS_PREFIX)


def _concerns(event: JournalEvent) -> str | None:
    """The model an event is about: its ``model`` field, or a ``worker:MODEL[/N]`` subject."""
    about = event.payload.get("model")
    if isinstance(about, str):
        return about
    kind, _, rest = event.subject.partition(":")
    if kind == "worker" and rest:
        return rest.partition("/")[0]
    return None


def _same_injection(cleared: JournalEvent, event: JournalEvent) -> bool:
    """Whether ``cleared`` ends ``event``: the same subject and, when both carry one, id."""
    ids = (cleared.payload.get("id"), event.payload.get("id"))
    return cleared.subject == event.subject and (None in ids or ids[0] == ids[1])


def _weight(kind: str) -> float:
    for prefix, weight in _KIND_WEIGHTS:
        if kind.startswith(prefix):
            return weight
    return 0.3


def _cleared_at_end(offset: float) -> str:
    """Say when a fault was cleared relative to the anomaly's end, ``offset`` seconds after."""
    if abs(offset) < 0.05:
        return "cleared as the anomaly ended"
    return f"cleared {abs(offset):.1f} s {'after' if offset > 0 else 'before'} the anomaly ended"


def correlate(anomaly: Anomaly, events: Sequence[JournalEvent]) -> Anomaly:
    """Return ``anomaly`` with the events near its onset ranked as causes."""
    causes = []
    for event in events:
        if (
            not anomaly.start - LOOKBACK_S <= event.t < anomaly.end
            or event.kind.endswith("_cleared")
            or event.kind in NOT_CAUSES
        ):
            continue
        score = _weight(event.kind)
        why = []
        about = _concerns(event)
        if anomaly.model is None:
            pass
        elif about == anomaly.model or (about is None and anomaly.model in event.subject):
            score *= 1.5
            why.append(f"concerns {anomaly.model}")
        elif about is not None:
            score *= 0.3
            why.append(f"concerns another model ({about})")
        lead = anomaly.start - event.t
        # A window's first second may be a noisy one merged with the spike across a gap
        # of up to MAX_GAP_S: an event that far into it may still be at the true onset
        # (a fault injected 2.05 s into a window that began with two noisy seconds lost
        # to a worker's start 3 s before it).
        if -MAX_GAP_S <= lead <= 5:
            score *= 2
            why.append(f"{abs(lead):.1f} s {'before' if lead >= 0 else 'after'} the onset")
        elif lead < -2:
            score *= 0.7
            why.append(f"{-lead:.0f} s into the anomaly")
        else:
            score *= math.exp(-(lead - 5) / 30)
            why.append(f"{lead:.0f} s before the onset")
        cleared = [
            e
            for e in events
            if e.kind.endswith("_cleared") and _same_injection(e, event) and e.t >= event.t
        ]
        if cleared and cleared[0].t < anomaly.start:
            score *= 0.1  # over before the anomaly began: it cannot have caused it
            why.append(f"cleared {anomaly.start - cleared[0].t:.0f} s before the onset")
        ended = [e for e in cleared if abs(e.t - anomaly.end) <= 5]
        if ended:
            score *= 1.3
            why.append(_cleared_at_end(ended[0].t - anomaly.end))
        causes.append(Cause(event, score, "; ".join(why)))
    causes.sort(key=lambda c: -c.score)
    return replace(anomaly, causes=tuple(causes[:5]))
