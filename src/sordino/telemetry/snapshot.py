"""The live telemetry snapshot as JSON: what ``sordino monitor`` and ``/dashboard`` read.

``GET /v2/sordino/telemetry?seconds=N`` returns :func:`snapshot`: per model the
current figures (over the last few closed seconds) and column-wise series of the
last ``N`` seconds, the resource figures and their series, the latest events,
worker state, the forecast, the last operator profiles and the journal's state.
Columns are lists of equal length so a chart library can plot them as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

import numpy as np

from sordino import __version__
from sordino.records import ExecutionStatistics
from sordino.telemetry.forecast import MIN_POINTS, short_message
from sordino.telemetry.hub import Telemetry
from sordino.telemetry.satisfaction import correlate
from sordino.telemetry.series import ResourceRow, SecondRow
from sordino.telemetry.utilisation import utilisation_payload

__all__ = [
    "CURRENT_WINDOW_S",
    "current_figures",
    "forecast_status",
    "snapshot",
    "workers_summary",
]

CURRENT_WINDOW_S = 5
SERIES_COLUMNS = (
    "qps", "p50_ms", "p99_ms", "errors", "error_rate", "batch_size", "queue_depth", "busy",
    "client_errors", "refused",
)  # fmt: skip
RESOURCE_COLUMNS = (
    "rss_bytes", "pool_reserved_bytes", "pool_in_use_bytes", "fragmentation",
    "cpu_temp_c", "gpu_memory_used_bytes", "gpu_temp_c",
)  # fmt: skip


def current_figures(rows: list[SecondRow]) -> dict[str, Any]:
    """Figures over ``rows`` (the last few seconds): rates are means, p99 the worst second."""
    if not rows:
        return {}
    requests = sum(r.requests for r in rows)
    errors = sum(r.errors for r in rows)
    p50s = [r.p50_ms for r in rows if r.p50_ms is not None]
    p99s = [r.p99_ms for r in rows if r.p99_ms is not None]
    sizes = [r.batch_size for r in rows if r.batch_size is not None]
    reasons: dict[str, int] = {}
    rejected: dict[str, int] = {}
    for row in rows:
        for reason, count in row.errors_by_reason.items():
            reasons[reason] = reasons.get(reason, 0) + count
        for reason, count in row.rejected_by_reason.items():
            rejected[reason] = rejected.get(reason, 0) + count
    received = sum(r.received for r in rows)
    client_errors = sum(r.client_errors for r in rows)
    return {
        "qps": requests / len(rows),
        "p50_ms": float(np.median(p50s)) if p50s else None,
        "p99_ms": max(p99s) if p99s else None,
        "errors": errors,
        "errors_by_reason": reasons,
        "error_rate": errors / requests if requests else 0.0,
        "batch_size": float(np.mean(sizes)) if sizes else None,
        "queue_depth": rows[-1].queue_depth,
        "busy": float(np.mean([r.busy for r in rows])),
        "slo_met": sum(r.slo_met for r in rows),
        "requests": requests,
        # Refused before acceptance: not in requests, qps or error_rate (which are the
        # accepted requests'); client errors are 4xx but 429, refused 503 and 429.
        "received": received,
        "client_errors": client_errors,
        "client_error_rate": client_errors / received if received else 0.0,
        "refused": sum(r.refused for r in rows),
        "rejected_by_reason": rejected,
    }


def _column(row: SecondRow, name: str) -> Any:
    return row.requests if name == "qps" else getattr(row, name)


def _columns(rows: list[SecondRow]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {"t": [r.t for r in rows]}
    for name in SERIES_COLUMNS:
        out[name] = [_column(r, name) for r in rows]
    return out


def _resource_columns(rows: list[ResourceRow]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {"t": [r.t for r in rows]}
    for name in RESOURCE_COLUMNS:
        out[name] = [getattr(r, name) for r in rows]
    return out


def workers_summary(
    execution: ExecutionStatistics | None,
    busy_share: Mapping[tuple[str, str], float] | None = None,
) -> dict[str, Any]:
    """The ``workers`` object: counts over every model instance, then the full statistics.

    ``instances`` counts every instance, ``busy`` those running a batch now, ``serving``
    those ready to take one and ``restarting`` those being (re)started; the rest of the
    object is :class:`ExecutionStatistics` as it is (``workers``, ``devices``, ...).
    ``busy_mean`` is the mean number of instances computing (one decimal) over the last
    ``CURRENT_WINDOW_S`` seconds, from ``busy_share`` (a model version's share of its
    instances' time spent computing): the figure ``sordino monitor`` and the dashboard
    both show, since a glance at the instantaneous ``busy`` lands between short batches
    as often as on one.
    """
    if execution is None:
        return {}
    instances = execution.workers
    shares = busy_share or {}
    mean = sum(shares.get((w.model, w.version), 0.0) for w in instances)
    return {
        "instances": len(instances),
        "busy": sum(1 for w in instances if w.busy),
        "busy_mean": round(min(float(len(instances)), mean), 1),
        "serving": sum(1 for w in instances if w.state == "ready"),
        "restarting": sum(1 for w in instances if w.state in ("starting", "restarting")),
        **asdict(execution),
    }


def forecast_status(telemetry: Telemetry) -> str:
    """One sentence on the next-hour forecast: there, waiting for history, or off."""
    forecast = telemetry.forecast
    if forecast is None:
        if telemetry.journal is None:
            return "no forecast: it is fitted from the journal (start with --data-dir)"
        if not telemetry.config.forecast:
            return "no forecast: telemetry.forecast is off"
        return short_message(MIN_POINTS) + "; the first fit is under way"
    if forecast.qps and not forecast.needs_minutes:
        return "forecast of the next hour ready for " + ", ".join(sorted(forecast.qps))
    needs = max([*forecast.needs_minutes.values(), forecast.memory_needs_minutes], default=0)
    if needs <= 0:
        return "forecast of the next hour ready (memory); no model has traffic history yet"
    return short_message(needs)


def _satisfaction(telemetry: Telemetry) -> dict[str, Any]:
    found = correlate(telemetry.feedback.payloads())
    out = asdict(found)
    out.pop("points")
    out["bands"] = [{**asdict(b), "label": b.label} for b in found.bands]
    return out


def snapshot(
    telemetry: Telemetry,
    *,
    seconds: int = 300,
    events: int = 50,
    execution: ExecutionStatistics | None = None,
) -> dict[str, Any]:
    """The JSON document of ``GET /v2/sordino/telemetry``; ``execution`` gives ``workers``."""
    now = telemetry.series.statistics().last_closed
    slo = telemetry.slo_attainment()
    models = []
    busy_share: dict[tuple[str, str], float] = {}
    for key, rows in sorted(telemetry.series.recent(seconds).items(), key=lambda kv: str(kv[0])):
        target, attainment = slo.get((key.name, key.version), (None, None))
        current = current_figures(rows[-CURRENT_WINDOW_S:])
        current["slo_attainment"] = attainment
        busy_share[(key.name, key.version)] = float(current.get("busy", 0.0))
        models.append(
            {
                "name": key.name,
                "version": key.version,
                "slo_p99_ms": target * 1000 if target is not None else None,
                "current": current,
                "series": _columns(rows),
            }
        )
    sample = telemetry.resources.last()
    forecast = telemetry.forecast
    return {
        "server": {"name": "sordino", "version": __version__, "started_at": telemetry.started_at},
        "time": now,
        "models": models,
        "resources": {
            "current": {
                "rss_bytes": sample.rss_bytes,
                "cpu_percent": sample.cpu_percent,
                "cpu_temp_c": sample.cpu_temp_c,
                "pool_reserved_bytes": sample.pool_reserved_bytes,
                "pool_in_use_bytes": sample.pool_in_use_bytes,
                "fragmentation": sample.fragmentation,
            },
            "pools": [asdict(p) for p in sample.pools],
            "gpus": [asdict(g) for g in sample.gpus],
            "series": _resource_columns(telemetry.series.recent_resources(seconds)),
        },
        "workers": workers_summary(execution, busy_share),
        "events": [
            {"t": e.time, "kind": e.kind, "subject": e.subject, "cause": e.cause}
            for e in telemetry.events.recent()[-events:]
        ],
        "forecast": None
        if forecast is None
        else {
            "made_at": forecast.made_at,
            "qps": {m: {"mean": s.mean, "peak": s.peak} for m, s in forecast.qps.items()},
            "memory_bytes": None
            if forecast.memory is None
            else {"mean": forecast.memory.mean, "peak": forecast.memory.peak},
            "needs_minutes": dict(forecast.needs_minutes),
            "memory_needs_minutes": forecast.memory_needs_minutes,
        },
        "forecast_status": forecast_status(telemetry),
        "utilisation": utilisation_payload(telemetry.utilisation.recent(CURRENT_WINDOW_S)),
        "satisfaction": _satisfaction(telemetry),
        "profiles": {
            model: {"started_at": p.started_at, "operators": [asdict(o) for o in p.top(10)]}
            for model, p in telemetry.profiles.items()
        },
        "journal": None if telemetry.journal is None else asdict(telemetry.journal.statistics()),
    }
