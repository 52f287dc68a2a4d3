"""Diagnose reports as a self-contained HTML page or a PDF, both with the same charts.

The HTML page embeds its charts as PNG data URLs (one file to mail or archive). The
PDF is laid out with matplotlib: text pages, then one page per pair of charts,
embedded as images.
"""

from __future__ import annotations

import html
import io
import textwrap
from base64 import b64encode
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from sordino.reports import charts
from sordino.reports.anomalies import NOT_CAUSES
from sordino.reports.diagnose import Diagnosis, describe, load_rise, when
from sordino.reports.layers import forecast_lines, layer_sections

__all__ = ["Chart", "draw_charts", "forecast_of", "layer_lines", "render_html", "render_pdf"]


@dataclass(frozen=True, slots=True)
class Chart:
    title: str
    png: bytes


def draw_charts(diagnosis: Diagnosis, step: Callable[[str], None] | None = None) -> list[Chart]:
    """Every chart of the report, in reading order."""
    progress = step or (lambda name: None)
    out = [Chart("Overview", charts.overview_chart(diagnosis))]
    progress("overview chart")
    for i, anomaly in enumerate(diagnosis.anomalies, 1):
        out.append(Chart(f"Finding {i}: {anomaly.kind}", charts.anomaly_chart(diagnosis, anomaly)))
    progress("finding charts")
    resources = charts.resources_chart(diagnosis)
    if resources is not None:
        out.append(Chart("Resources", resources))
    satisfaction = charts.satisfaction_chart(diagnosis)
    if satisfaction is not None:
        out.append(Chart("User satisfaction", satisfaction))
    for profile in diagnosis.profiles:
        out.append(Chart(f"Operators of {profile.model}", charts.profile_chart(profile)))
    progress("resource charts")
    return out


def _fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{suffix}"


def _summary_rows(diagnosis: Diagnosis) -> list[list[str]]:
    rows = []
    for m in diagnosis.models:
        rows.append(
            [
                m.name,
                str(m.requests),
                _fmt(m.qps_mean),
                str(m.qps_peak),
                _fmt(m.p50_ms, 2),
                _fmt(m.p99_ms, 2),
                _fmt(m.p99_max_ms, 1),
                "n/a" if m.slo_attainment is None else f"{m.slo_attainment:.1%}",
                str(m.errors),
                str(m.refused),
                str(m.client_errors),
                _fmt(m.batch_mean),
            ]
        )
    return rows


SUMMARY_HEADER = [
    "model", "requests", "mean qps", "peak qps", "p50 ms", "p99 ms", "worst p99 ms",
    "within SLO", "errors", "refused", "client errors (4xx)", "mean batch",
]  # fmt: skip


def _finding_lines(diagnosis: Diagnosis) -> list[tuple[str, list[str]]]:
    out = []
    for i, anomaly in enumerate(diagnosis.anomalies, 1):
        lines = [describe(anomaly) + "."]
        cause = anomaly.likely_cause
        if cause is not None:
            e = cause.event
            lines.append(
                f"Likely cause: {e.kind} on {e.subject} at {when(e.t)}"
                f"{' (' + e.cause + ')' if e.cause else ''} [{cause.why}]."
            )
        else:
            rise = load_rise(anomaly)
            lines.append(
                f"Likely cause: {rise}; no journaled event explains it otherwise."
                if rise is not None
                else "Likely cause: no journaled event or load change explains it."
            )
        ctx = anomaly.context
        if "qps_during" in ctx:
            lines.append(
                f"Around it: {_fmt(ctx.get('qps_baseline'))} → {_fmt(ctx.get('qps_during'))} "
                f"requests/s, compute {_fmt(ctx.get('compute_ms_baseline'), 2)} → "
                f"{_fmt(ctx.get('compute_ms_during'), 2)} ms, queue wait "
                f"{_fmt(ctx.get('queue_ms_baseline'), 2)} → {_fmt(ctx.get('queue_ms_during'), 2)} "
                f"ms, queue depth up to {_fmt(ctx.get('queue_depth_max'), 0)}, busy "
                f"{_fmt((ctx.get('busy_baseline') or 0) * 100, 0)} → "
                f"{_fmt((ctx.get('busy_during') or 0) * 100, 0)}%."
            )
        for other in anomaly.causes[1:3]:
            lines.append(
                f"Also near: {other.event.kind} on {other.event.subject} at "
                f"{when(other.event.t)} (score {other.score:.2f}; {other.why})."
            )
        out.append((f"Finding {i}: {anomaly.kind.replace('_', ' ')}", lines))
    return out


def forecast_of(diagnosis: Diagnosis) -> list[str]:
    """The prediction layer: each forecast, or how much more history it needs."""
    lines = forecast_lines(
        diagnosis.forecasts,
        diagnosis.memory_forecast,
        diagnosis.forecast_short,
        diagnosis.memory_short,
    )
    return lines or ["no traffic in this window to forecast from"]


def layer_lines(diagnosis: Diagnosis) -> list[tuple[str, list[str]]]:
    """The execution, resource and business layers' sections (none without them)."""
    return layer_sections(diagnosis.layers) if diagnosis.layers is not None else []


def memory_lines(diagnosis: Diagnosis) -> list[str]:
    """The memory section: the arena's fragmentation and use, and defragmentation runs."""
    rows = diagnosis.window.resources
    lines = []
    fragmentation = [r.fragmentation for r in rows if r.fragmentation is not None]
    if fragmentation:
        lines.append(
            f"shared-memory fragmentation (worst pool): mean {np.mean(fragmentation):.1%}, "
            f"max {max(fragmentation):.1%} over {len(fragmentation)} s"
        )
    used = [
        r.pool_in_use_bytes / r.pool_reserved_bytes
        for r in rows
        if r.pool_in_use_bytes is not None and r.pool_reserved_bytes
    ]
    if used:
        lines.append(f"pools in use: mean {np.mean(used):.0%}, peak {max(used):.0%} of reserved")
    runs = [e for e in diagnosis.window.events if e.kind == "memory" and e.subject == "defrag"]
    if runs:
        moved = sum(float(e.payload.get("bytes_moved", 0)) for e in runs)
        pauses = [float(e.payload.get("pause_s", 0.0)) for e in runs]
        reasons = sorted({str(e.payload.get("reason", "?")) for e in runs})
        before = np.mean([float(e.payload.get("fragmentation_before", 0.0)) for e in runs])
        after = np.mean([float(e.payload.get("fragmentation_after", 0.0)) for e in runs])
        lines.append(
            f"{len(runs)} defragmentation runs ({', '.join(reasons)}): {moved / 2**20:.1f} MiB "
            f"moved, pause max {max(pauses) * 1000:.1f} ms, fragmentation {before:.1%} -> "
            f"{after:.1%} on average"
        )
    else:
        lines.append("no defragmentation ran in this window")
    resizes = [e for e in diagnosis.window.events if e.kind == "memory" and e.subject == "resize"]
    if resizes:
        steps = ", ".join(
            f"{float(e.payload.get('bytes_before', 0)) / 2**20:.0f} -> "
            f"{float(e.payload.get('bytes_after', 0)) / 2**20:.0f} MiB "
            f"({e.payload.get('reason', '?')})"
            for e in resizes[-5:]
        )
        pause = max(float(e.payload.get("pause_s", 0.0)) for e in resizes)
        lines.append(
            f"{len(resizes)} arena resizes, pause max {pause * 1000:.1f} ms; last: {steps}"
        )
    return lines


_CSS = """
body{font:14px/1.5 system-ui,sans-serif;margin:24px auto;max-width:1060px;color:#1d2330}
h1{margin-bottom:0}.meta{color:#667085}table{border-collapse:collapse;margin:8px 0}
th,td{border-bottom:1px solid #e4e7ec;padding:3px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}.finding{border-left:4px solid #e8590c;
padding:4px 12px;margin:12px 0;background:#fff8f0}img{max-width:100%}
li{margin-bottom:6px}.events td{text-align:left;font-size:12px}
"""


def render_html(diagnosis: Diagnosis, chart_list: list[Chart]) -> str:
    """The report as one self-contained HTML page."""
    e = html.escape
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>sordino diagnose {e(when(diagnosis.start))}</title><style>{_CSS}</style>",
        "</head><body><h1>sordino runtime health</h1>",
        f"<p class='meta'>{e(when(diagnosis.start))} – {e(when(diagnosis.end))} · focus "
        f"{e(diagnosis.focus)} · source {e(diagnosis.source)} · "
        f"{len(diagnosis.window.series)} series rows, {len(diagnosis.window.events)} events</p>",
        "<h2>Summary</h2><table><tr>",
        "".join(f"<th>{e(h)}</th>" for h in SUMMARY_HEADER),
        "</tr>",
    ]
    for row in _summary_rows(diagnosis):
        parts.append("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>")
    parts.append("</table>")
    parts.append(f"<h2>Findings ({len(diagnosis.anomalies)})</h2>")
    if not diagnosis.anomalies:
        parts.append("<p>No anomaly against the window's baseline.</p>")
    by_title = {c.title: c for c in chart_list}
    for i, (title, lines) in enumerate(_finding_lines(diagnosis), 1):
        parts.append(f"<div class='finding'><h3>{e(title)}</h3>")
        parts += [f"<p>{e(line)}</p>" for line in lines]
        chart = by_title.get(f"Finding {i}: {diagnosis.anomalies[i - 1].kind}")
        if chart is not None:
            parts.append(_img(chart))
        parts.append("</div>")
    parts.append("<h2>Recommendations</h2><ol>")
    parts += [f"<li>{e(r)}</li>" for r in diagnosis.recommendations]
    parts.append("</ol><h2>Charts</h2>")
    parts += [
        f"<h3>{e(c.title)}</h3>{_img(c)}" for c in chart_list if not c.title.startswith("Finding")
    ]
    parts.append("<h2>Memory</h2><ul>")
    parts += [f"<li>{e(line)}</li>" for line in memory_lines(diagnosis)]
    parts.append("</ul>")
    for title, lines in layer_lines(diagnosis):
        parts.append(f"<h2>{e(title)}</h2><ul>")
        parts += [f"<li>{e(line)}</li>" for line in lines]
        parts.append("</ul>")
    parts.append("<h2>Prediction layer: next-hour forecast</h2><ul>")
    parts += [f"<li>{e(line)}</li>" for line in forecast_of(diagnosis)]
    parts.append("</ul>")
    for profile in diagnosis.profiles:
        parts.append(
            f"<h2>Operators of {e(profile.model)}/{e(profile.version)}</h2><p class='meta'>"
            f"profiled {e(when(profile.started_at))} for {profile.seconds:g} s, "
            f"{profile.batches} batches{' (synthetic)' if profile.synthetic else ''}</p><table>"
            "<tr><th>operator</th><th>ms</th><th>share</th><th>calls</th></tr>"
        )
        parts += [
            f"<tr><td>{e(o.op)}</td><td>{o.total_ms:.2f}</td><td>{o.share:.1%}</td>"
            f"<td>{o.calls}</td></tr>"
            for o in profile.top(10)
        ]
        parts.append("</table>")
    parts.append("<h2>Events</h2><table class='events'><tr><th>time</th><th>kind</th>"
                 "<th>subject</th><th>cause</th></tr>")  # fmt: skip
    shown = [e for e in diagnosis.window.events if e.kind not in NOT_CAUSES]
    for event in shown[-200:]:
        parts.append(
            f"<tr><td>{e(when(event.t))}</td><td>{e(event.kind)}</td><td>{e(event.subject)}</td>"
            f"<td>{e(event.cause)}</td></tr>"
        )
    parts.append("</table></body></html>")
    return "\n".join(parts)


def _img(chart: Chart) -> str:
    data = b64encode(chart.png).decode()
    return f"<img alt='{html.escape(chart.title)}' src='data:image/png;base64,{data}'>"


class _TextPages:
    """Writes wrapped lines onto A4 matplotlib pages, starting a new page when full."""

    def __init__(self, pdf: Any) -> None:
        self._pdf = pdf
        self._fig: Any = None
        self._y = 0.0

    def _page(self) -> None:
        from matplotlib.figure import Figure

        self.close()
        self._fig = Figure(figsize=(8.27, 11.69))
        self._y = 0.95

    def line(self, text: str, *, size: float = 9, bold: bool = False, mono: bool = False) -> None:
        width = int((95 if mono else 105) * 9 / size)
        chunks = [text[:width]] if mono else textwrap.wrap(text, width=width) or [""]
        for chunk in chunks:
            if self._fig is None or self._y < 0.05:
                self._page()
            self._fig.text(
                0.07, self._y, chunk, fontsize=size, va="top",
                fontweight="bold" if bold else "normal",
                fontfamily="monospace" if mono else "sans-serif",
            )  # fmt: skip
            self._y -= size * 0.0019

    def gap(self, amount: float = 0.01) -> None:
        self._y -= amount

    def close(self) -> None:
        if self._fig is not None:
            self._pdf.savefig(self._fig)
            self._fig = None


_PAGE_IN = (8.27, 11.69)  # A4 portrait
_MARGIN = 0.04  # of the page, each side
_TITLE = 0.025  # of the page's height, above each chart


def chart_pages(pdf: Any, charts: list[Chart]) -> None:
    """Add ``charts`` to ``pdf`` as full-width images stacked down A4 pages.

    Each chart keeps its own proportions at the page's width and is never split: a
    chart that does not fit below the last one starts the next page (one taller than
    a page is scaled down to fit it), so pages fill instead of holding two fixed
    half-page slots whatever the charts' heights.
    """
    import matplotlib.image as mpimg
    from matplotlib.figure import Figure

    width_in, height_in = _PAGE_IN
    usable = 1 - 2 * _MARGIN
    fig: Any = None
    top = 0.0
    for chart in charts:
        image = mpimg.imread(io.BytesIO(chart.png), format="png")
        rows, cols = image.shape[:2]
        wide = usable
        tall = wide * width_in * rows / cols / height_in
        if tall + _TITLE > usable:  # taller than a page: fit it to one
            tall = usable - _TITLE
            wide = tall * height_in * cols / rows / width_in
        if fig is not None and top - _TITLE - tall < _MARGIN:
            pdf.savefig(fig)
            fig = None
        if fig is None:
            fig = Figure(figsize=_PAGE_IN)
            top = 1 - _MARGIN
        bottom = top - _TITLE - tall
        ax = fig.add_axes((_MARGIN + (usable - wide) / 2, bottom, wide, tall))
        ax.imshow(image)
        ax.set_title(chart.title, fontsize=10)
        ax.axis("off")
        top = bottom - 0.01
    if fig is not None:
        pdf.savefig(fig)


def render_pdf(diagnosis: Diagnosis, chart_list: list[Chart], path: Path | BinaryIO) -> None:
    """Write the report as a PDF: text pages, then the charts filling pages."""
    from matplotlib.backends.backend_pdf import PdfPages

    with PdfPages(path) as pdf:
        text = _TextPages(pdf)
        text.line("sordino runtime health", size=18, bold=True)
        text.line(
            f"{when(diagnosis.start)} – {when(diagnosis.end)} · focus {diagnosis.focus} · "
            f"source {diagnosis.source}"
        )
        text.gap()
        text.line("Summary", size=13, bold=True)
        table = [SUMMARY_HEADER, *_summary_rows(diagnosis)]
        widths = [max(len(row[i]) for row in table) for i in range(len(SUMMARY_HEADER))]
        for n, row in enumerate(table):
            cells = [
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ]
            text.line(" ".join(cells), size=7, bold=n == 0, mono=True)
        text.gap()
        text.line(f"Findings ({len(diagnosis.anomalies)})", size=13, bold=True)
        if not diagnosis.anomalies:
            text.line("No anomaly against the window's baseline.")
        for title, lines in _finding_lines(diagnosis):
            text.line(title, bold=True, size=10)
            for line in lines:
                text.line(line)
            text.gap(0.005)
        text.gap()
        text.line("Recommendations", size=13, bold=True)
        for i, recommendation in enumerate(diagnosis.recommendations, 1):
            text.line(f"{i}. {recommendation}")
            text.gap(0.004)
        text.gap()
        text.line("Memory", size=13, bold=True)
        for line in memory_lines(diagnosis):
            text.line(line)
        text.gap()
        for title, lines in layer_lines(diagnosis):
            text.gap()
            text.line(title, size=13, bold=True)
            for line in lines:
                text.line(line)
        text.gap()
        text.line("Prediction layer: next-hour forecast", size=13, bold=True)
        for line in forecast_of(diagnosis):
            text.line(line)
        text.close()
        chart_pages(pdf, chart_list)
