"""Reading a trigger's metric from the hub's in-memory per-second series.

:func:`measure` turns the rows of a window into one :class:`Measure`: the value the
threshold is compared with, and the per-second values behind it (the "observed"
values of a diagnostic record). Rows come from
:meth:`~sordino.telemetry.series.SeriesRecorder.recent`, never from the journal.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sordino.config.threshold import METRICS, Threshold
from sordino.inference import ModelKey
from sordino.telemetry.series import ResourceRow, SecondRow

__all__ = ["SUPPORTED", "Measure", "describe_value", "measure"]

SUPPORTED = frozenset(METRICS) - {"p90_latency", "p95_latency"}
"""The metrics this build measures (the series keeps p50 and p99 per second)."""

Timings = Mapping[ModelKey, list[tuple[int, float]]]
"""Per model, ``(second, p99 seconds)`` of a timing (network_latency, frame_delay)."""


@dataclass(frozen=True, slots=True)
class Measure:
    """A metric over one window: its value (None without data) and the seconds behind it.

    ``covered_s`` is how many seconds of rows the window had; ``model`` is the model
    whose rows were worst (the one an action should target) when no model was named.
    """

    value: float | None
    samples: tuple[float, ...]
    covered_s: int
    model: str | None = None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _per_second(
    metric: str, rows: list[SecondRow], resources: Mapping[int, ResourceRow]
) -> tuple[list[float], float | None]:
    """Per-second values of ``metric`` and the window's value, for one model's rows."""
    seconds = sorted({r.t for r in rows})
    by_t: dict[int, list[SecondRow]] = {}
    for row in rows:
        by_t.setdefault(row.t, []).append(row)
    if metric == "error_rate":
        samples = [
            sum(r.errors for r in by_t[t]) / max(1, sum(r.requests for r in by_t[t]))
            for t in seconds
        ]
        total = sum(r.requests for r in rows)
        return samples, (sum(r.errors for r in rows) / total if total else None)
    if metric in ("p50_latency", "p99_latency"):
        field = "p50_ms" if metric == "p50_latency" else "p99_ms"
        samples = []
        for t in seconds:
            values = [getattr(r, field) for r in by_t[t] if getattr(r, field) is not None]
            if values:
                samples.append(max(values) / 1000)
        return samples, _mean(samples)
    if metric == "qps":
        samples = [float(sum(r.requests for r in by_t[t])) for t in seconds]
        return samples, _mean(samples)
    if metric == "queue_depth":
        samples = [float(sum(r.queue_depth for r in by_t[t])) for t in seconds]
        return samples, max(samples) if samples else None
    if metric == "worker_busy":
        samples = [max(r.busy for r in by_t[t]) for t in seconds]
        return samples, _mean(samples)
    if metric == "slo_attainment":
        samples = []
        for t in seconds:
            n = sum(r.requests for r in by_t[t])
            if n:
                samples.append(sum(r.slo_met for r in by_t[t]) / n)
        total = sum(r.requests for r in rows)
        return samples, (sum(r.slo_met for r in rows) / total if total else None)
    if metric in ("device_temperature", "memory_fragmentation"):
        attr = "temperature_c" if metric == "device_temperature" else "fragmentation"
        samples = []
        for t in seconds:
            values = [getattr(r, attr) for r in by_t[t] if getattr(r, attr) is not None]
            if values:
                samples.append(max(values))
        return samples, _mean(samples)
    if metric in ("memory_in_use", "power"):
        attr = "pool_in_use_bytes" if metric == "memory_in_use" else "gpu_power_w"
        samples = [
            float(getattr(resources[t], attr))
            for t in seconds
            if t in resources and getattr(resources[t], attr) is not None
        ]
        return samples, _mean(samples)
    raise ValueError(f"metric {metric!r} is not measured in this build")


def measure(
    threshold: Threshold,
    rows: Mapping[ModelKey, Iterable[SecondRow]],
    resources: Iterable[ResourceRow],
    *,
    model: str | None,
    end_s: int,
    window_s: float,
    since_s: int | None = None,
    timings: Timings | None = None,
) -> Measure:
    """The metric over the seconds ``[end_s - window_s, end_s)`` (none before ``since_s``).

    For a ``sudden_drop``/``sudden_rise`` threshold the value is the relative change
    of the mean between that window and the one before it. Without ``model`` every
    model's rows count together, and :attr:`Measure.model` names the worst model.
    """
    metric = _canonical(threshold.metric)
    width = max(1, round(window_s))
    if metric in ("network_latency", "frame_delay"):
        return _timing(timings or {}, model=model, end_s=end_s, width=width, since_s=since_s)
    change = threshold.change is not None
    first = end_s - width * (2 if change else 1)
    if since_s is not None:
        first = max(first, since_s)
    res = {r.t: r for r in resources if first <= r.t < end_s}
    chosen: dict[str, list[SecondRow]] = {}
    for key, kept in rows.items():
        if model is not None and key.name != model:
            continue
        chosen.setdefault(key.name, []).extend(r for r in kept if first <= r.t < end_s)
    everything = [r for kept in chosen.values() for r in kept]
    covered = len({r.t for r in everything} | set(res))
    if change:
        middle = end_s - width
        before = _per_second(metric, [r for r in everything if r.t < middle], res)[1]
        samples, after = _per_second(metric, [r for r in everything if r.t >= middle], res)
        value = None
        if before is not None and after is not None and before > 0:
            value = (before - after) / before if threshold.change == "drop" else after / before - 1
        return Measure(value, tuple(samples), covered, _worst(metric, chosen, res, model))
    samples, value = _per_second(metric, everything, res)
    return Measure(value, tuple(samples), covered, _worst(metric, chosen, res, model))


def _timing(
    timings: Timings, *, model: str | None, end_s: int, width: int, since_s: int | None
) -> Measure:
    """The mean per-second p99 of a timing over the window (seconds without requests count
    as nothing, like latencies), and the model where it was worst."""
    first = max(end_s - width, since_s if since_s is not None else end_s - width)
    per_model: dict[str, list[tuple[int, float]]] = {}
    for key, rows in timings.items():
        if model is None or key.name == model:
            per_model.setdefault(key.name, []).extend(r for r in rows if first <= r[0] < end_s)
    by_second: dict[int, float] = {}
    for rows in per_model.values():
        for t, value in rows:
            by_second[t] = max(by_second.get(t, 0.0), value)
    samples = [by_second[t] for t in sorted(by_second)]
    worst = model
    if model is None and per_model:
        worst = max(per_model, key=lambda m: _mean([v for _, v in per_model[m]]) or 0.0)
    # Coverage counts seconds of the window that have passed (a quiet second has no rows).
    covered = end_s - first
    return Measure(_mean(samples), tuple(samples), covered, worst)


def _worst(
    metric: str,
    chosen: Mapping[str, list[SecondRow]],
    resources: Mapping[int, ResourceRow],
    model: str | None,
) -> str | None:
    if model is not None or not chosen:
        return model
    scored = []
    for name, kept in chosen.items():
        value = _per_second(metric, kept, resources)[1]
        if metric == "slo_attainment" and value is not None:
            value = -value  # the lowest attainment is the worst
        scored.append((value if value is not None else float("-inf"), name))
    return max(scored)[1]


def _canonical(metric: str) -> str:
    if metric.startswith("latency_p"):
        return f"p{metric.removeprefix('latency_p')}_latency"
    return metric


def describe_value(metric: str, value: float | None, *, change: bool = False) -> str:
    """``value`` in words with its unit: "12 %", "512 ms", "85 °C", "2000"."""
    if value is None:
        return "no data"
    if change:
        return f"{value * 100:.0f} %"
    kind = METRICS.get(_canonical(metric), "count")
    if kind == "fraction":
        return f"{value * 100:.0f} %"
    if kind == "duration":
        return f"{value * 1000:.0f} ms" if value < 10 else f"{value:.1f} s"
    if kind == "temperature":
        return f"{value:.0f} °C"
    if kind == "power":
        return f"{value:.0f} W"
    if kind == "bytes":
        return f"{value / 2**20:.1f} MiB"
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"
