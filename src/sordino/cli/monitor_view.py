"""What ``sordino monitor`` draws from one telemetry snapshot: rich views and plain text.

Both views take the JSON of ``GET /v2/sordino/telemetry`` and the chosen metrics;
they never talk to the server themselves, so they are tested on recorded snapshots.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

__all__ = [
    "METRICS",
    "busy_workers",
    "layer_lines",
    "live_view",
    "plain_snapshot",
    "sparkline",
    "unreachable_view",
]

METRICS = ("qps", "latency", "error_rate", "mem_frag", "batch", "queue", "busy", "slo")
"""The metric names ``--metrics`` accepts."""

_BLOCKS = "▁▂▃▄▅▆▇█"


def _buckets(values: Sequence[float | None], width: int) -> list[float | None]:
    """Squeeze ``values`` into ``width`` buckets, keeping each bucket's maximum."""
    if len(values) <= width:
        return list(values)
    out: list[float | None] = []
    for i in range(width):
        chunk = values[i * len(values) // width : (i + 1) * len(values) // width]
        known = [v for v in chunk if v is not None]
        out.append(max(known) if known else None)
    return out


def sparkline(
    values: Sequence[float | None],
    width: int = 24,
    *,
    relative: bool = False,
    resolution: float = 0.0,
) -> str:
    """``values`` as ``width`` block characters, each the maximum of its share of them.

    Heights are scaled to the maximum (from zero, or from the minimum when
    ``relative``); gaps (None) stay blank. A line of zeros, of equal values when
    ``relative``, or whose height is under ``resolution`` (the least step the figure
    printed beside it shows) draws flat: no bars the figure cannot account for.
    """
    tail = _buckets(values, width)
    known = [v for v in tail if v is not None]
    top = max(known, default=0.0)
    bottom = min(known, default=0.0) if relative else 0.0
    flat = top - bottom < resolution
    out = []
    for value in tail:
        if value is None:
            out.append(" ")
        elif flat or top <= bottom:
            out.append(_BLOCKS[0])
        else:
            level = (value - bottom) / (top - bottom) * (len(_BLOCKS) - 1)
            out.append(_BLOCKS[min(len(_BLOCKS) - 1, int(level))])
    return "".join(out).rjust(width)


def _num(value: Any, digits: int = 1, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{suffix}"


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"


def _small_pct(value: Any) -> str:
    """A share that is often far under 1 %: three significant digits, not one decimal."""
    return "n/a" if value is None else f"{value * 100:.3g}%"


def _mb(value: Any) -> str:
    return "n/a" if value is None else f"{value / 1048576:.0f} MB"


def _clock(t: float | None) -> str:
    return "--:--:--" if t is None else dt.datetime.fromtimestamp(t).strftime("%H:%M:%S")


# (header, current-figure formatter, series column for the sparkline or None)
def _columns(metrics: Sequence[str]) -> list[tuple[str, Any, str | None]]:
    cols: list[tuple[str, Any, str | None]] = []
    for metric in metrics:
        if metric == "qps":
            cols.append(("QPS", lambda c: _num(c.get("qps")), "qps"))
        elif metric == "latency":
            cols.append(("p50 ms", lambda c: _num(c.get("p50_ms"), 2), None))
            cols.append(("p99 ms", lambda c: _num(c.get("p99_ms"), 2), "p99_ms"))
        elif metric == "error_rate":
            cols.append(("errors", lambda c: _pct(c.get("error_rate")), "error_rate"))
            # Requests refused as the client's mistake (400, 404, ...) are no server error,
            # but an operator must see them: their share of every request received.
            cols.append(("4xx", lambda c: _pct(c.get("client_error_rate")), "client_errors"))
        elif metric == "batch":
            cols.append(("batch", lambda c: _num(c.get("batch_size")), "batch_size"))
        elif metric == "queue":
            cols.append(("queue", lambda c: str(c.get("queue_depth", "n/a")), "queue_depth"))
        elif metric == "busy":
            cols.append(("busy", lambda c: _pct(c.get("busy")), "busy"))
        elif metric == "slo":
            cols.append(("SLO met", lambda c: _pct(c.get("slo_attainment")), None))
    return cols


def _resource_line(snap: dict[str, Any], metrics: Sequence[str]) -> str:
    res = snap["resources"]["current"]
    workers = snap.get("workers") or {}
    parts = [f"RSS {_mb(res.get('rss_bytes'))}"]
    if "mem_frag" in metrics:
        if res.get("fragmentation") is None:
            parts.append("mem_frag n/a (no memory pool)")
        else:
            parts.append(
                f"pool {_mb(res.get('pool_in_use_bytes'))}/{_mb(res.get('pool_reserved_bytes'))}"
                f" frag {_pct(res.get('fragmentation'))}"
            )
    temp = res.get("cpu_temp_c")
    parts.append(f"CPU {temp:.0f}°C" if temp is not None else "CPU temp n/a")
    for gpu in snap["resources"].get("gpus", []):
        parts.append(
            f"GPU{gpu['index']} {_mb(gpu.get('memory_used_bytes'))} "
            f"{_num(gpu.get('temperature_c'), 0, '°C')} {_num(gpu.get('power_w'), 0, ' W')}"
        )
    if workers:
        parts.append(f"workers {busy_workers(workers)} busy")
    return " · ".join(parts)


def busy_workers(workers: dict[str, Any]) -> str:
    """``busy/instances`` as the dashboard writes it: the mean number of instances
    computing over the last seconds (``busy_mean``), else the instantaneous count."""
    busy = workers.get("busy_mean")
    shown = f"{busy:.1f}" if busy is not None else str(workers.get("busy", 0))
    return f"{shown}/{workers.get('instances', 0)}"


def _rate(value: float | None) -> str:
    if value is None:
        return "n/a"
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B/s"


def layer_lines(snap: dict[str, Any]) -> list[str]:
    """The brief's layers the model rows do not show: bandwidth saturation and each
    instance's busy share, user satisfaction, and the next-hour forecast's state."""
    lines = []
    use = snap.get("utilisation") or {}
    band = use.get("bandwidth")
    if band:
        paths = band.get("bytes_s", {})
        saturation = band.get("saturation")
        lines.append(
            f"bandwidth {_rate(band.get('moved_bytes_s'))} (arena {_rate(paths.get('arena'))}, "
            f"worker hop {_rate(paths.get('worker_hop'))}, host↔device n/a) · saturation "
            f"{_small_pct(saturation)} of {_rate(band.get('capacity_bytes_s'))} copy bandwidth"
        )
    instances = use.get("instances") or {}
    if instances:
        lines.append(
            "instances busy: "
            + " · ".join(f"{key} {_pct(i['busy'])}" for key, i in sorted(instances.items()))
        )
    satisfaction = snap.get("satisfaction") or {}
    if satisfaction.get("count"):
        r = satisfaction.get("latency_r")
        lines.append(
            f"satisfaction {satisfaction['mean']:.2f}/5 ({satisfaction['count']} ratings)"
            + (f" · latency vs rating r {r:+.2f}" if r is not None else "")
        )
    forecast = snap.get("forecast") or {}
    qps = forecast.get("qps") or {}
    if qps:
        lines.append(
            "forecast next hour: "
            + " · ".join(
                f"{m} {f['mean']:.1f} req/s (peak {f['peak']:.1f})" for m, f in qps.items()
            )
        )
    status = snap.get("forecast_status")
    if status and (not qps or forecast.get("needs_minutes")):
        lines.append(status)
    return lines


def memory_line(snap: dict[str, Any]) -> str | None:
    """The memory manager's line: strategy, defrag runs, overflow and quota refusals."""
    memory = snap.get("memory")
    if not memory:
        return None
    pause = memory.get("last_pause_s")
    last = f" (last pause {pause * 1000:.1f} ms)" if pause is not None else ""
    pool = memory.get("pool_bytes")
    sized = (
        f" · pool {_mb(pool)}{' auto' if memory.get('pool_auto') else ''}, "
        f"{memory.get('pool_resizes', 0)} resizes"
        if pool
        else ""
    )
    return (
        f"memory {memory['strategy']} · defrag {memory['defrag_runs']} runs, "
        f"{_mb(memory['defrag_bytes_moved'])} moved{last} · overflow "
        f"{memory['overflow_shrinks']} shrunk, {memory['overflow_rejections']} × 503 · quota "
        f"{memory['quota_rejections']} × 429{sized}"
    )


def tenant_lines(snap: dict[str, Any]) -> list[str]:
    """One line per tenant the caller may see: in flight, admitted, refusals, breaker."""
    lines = []
    for t in snap.get("tenants") or ():
        breaker = "OPEN" if t["breaker_open"] else "closed"
        lines.append(
            f"tenant {t['tenant']} (weight {t['weight']}): {t['in_flight']} in flight, "
            f"{t['admitted']} admitted · refused {t['refused_rate']} rate, "
            f"{t['refused_concurrency']} concurrency, {t['refused_breaker']} breaker · "
            f"breaker {breaker} ({t['breaker_trips']} trips)"
        )
    return lines


def plain_snapshot(snap: dict[str, Any], metrics: Sequence[str], url: str) -> str:
    """One snapshot as plain text: a header, a row per model, the latest events."""
    cols = _columns(metrics)
    server = snap["server"]
    lines = [
        f"sordino {server['version']} at {url} · {_clock(snap.get('time'))}",
        _resource_line(snap, metrics),
    ]
    memory = memory_line(snap)
    if memory is not None:
        lines.append(memory)
    lines += layer_lines(snap)
    lines += tenant_lines(snap)
    lines.append("")
    header = ["model".ljust(24)] + [title.rjust(10) for title, _, _ in cols]
    lines.append(" ".join(header))
    for model in snap["models"]:
        name = f"{model['name']}/{model['version']}"
        cells = [name.ljust(24)] + [fmt(model["current"]).rjust(10) for _, fmt, _ in cols]
        lines.append(" ".join(cells))
    if not snap["models"]:
        lines.append("(no models loaded)")
    lines += ["", "latest events:"]
    for event in snap["events"][-5:]:
        lines.append(f"  {_clock(event['t'])} {event['kind']} {event['subject']} {event['cause']}")
    return "\n".join(lines)


def live_view(
    snap: dict[str, Any], metrics: Sequence[str], url: str, width: int = 150
) -> RenderableType:
    """The full-screen view: resources, a row per model with sparklines, the latest events."""
    cols = _columns(metrics)
    server = snap["server"]
    title = Text.assemble(
        ("sordino ", "bold"), f"{server['version']} · {url} · {_clock(snap.get('time'))}"
    )
    resources = Text(_resource_line(snap, metrics))
    memory = memory_line(snap)
    if memory is not None:
        resources.append("\n" + memory)
    for line in [*layer_lines(snap), *tenant_lines(snap)]:
        resources.append("\n" + line)
    if "mem_frag" in metrics:
        series = snap["resources"]["series"]
        if any(v is not None for v in series.get("fragmentation", [])):
            # The figure reads to 0.1 %: a line of smaller values is drawn flat.
            frag = sparkline(series["fragmentation"], resolution=0.0005)
            resources.append("  frag " + frag, style="magenta")
        resources.append(
            "  RSS " + sparkline(series.get("rss_bytes", []), relative=True), style="cyan"
        )
    table = Table(expand=True, header_style="bold")
    table.add_column("model", no_wrap=True, min_width=22)
    spark = max(6, min(30, (width - 28) // max(1, len(cols)) - 11))
    for header, _, _ in cols:
        table.add_column(header, justify="right", no_wrap=True)
    for model in snap["models"]:
        cells: list[Text | str] = [f"{model['name']}/{model['version']}"]
        for _, fmt, column in cols:
            cell = Text(fmt(model["current"]).rjust(8))
            if column is not None:
                cell.append(" " + sparkline(model["series"].get(column, []), spark), style="green")
            cells.append(cell)
        table.add_row(*cells)
    events = Table(expand=True, show_header=False, box=None)
    for event in snap["events"][-8:]:
        style = "yellow" if event["kind"].startswith("chaos") else ""
        events.add_row(_clock(event["t"]), Text(event["kind"], style=style), event["subject"],
                       event["cause"])  # fmt: skip
    return Group(
        Panel(resources, title=title, title_align="left"),
        table,
        Panel(events, title="latest events", title_align="left"),
        Text("refresh 1 s · sparklines: last minutes · Ctrl-C to quit", style="dim"),
    )


def unreachable_view(message: str, url: str, attempt: int) -> RenderableType:
    """What the live view shows while the server does not answer."""
    return Panel(
        Text.assemble(
            (message, "bold red"),
            f"\nretrying every second (attempt {attempt}); is `sordino start` running at {url}?",
            "\nCtrl-C to quit",
        ),
        title="sordino monitor",
    )
