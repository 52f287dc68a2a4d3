"""Diagnose: from a journal window to findings, likely causes and recommendations.

:func:`diagnose` is pure: it takes a :class:`JournalWindow` (read from a journal file
or fetched from a server) and returns a :class:`Diagnosis`. Rendering it as HTML or
PDF is :mod:`sordino.reports.render`'s business.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sordino.errors import OutOfMemory
from sordino.reports.anomalies import (
    Anomaly,
    correlate,
    error_bursts,
    fragmentation_climbs,
    is_chaos,
    latency_spikes,
    memory_growth,
)
from sordino.reports.layers import Layers, layers_of
from sordino.telemetry.availability import rejection_class
from sordino.telemetry.forecast import ForecastSeries, forecast_series, minutes_short
from sordino.telemetry.journal_reader import JournalWindow
from sordino.telemetry.profile_data import OperatorProfile

__all__ = [
    "FOCUS",
    "Diagnosis",
    "ModelSummary",
    "diagnose",
    "explanation",
    "load_rise",
    "memory_pressure",
    "when",
]

FOCUS = ("latency_spike", "memory", "errors", "all")
# The share of requests a model should answer within its SLO, and the fewest requests
# that share is judged on: below 100 a single slow request would decide a 99% target.
SLO_TARGET = 0.99
MIN_SLO_REQUESTS = 100
POOL_FULL_SHARE = 0.9
"""An arena this full leaves overflow protection to shrink, hold back or refuse batches."""
POOL_FULL_SECONDS = 10
"""Near-full seconds in a window that make increase_memory_pool a recommendation."""
OUT_OF_MEMORY = OutOfMemory.reason
_KINDS = {
    "latency_spike": {"latency_spike"},
    "memory": {"fragmentation_climb", "memory_growth"},
    "errors": {"error_burst"},
}


def when(t: float) -> str:
    """A local wall-clock time for reports."""
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _hms(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S")


@dataclass(frozen=True, slots=True)
class ModelSummary:
    """One model over the whole window."""

    name: str
    seconds: int
    requests: int
    errors: int
    qps_mean: float
    qps_peak: int
    p50_ms: float | None
    p99_ms: float | None
    p99_max_ms: float | None
    slo_ms: float | None
    slo_attainment: float | None
    batch_mean: float | None
    busy_mean: float
    refused: int = 0
    """Refused before acceptance by the server (503 shed, queue full; 429): not in requests."""
    client_errors: int = 0
    """Refused as the client's mistake (4xx but 429): not in requests."""
    client_reasons: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """What diagnose found in a window, ready to render."""

    start: float
    end: float
    focus: str
    source: str
    window: JournalWindow
    models: list[ModelSummary]
    anomalies: list[Anomaly]
    recommendations: list[str]
    profiles: list[OperatorProfile] = field(default_factory=list)
    forecasts: dict[str, ForecastSeries] = field(default_factory=dict)
    memory_forecast: ForecastSeries | None = None
    hidden: dict[str, int] = field(default_factory=dict)
    """Findings of kinds outside ``focus``, by kind: detected, not shown."""
    forecast_short: dict[str, int] = field(default_factory=dict)
    """Models with traffic but too little history: minutes more their forecast needs."""
    memory_short: int = 0
    layers: Layers | None = None
    """Bandwidth, instance utilisation and user satisfaction in the window."""


def _summary(window: JournalWindow, name: str, slo_ms: float | None) -> ModelSummary:
    rows = window.rows_of(name)
    requests = sum(r.requests for r in rows)
    p50 = [r.p50_ms for r in rows if r.p50_ms is not None]
    p99 = [r.p99_ms for r in rows if r.p99_ms is not None]
    sizes = [r.batch_size for r in rows if r.batch_size is not None]
    client_reasons: dict[str, int] = {}
    for row in rows:
        for reason, n in row.rejected_by_reason.items():
            if rejection_class(reason) == "client_error":
                client_reasons[reason] = client_reasons.get(reason, 0) + n
    return ModelSummary(
        name=name,
        seconds=len(rows),
        requests=requests,
        errors=sum(r.errors for r in rows),
        qps_mean=requests / len(rows) if rows else 0.0,
        qps_peak=max((r.requests for r in rows), default=0),
        p50_ms=float(np.median(p50)) if p50 else None,
        p99_ms=float(np.median(p99)) if p99 else None,
        p99_max_ms=max(p99) if p99 else None,
        slo_ms=slo_ms,
        slo_attainment=sum(r.slo_met for r in rows) / requests if requests else None,
        batch_mean=float(np.mean(sizes)) if sizes else None,
        busy_mean=float(np.mean([r.busy for r in rows])) if rows else 0.0,
        refused=sum(r.refused for r in rows),
        client_errors=sum(client_reasons.values()),
        client_reasons=client_reasons,
    )


def _slos(window: JournalWindow) -> dict[str, float]:
    slos = {}
    for event in window.events:
        if event.kind == "model_loaded" and "slo_p99_ms" in event.payload:
            slos[event.subject.split("/")[0]] = float(event.payload["slo_p99_ms"])
    return slos


def _per_minute(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    minutes: dict[int, list[float]] = {}
    for t, v in points:
        minutes.setdefault(t // 60 * 60, []).append(v)
    return [(m, float(np.mean(vs))) for m, vs in sorted(minutes.items())]


def diagnose(
    window: JournalWindow,
    *,
    focus: str = "all",
    source: str = "",
    profiles: list[OperatorProfile] | None = None,
    step: Callable[[str], None] | None = None,
) -> Diagnosis:
    """Find anomalies in ``window``, rank their causes, and recommend what to do."""
    if focus not in FOCUS:
        raise ValueError(f"focus {focus!r} is not one of {', '.join(FOCUS)}")
    progress = step or (lambda name: None)
    wanted = set().union(*_KINDS.values()) if focus == "all" else _KINDS[focus]
    slos = _slos(window)
    progress("baselines")
    models = [_summary(window, name, slos.get(name)) for name in window.models]
    progress("anomalies")
    # Every detector runs whatever the focus: the focus only filters what they found, so
    # a focused report shows exactly the findings of that kind `--focus all` shows, and
    # says how many others it left out.
    found: list[Anomaly] = []
    for name in window.models:
        rows = window.rows_of(name)
        found += latency_spikes(rows)
        found += error_bursts(rows)
    found += fragmentation_climbs(window.resources)
    found += memory_growth(window.resources)
    hidden: dict[str, int] = {}
    for anomaly in found:
        if anomaly.kind not in wanted:
            hidden[anomaly.kind] = hidden.get(anomaly.kind, 0) + 1
    found = [a for a in found if a.kind in wanted]
    progress("correlation")
    anomalies = sorted((correlate(a, window.events) for a in found), key=lambda a: a.start)
    progress("forecast")
    forecasts = {}
    short = {}
    for name in window.models:
        points = _per_minute([(r.t, r.requests) for r in window.rows_of(name)])
        series = forecast_series(points)
        if series is not None:
            forecasts[name] = series
        else:
            short[name] = max(1, minutes_short(points))
    memory_points = _per_minute([(r.t, r.rss_bytes) for r in window.resources])
    memory = forecast_series(memory_points)
    found_profiles = list(profiles or [])
    for event in window.events:
        if event.kind == "operator_profile" and "operators" in event.payload:
            profile = OperatorProfile.from_json(event.payload)
            if all(p.started_at != profile.started_at for p in found_profiles):
                found_profiles.append(profile)
    diagnosis = Diagnosis(
        start=window.start,
        end=window.end,
        focus=focus,
        source=source,
        window=window,
        models=models,
        anomalies=anomalies,
        recommendations=[],
        profiles=found_profiles,
        forecasts=forecasts,
        memory_forecast=memory,
        hidden=hidden,
        forecast_short=short,
        memory_short=0 if memory is not None else max(1, minutes_short(memory_points)),
        layers=layers_of(window),
    )
    progress("recommendations")
    diagnosis.recommendations.extend(recommend(diagnosis))
    return diagnosis


def describe(anomaly: Anomaly) -> str:
    """One sentence with the numbers of ``anomaly``."""
    span = f"from {_hms(anomaly.start)} to {_hms(anomaly.end)} ({anomaly.duration_s} s)"
    if anomaly.kind == "latency_spike":
        return (
            f"p99 latency of {anomaly.model} rose from {anomaly.baseline:.1f} ms to a peak of "
            f"{anomaly.peak:.1f} ms ({anomaly.ratio:.0f}×, mean {anomaly.during:.1f} ms) {span}"
        )
    if anomaly.kind == "error_burst":
        reasons = ", ".join(
            f"{k} {v}" for k, v in sorted(anomaly.detail.items(), key=lambda kv: -kv[1])
        )
        return (
            f"{anomaly.model} failed {anomaly.during:.1%} of its requests {span} "
            f"(usually {anomaly.baseline:.2%}); reasons: {reasons or 'unknown'}"
        )
    if anomaly.kind == "fragmentation_climb":
        return (
            f"memory pool fragmentation climbed from {anomaly.baseline:.0%} to "
            f"{anomaly.peak:.0%} {span}"
        )
    mb = 2**20
    rate = anomaly.context.get("bytes_per_hour") or 0.0
    return (
        f"process memory grew from {anomaly.baseline / mb:.0f} MB to {anomaly.during / mb:.0f} MB "
        f"(+{rate / mb:.0f} MB/h) {span}"
    )


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def load_rise(anomaly: Anomaly) -> str | None:
    """``"load rose from 2.0 to 20.0 requests/s (10.0×) in the same seconds"`` when the
    model's load during ``anomaly`` was over 1.5 times its load outside it, else None.

    With no journaled cause, such a rise is the explanation the report names.
    """
    qb, qd = anomaly.context.get("qps_baseline"), anomaly.context.get("qps_during")
    if qd is None or qd < 1.0 or (qb is not None and qd <= 1.5 * qb):
        return None
    times = f" ({qd / qb:.1f}×)" if qb else " (from idle)"
    return f"load rose from {qb or 0.0:.1f} to {qd:.1f} requests/s{times} in the same seconds"


def explanation(anomaly: Anomaly) -> str:
    """The likely cause in a few words: the journaled event, else a load rise, else none."""
    cause = anomaly.likely_cause
    if cause is not None:
        e = cause.event
        return f"{e.kind} on {e.subject}"
    rise = load_rise(anomaly)
    if rise is not None:
        return f"{rise} (no journaled event)"
    return "no journaled event or load change explains it"


def _advice(anomaly: Anomaly) -> str:
    cause = anomaly.likely_cause
    ctx = anomaly.context
    if cause is not None:
        event = cause.event
        if is_chaos(event.kind):
            fault = event.payload.get("fault")
            what = f"a {fault} fault, " if isinstance(fault, str) else ""
            return (
                f"The {event.kind} event at {_hms(event.t)} on {event.subject} "
                f"({what}{event.cause}) explains it ({cause.why}). No tuning is needed: the "
                "runtime behaved as injected; if the injection was not planned, find who ran it."
            )
        return (
            f"The likely cause is the {event.kind} event at {_hms(event.t)} on {event.subject}"
            f"{' (' + event.cause + ')' if event.cause else ''}: {cause.why}. Check that change "
            "first; revert it if the effect was not intended."
        )
    rise = load_rise(anomaly)
    if rise is not None:
        return (
            f"{rise[0].upper()}{rise[1:]}, with the queue up to "
            f"{ctx.get('queue_depth_max', 0):.0f} and "
            f"instances {_fmt((ctx.get('busy_during') or 0) * 100, 0)}% busy: add instances "
            "(instance_count) or let batches grow (max_batch_size) for such bursts."
        )
    cb, cd = ctx.get("compute_ms_baseline"), ctx.get("compute_ms_during")
    if cb and cd and cd > 2 * cb:
        temp = ctx.get("temperature_during")
        hot = f"; the device was at {temp:.0f} °C" if temp is not None else ""
        return (
            f"No event explains it and load was steady, but compute per request rose from "
            f"{cb:.2f} to {cd:.2f} ms{hot}: look for contention on the machine (other "
            "processes, throttling) or profile the model with `sordino profile`."
        )
    return (
        "No journaled event or load change explains it: compare with the host's own logs "
        "for the same minutes, and profile the model with `sordino profile` if it recurs."
    )


def _size(nbytes: int) -> str:
    """A size as ``reconfigure --memory-pool-size`` takes it: whole GB, else whole MB."""
    gib, mib = 1 << 30, 1 << 20
    if nbytes >= gib:
        return f"{-(-nbytes // gib)}GB"
    return f"{-(-nbytes // mib)}MB"


def memory_pressure(window: JournalWindow) -> str | None:
    """``increase_memory_pool`` when the window shows the arena short of space, else None.

    Evidence, each from the journal: seconds with the arena at least
    ``POOL_FULL_SHARE`` in use (its resource rows), and requests that failed or were
    refused for memory (reason ``out_of_memory``: a batch that could never fit, or
    overflow protection's wait for space that ran out). One refusal, or
    ``POOL_FULL_SECONDS`` near-full seconds, is enough. The suggested size is twice
    the arena's, and at least twice the most it held.
    """
    pool = [
        (r.pool_in_use_bytes, r.pool_reserved_bytes)
        for r in window.resources
        if r.pool_reserved_bytes and r.pool_in_use_bytes is not None
    ]
    full = sum(used >= POOL_FULL_SHARE * reserved for used, reserved in pool)
    refused = 0
    for name in window.models:
        for row in window.rows_of(name):
            refused += row.errors_by_reason.get(OUT_OF_MEMORY, 0)
            refused += row.rejected_by_reason.get(OUT_OF_MEMORY, 0)
    if not refused and full < POOL_FULL_SECONDS:
        return None
    evidence = []
    reserved = max((reserved for _, reserved in pool), default=0)
    peak = max((used for used, _ in pool), default=0)
    if full:
        evidence.append(
            f"the shared-memory pool was at least {POOL_FULL_SHARE:.0%} full for {full} s "
            f"(at most {peak / 2**20:.0f} of {reserved / 2**20:.0f} MiB in use)"
        )
    if refused:
        evidence.append(f"{refused} requests failed or were refused for memory (out_of_memory)")
    size = (
        f"--memory-pool-size {_size(max(2 * reserved, 2 * peak))}"
        if reserved
        else "--memory-pool-size SIZE (twice the pool's size now)"
    )
    return (
        f"increase_memory_pool: {' and '.join(evidence)}. Raise the pool without a restart: "
        f"`sordino reconfigure {size}` (memory.pool_size), then diagnose the next window "
        "to check the pressure is gone."
    )


def recommend(diagnosis: Diagnosis) -> list[str]:
    """Recommendations, each citing the numbers that support it."""
    out = []
    for anomaly in diagnosis.anomalies:
        if anomaly.kind in ("latency_spike", "error_burst"):
            out.append(f"{describe(anomaly)}. {_advice(anomaly)}")
        elif anomaly.kind == "fragmentation_climb":
            out.append(
                f"{describe(anomaly)}. Lower the pool's compaction threshold below "
                f"{anomaly.peak:.0%} or give batches fixed size classes."
            )
        else:
            out.append(
                f"{describe(anomaly)}. If the growth continues at this rate, plan memory for "
                "it or look for a cache without a bound."
            )
    for model in diagnosis.models:
        if model.client_errors:
            received = model.requests + model.refused + model.client_errors
            reasons = ", ".join(
                f"{k} {v}" for k, v in sorted(model.client_reasons.items(), key=lambda kv: -kv[1])
            )
            out.append(
                f"{model.name} refused {model.client_errors} of {received} requests as client "
                f"errors ({model.client_errors / received:.1%}; {reasons}): the clients send "
                "requests the model cannot take; the server's answers say what to fix."
            )
        if (
            model.slo_attainment is not None
            and model.slo_ms
            and model.requests >= MIN_SLO_REQUESTS
            and model.slo_attainment < SLO_TARGET
        ):
            p99 = (
                f"; p99 was {model.p99_ms:.1f} ms typically and {model.p99_max_ms:.1f} ms at worst"
                if model.p99_ms is not None and model.p99_max_ms is not None
                else ""
            )
            out.append(
                f"{model.name} answered {model.slo_attainment:.1%} of {model.requests} requests "
                f"within its {model.slo_ms:.0f} ms SLO (target {SLO_TARGET:.0%}){p99}."
            )
        if model.busy_mean > 0.8:
            out.append(
                f"{model.name}'s instances were {model.busy_mean:.0%} busy on average: add "
                "instances before the next peak."
            )
        forecast = diagnosis.forecasts.get(model.name)
        if forecast is not None and model.qps_peak and forecast.peak > 1.2 * model.qps_peak:
            out.append(
                f"{model.name}'s forecast peaks at {forecast.peak:.0f} requests/s in the next "
                f"hour, above the window's highest {model.qps_peak} requests/s: check capacity."
            )
    pressure = memory_pressure(diagnosis.window)
    if pressure is not None:
        out.append(pressure)
    for profile in diagnosis.profiles:
        top = profile.top(1)
        if top and top[0].share > 0.5:
            out.append(
                f"In {profile.model}, {top[0].op} takes {top[0].share:.0%} of operator time "
                f"({top[0].total_ms:.1f} ms over {profile.batches} batches): it is where "
                "optimisation (fusion, quantisation, a faster provider) pays most."
            )
    if diagnosis.hidden:
        others = ", ".join(
            f"{k.replace('_', ' ')} ×{n}" for k, n in sorted(diagnosis.hidden.items())
        )
        out.append(
            f"Outside the focus ({diagnosis.focus}) the same window holds {others}: "
            "diagnose with --focus all to see them."
        )
    if not diagnosis.anomalies:
        p99s = [m.p99_max_ms for m in diagnosis.models if m.p99_max_ms is not None]
        latency = f"the worst per-second p99 was {max(p99s):.1f} ms and " if p99s else ""
        out.append(
            f"No anomaly found between {when(diagnosis.start)} and {when(diagnosis.end)}: "
            f"{latency}no error burst occurred."
        )
    return out
