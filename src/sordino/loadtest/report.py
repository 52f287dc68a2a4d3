"""The stress report: one self-contained HTML page (charts as embedded PNG, no CDN).

The page opens with the headline table (rate, latency percentiles, errors), then
the client's warnings, the SLO and ``--fail-on`` verdicts, the findings, the
suggested configuration, the per-group tables and the charts. Charts are drawn with
matplotlib's object API, as the diagnose report's are.
"""

from __future__ import annotations

import datetime as dt
import html
import io
import itertools
from base64 import b64encode
from typing import Any

from sordino.loadtest.findings import Suggestion, suggestions_yaml
from sordino.loadtest.results import FIRST_RESPONSE, LatencySummary
from sordino.loadtest.run import StressResult, Verdict

__all__ = ["HEADLINE_HEADER", "draw_charts", "headline_rows", "render_html"]

HEADLINE_HEADER = [
    "group",
    "answers",
    "errors",
    "p50 ms",
    "p90 ms",
    "p99 ms",
    "p99.9 ms",
    "max ms",
]
_COLORS = ["#2f6fed", "#e8590c", "#2b8a3e", "#ae3ec9", "#c92a2a", "#0b7285"]
_CSS = """
body{font:14px/1.5 system-ui,sans-serif;margin:24px auto;max-width:1060px;color:#1d2330}
h1{margin-bottom:0}.meta{color:#667085}table{border-collapse:collapse;margin:8px 0}
th,td{border-bottom:1px solid #e4e7ec;padding:3px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}.warn{border-left:4px solid #e8590c;
padding:4px 12px;margin:12px 0;background:#fff8f0}img{max-width:100%}
.met{color:#2b8a3e}.missed{color:#c92a2a}
pre{background:#f6f8fa;padding:8px 12px;white-space:pre-wrap}
"""


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _row(name: str, s: LatencySummary) -> list[str]:
    return [
        name,
        str(s.count),
        str(s.errors),
        _fmt(s.p50_ms, 2),
        _fmt(s.p90_ms, 2),
        _fmt(s.p99_ms, 2),
        _fmt(s.p999_ms, 2),
        _fmt(s.max_ms, 1),
    ]


def headline_rows(result: StressResult) -> list[list[str]]:
    """The headline table: all traffic, then each model, class and tenant."""
    rows = [_row("all", result.total)]
    for kind, members in result.groups.items():
        if len(members) > 1 or kind in ("model", FIRST_RESPONSE):
            rows += [_row(f"{kind} {name}", s) for name, s in members.items()]
    return rows


def _figure(height: float, rows: int = 1) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, height), layout="constrained")
    return fig, fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _no_data(ax: Any, message: str) -> None:
    from sordino.reports.charts import no_data as draw

    draw(ax, message)


def _rate_chart(result: StressResult) -> bytes:
    fig, (ax,) = _figure(3.2)
    xs = [i * result.window_s for i in range(len(result.windows))]
    ax.step(
        xs,
        result.intended_rate[: len(xs)],
        where="post",
        color=_COLORS[0],
        lw=4,
        alpha=0.4,
        label="intended",
    )
    ax.step(xs, result.sent_rate, where="post", color=_COLORS[1], label="sent")
    answered = [w.count / result.window_s for w in result.windows]
    ax.step(xs, answered, where="post", color=_COLORS[2], label="answered OK")
    ax.set_ylabel("requests/s")
    ax.set_xlabel("seconds into the run")
    ax.legend(loc="upper left")
    ax.grid(True, alpha=0.3)
    return _png(fig)


def _latency_chart(result: StressResult) -> bytes:
    fig, (ax,) = _figure(3.4)
    xs = [i * result.window_s for i in range(len(result.windows))]
    for color, (label, attr) in zip(
        _COLORS,
        [("p50", "p50_ms"), ("p90", "p90_ms"), ("p99", "p99_ms"), ("max", "max_ms")],
        strict=False,
    ):
        ys = [getattr(w, attr) for w in result.windows]
        ax.plot(xs, [float("nan") if y is None else y for y in ys], color=color, label=label)
    if not any(w.count for w in result.windows):
        _no_data(ax, "no latency: no request succeeded")
    else:
        for verdict in result.slos:
            if verdict.condition.metric != "errors":
                ax.axhline(verdict.condition.value, color="#c92a2a", ls="--", lw=1)
        ax.set_yscale("log")
    ax.set_ylabel("ms from intended send")
    ax.set_xlabel("seconds into the run")
    ax.legend(loc="upper left")
    ax.grid(True, alpha=0.3)
    return _png(fig)


def _error_chart(result: StressResult) -> bytes:
    fig, (ax,) = _figure(2.8)
    xs = [i * result.window_s for i in range(len(result.windows))]
    statuses = sorted({k for e in result.window_errors for k in e})
    bottom = [0.0] * len(xs)
    for color, status in zip(_COLORS * 3, statuses, strict=False):
        ys = [e.get(status, 0) / result.window_s for e in result.window_errors]
        ax.bar(
            xs, ys, width=result.window_s, bottom=bottom, align="edge", color=color, label=status
        )
        bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    if not statuses:
        ax.text(0.5, 0.5, "no errors", transform=ax.transAxes, ha="center")
    else:
        ax.legend(loc="upper left")
    ax.set_ylabel("errors/s")
    ax.set_xlabel("seconds into the run")
    ax.grid(True, alpha=0.3)
    return _png(fig)


def _server_chart(result: StressResult) -> bytes | None:
    samples = result.server
    if not samples:
        return None
    t0 = result.send.started_at
    xs = [s.t - t0 for s in samples]
    fig, (queue, memory) = _figure(5.0, rows=2)
    depth = [s.queue_depth for s in samples]
    queue.plot(
        xs, [float("nan") if d is None else d for d in depth], color=_COLORS[0], label="queue depth"
    )
    batch = []
    for a, b in itertools.pairwise(samples):
        db = (b.batches or 0) - (a.batches or 0)
        batch.append(((b.batch_rows or 0) - (a.batch_rows or 0)) / db if db > 0 else float("nan"))
    queue.plot(xs[1:], batch, color=_COLORS[1], label="mean batch size")
    queue.legend(loc="upper left")
    queue.grid(True, alpha=0.3)
    for color, (label, attr) in zip(
        _COLORS,
        [("resident MiB", "rss_bytes"), ("pool in use MiB", "pool_in_use_bytes")],
        strict=False,
    ):
        ys = [getattr(s, attr) for s in samples]
        memory.plot(
            xs, [float("nan") if y is None else y / 2**20 for y in ys], color=color, label=label
        )
    memory.set_ylabel("MiB")
    memory.legend(loc="upper left")
    frag = [s.fragmentation for s in samples]
    if any(f is not None for f in frag):
        twin = memory.twinx()
        twin.plot(
            xs,
            [float("nan") if f is None else f * 100 for f in frag],
            color=_COLORS[4],
            ls=":",
            label="fragmentation %",
        )
        twin.set_ylim(0, 100)
        twin.set_ylabel("fragmentation %")
    memory.set_xlabel("seconds into the run")
    memory.grid(True, alpha=0.3)
    return _png(fig)


def draw_charts(result: StressResult) -> list[tuple[str, bytes]]:
    """(title, PNG) of every chart, in reading order."""
    charts = [
        ("Intended vs achieved rate", _rate_chart(result)),
        ("Latency percentiles over time", _latency_chart(result)),
        ("Errors", _error_chart(result)),
    ]
    server = _server_chart(result)
    if server is not None:
        charts.append(("Server: queue, batches, memory and fragmentation", server))
    return charts


def _verdicts(title: str, verdicts: list[Verdict], good: bool) -> list[str]:
    e = html.escape
    parts = [
        f"<h2>{e(title)}</h2><table><tr><th>condition</th><th>measured</th>"
        "<th>within target</th><th>verdict</th></tr>"
    ]
    for v in verdicts:
        c = v.condition
        if v.met is None:
            word, css = "not measured", ""
        elif v.met == good:
            word, css = ("met" if good else "ok"), "met"
        else:
            word, css = ("missed" if good else "FAILED"), "missed"
        within = "" if v.attainment is None else f"{v.attainment:.2%}"
        parts.append(
            f"<tr><td>{e(c.text)}</td><td>{e(c.describe_value(v.measured))}</td>"
            f"<td>{within}</td><td class='{css}'>{word}</td></tr>"
        )
    parts.append("</table>")
    return parts


def render_html(
    result: StressResult,
    found: list[str],
    warnings: list[str],
    suggested: list[Suggestion],
    charts: list[tuple[str, bytes]],
) -> str:
    """The whole report as one HTML page."""
    e = html.escape
    started = dt.datetime.fromtimestamp(result.send.started_at).strftime("%Y-%m-%d %H:%M:%S")
    p = result.profile
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>sordino stress-test {e(started)}</title><style>{_CSS}</style></head><body>",
        f"<h1>Stress test: {e(p.name)}</h1>",
        f"<p class='meta'>{e(result.url)} · started {e(started)} · {p.duration:g} s · "
        f"{e(p.arrivals)} arrivals · peak {p.peak():.0f} requests/s · intended "
        f"{result.intended_mean:.1f}/s, achieved {result.achieved_mean:.1f}/s</p>",
        "<h2>Headline</h2><table><tr>",
        "".join(f"<th>{e(h)}</th>" for h in HEADLINE_HEADER),
        "</tr>",
    ]
    for row in headline_rows(result):
        parts.append("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>")
    parts.append("</table>")
    for warning in warnings:
        parts.append(f"<div class='warn'>Client bottleneck: {e(warning)}.</div>")
    if result.slos:
        parts += _verdicts("SLO attainment", result.slos, good=True)
    if result.failures:
        parts += _verdicts("--fail-on", result.failures, good=False)
    parts.append("<h2>Findings</h2><ul>")
    parts += [f"<li>{e(line)}</li>" for line in found]
    parts.append("</ul><h2>Suggested configuration</h2>")
    if suggested:
        parts.append("<ul>")
        parts += [
            f"<li><code>{e(s.key)}</code> = {e(str(s.value))}: {e(s.why)}.</li>" for s in suggested
        ]
        parts.append(f"</ul><pre>{e(suggestions_yaml(suggested))}</pre>")
    else:
        parts.append("<p>Nothing measured argues for a change.</p>")
    if result.server_events:
        parts.append(
            "<h2>Server events during the run</h2><table><tr><th>at</th>"
            "<th>kind</th><th>subject</th><th>cause</th></tr>"
        )
        for event in result.server_events[:200]:
            at = float(event.get("t", 0.0)) - result.send.started_at
            parts.append(
                f"<tr><td>{at:+.1f} s</td><td>{e(str(event.get('kind')))}</td>"
                f"<td>{e(str(event.get('subject')))}</td><td>{e(str(event.get('cause')))}</td></tr>"
            )
        parts.append("</table>")
    if result.errors:
        parts.append("<h2>Errors by status</h2><table><tr><th>status</th><th>count</th></tr>")
        parts += [f"<tr><td>{e(k)}</td><td>{v}</td></tr>" for k, v in sorted(result.errors.items())]
        parts.append("</table>")
    parts.append("<h2>Charts</h2>")
    for title, png in charts:
        data = b64encode(png).decode()
        image = f"<img alt='{e(title)}' src='data:image/png;base64,{data}'>"
        parts.append(f"<h3>{e(title)}</h3>{image}")
    parts.append("</body></html>")
    return "\n".join(parts)
