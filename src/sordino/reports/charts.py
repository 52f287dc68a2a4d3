"""The charts of a diagnose report, drawn with matplotlib into PNG bytes.

matplotlib is imported here only, when a chart is drawn, through its
object-oriented API (``Figure``), so it never touches a GUI backend or global state.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Sequence
from typing import Any

from sordino.reports.anomalies import NOT_CAUSES, Anomaly, is_chaos
from sordino.reports.diagnose import Diagnosis
from sordino.telemetry.journal_reader import JournalEvent
from sordino.telemetry.profile_data import OperatorProfile
from sordino.telemetry.series import SecondRow

__all__ = [
    "anomaly_chart",
    "has_data",
    "no_data",
    "overview_chart",
    "profile_chart",
    "resources_chart",
    "satisfaction_chart",
]

COLORS = ["#2f6fed", "#e8590c", "#2b8a3e", "#ae3ec9", "#c92a2a", "#0b7285"]
_SHADE = {"latency_spike": "#ffa94d", "error_burst": "#ff6b6b"}


def _figure(height: float, rows: int = 1) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, height), layout="constrained")
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    return fig, axes


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def _times(ts: Sequence[float]) -> list[dt.datetime]:
    return [dt.datetime.fromtimestamp(t) for t in ts]


def _format_time(ax: Any) -> None:
    import matplotlib.dates as mdates

    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))  # type: ignore[no-untyped-call]
    ax.grid(True, alpha=0.3)


def has_data(values: Sequence[float | None]) -> bool:
    """Whether ``values`` hold one number to draw (None and NaN are gaps)."""
    return any(v is not None and v == v for v in values)


def no_data(ax: Any, message: str = "no data") -> None:
    """Say ``message`` across an axis with nothing to draw, on a plain 0..1 axis without
    tick labels (matplotlib's default for no data is a meaningless range like
    -0.04..0.04, or a log axis with no decade at all)."""
    ax.set_yscale("linear")
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.text(0.5, 0.5, message, transform=ax.transAxes, ha="center", va="center",
            color="#868e96")  # fmt: skip


def _series(rows: Sequence[SecondRow], attr: str) -> tuple[list[dt.datetime], list[float]]:
    xs, ys = [], []
    for row in rows:
        value = row.requests if attr == "qps" else getattr(row, attr)
        xs.append(dt.datetime.fromtimestamp(row.t))
        ys.append(float("nan") if value is None else float(value))
    return xs, ys


def _mark_events(ax: Any, events: Sequence[JournalEvent], label: bool) -> None:
    for event in events:
        if event.kind.endswith("_cleared") or event.kind in NOT_CAUSES:
            continue
        chaos = is_chaos(event.kind)
        ax.axvline(
            dt.datetime.fromtimestamp(event.t),
            color="#c92a2a" if chaos else "#868e96",
            linestyle="--" if chaos else ":",
            linewidth=1.2 if chaos else 0.8,
        )
        if label and (chaos or not event.kind.startswith(("model_", "server_", "operator"))):
            ax.annotate(
                event.kind,
                (dt.datetime.fromtimestamp(event.t), 1.0),
                xycoords=("data", "axes fraction"),
                rotation=90,
                va="top",
                ha="right",
                fontsize=7,
                color="#c92a2a" if chaos else "#495057",
            )


def _shade(ax: Any, anomalies: Sequence[Anomaly], model: str | None = None) -> None:
    for anomaly in anomalies:
        if model is not None and anomaly.model not in (None, model):
            continue
        ax.axvspan(
            dt.datetime.fromtimestamp(anomaly.start),
            dt.datetime.fromtimestamp(anomaly.end),
            color=_SHADE.get(anomaly.kind, "#74c0fc"),
            alpha=0.25,
        )


def overview_chart(diagnosis: Diagnosis) -> bytes:
    """p99/p50 latency, QPS and errors of every model, anomalies shaded, events marked."""
    fig, (lat, qps, err) = _figure(7.5, rows=3)
    window = diagnosis.window
    for i, name in enumerate(window.models):
        rows = window.rows_of(name)
        color = COLORS[i % len(COLORS)]
        lat.plot(*_series(rows, "p99_ms"), color=color, linewidth=1.2, label=f"{name} p99")
        lat.plot(*_series(rows, "p50_ms"), color=color, linewidth=0.8, linestyle=":",
                 label=f"{name} p50")  # fmt: skip
        qps.plot(*_series(rows, "qps"), color=color, linewidth=1.0, label=name)
        err.plot(*_series(rows, "errors"), color=color, linewidth=1.0, label=name)
        if any(r.client_errors for r in rows):
            err.plot(*_series(rows, "client_errors"), color=color, linewidth=1.0,
                     linestyle="--", label=f"{name} client errors (4xx)")  # fmt: skip
    lat.set_ylabel("latency (ms)")
    if any(has_data([r.p99_ms for r in window.rows_of(name)]) for name in window.models):
        lat.set_yscale("symlog", linthresh=1.0)
    else:
        no_data(lat, "no latency: no request succeeded in this window")
    qps.set_ylabel("requests/s")
    err.set_ylabel("errors/s (dashed: client errors)")
    qps.set_ylim(bottom=0)  # counts: an idle or error-free window reads 0, not -0.04..0.04
    err.set_ylim(bottom=0, top=max(1.0, err.get_ylim()[1]))
    qps.set_ylim(top=max(1.0, qps.get_ylim()[1]))
    for ax in (lat, qps, err):
        _shade(ax, diagnosis.anomalies)
        _mark_events(ax, window.events, label=ax is lat)
        _format_time(ax)
    lat.legend(fontsize=7, ncol=3, loc="upper left")
    lat.set_title("Latency, traffic and errors (anomalies shaded, events dashed)")
    return _png(fig)


def resources_chart(diagnosis: Diagnosis) -> bytes | None:
    """Process memory, pool use and fragmentation, and temperatures where present."""
    rows = diagnosis.window.resources
    if not rows:
        return None
    has_temp = any(r.cpu_temp_c is not None or r.gpu_temp_c is not None for r in rows)
    fig, axes = _figure(5.0 if has_temp else 3.2, rows=2 if has_temp else 1)
    mem = axes[0]
    xs = _times([r.t for r in rows])
    mb = 2**20
    mem.plot(xs, [r.rss_bytes / mb for r in rows], label="process RSS", color=COLORS[0])
    if any(r.pool_in_use_bytes is not None for r in rows):
        mem.plot(xs, [(r.pool_in_use_bytes or 0) / mb for r in rows], label="pool in use",
                 color=COLORS[2])  # fmt: skip
    if any(r.gpu_memory_used_bytes is not None for r in rows):
        mem.plot(xs, [(r.gpu_memory_used_bytes or 0) / mb for r in rows], label="GPU memory",
                 color=COLORS[3])  # fmt: skip
    mem.set_ylabel("MB")
    if any(r.fragmentation is not None for r in rows):
        frag = mem.twinx()
        frag.plot(xs, [r.fragmentation for r in rows], color=COLORS[1], linestyle="--",
                  label="fragmentation")  # fmt: skip
        frag.set_ylim(0, 1)
        frag.set_ylabel("fragmentation")
    mem.legend(fontsize=7, loc="upper left")
    mem.set_title("Memory" + (" and temperature" if has_temp else ""))
    if has_temp:
        temp = axes[1]
        if any(r.cpu_temp_c is not None for r in rows):
            temp.plot(xs, [r.cpu_temp_c for r in rows], label="CPU °C", color=COLORS[4])
        if any(r.gpu_temp_c is not None for r in rows):
            temp.plot(xs, [r.gpu_temp_c for r in rows], label="GPU °C", color=COLORS[5])
        temp.set_ylabel("°C")
        temp.legend(fontsize=7)
    for ax in axes:
        _shade(ax, diagnosis.anomalies)
        _format_time(ax)
    return _png(fig)


def satisfaction_chart(diagnosis: Diagnosis) -> bytes | None:
    """Each rated request's latency against its rating, and the mean per latency band."""
    found = diagnosis.layers.satisfaction if diagnosis.layers is not None else None
    if found is None or not found.points:
        return None
    fig, axes = _figure(3.2)
    ax = axes[0]
    ax.scatter([ms for ms, _ in found.points], [r for _, r in found.points], s=14,
               color=COLORS[0], alpha=0.6, label="a rated request")  # fmt: skip
    for band in found.bands:
        high = band.high_ms if band.high_ms is not None else max(ms for ms, _ in found.points)
        ax.hlines(band.mean, band.low_ms, high, color=COLORS[1], linewidth=2)
    ax.plot([], [], color=COLORS[1], linewidth=2, label="mean rating of the latency band")
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("rating")
    ax.set_ylim(0.5, 5.5)
    r = f", Pearson r = {found.latency_r:+.2f}" if found.latency_r is not None else ""
    ax.set_title(f"User satisfaction against latency ({found.rated_requests} rated requests{r})")
    ax.legend(fontsize=7, loc="lower left")
    return _png(fig)


def anomaly_chart(diagnosis: Diagnosis, anomaly: Anomaly, margin_s: int = 60) -> bytes:
    """A close-up of one anomaly: its metric and the model's QPS, events labelled."""
    fig, (top, bottom) = _figure(4.2, rows=2)
    lo, hi = anomaly.start - margin_s, anomaly.end + margin_s
    window = diagnosis.window
    events = [e for e in window.events if lo <= e.t <= hi]
    if anomaly.model is not None:
        rows = [r for r in window.rows_of(anomaly.model) if lo <= r.t < hi]
        if anomaly.kind == "error_burst":
            top.plot(*_series(rows, "errors"), color=COLORS[4], label="errors/s")
            top.set_ylabel("errors/s")
        else:
            top.plot(*_series(rows, "p99_ms"), color=COLORS[1], label="p99 ms")
            top.plot(*_series(rows, "p50_ms"), color=COLORS[0], linestyle=":", label="p50 ms")
            top.axhline(anomaly.baseline, color="#868e96", linewidth=0.8, label="baseline p99")
            top.set_ylabel("ms")
        bottom.plot(*_series(rows, "qps"), color=COLORS[2], label="requests/s")
        bottom.plot(*_series(rows, "queue_depth"), color=COLORS[3], label="queue depth")
        title = f"{anomaly.kind} in {anomaly.model}"
    else:
        res = [r for r in window.resources if lo <= r.t < hi]
        xs = _times([r.t for r in res])
        top.plot(xs, [r.fragmentation for r in res], color=COLORS[1], label="fragmentation")
        bottom.plot(xs, [r.rss_bytes / 2**20 for r in res], color=COLORS[0], label="RSS MB")
        title = anomaly.kind.replace("_", " ")
    for ax in (top, bottom):
        _shade(ax, [anomaly])
        _mark_events(ax, events, label=ax is top)
        _format_time(ax)
        ax.legend(fontsize=7, loc="upper left")
    top.set_title(title)
    return _png(fig)


def profile_chart(profile: OperatorProfile, top: int = 10) -> bytes:
    """The operator types that took the most time, as horizontal bars."""
    ops = list(reversed(profile.top(top)))
    fig, (ax,) = _figure(0.35 * len(ops) + 1.2)
    ax.barh([o.op for o in ops], [o.total_ms for o in ops], color=COLORS[0])
    for i, op in enumerate(ops):
        ax.annotate(f" {op.share:.0%}", (op.total_ms, i), va="center", fontsize=8)
    ax.set_xlabel("ms over the profiled batches")
    ax.set_title(f"Operators of {profile.model}/{profile.version} ({profile.batches} batches)")
    ax.grid(True, axis="x", alpha=0.3)
    return _png(fig)
