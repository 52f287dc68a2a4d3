"""The postmortem as one self-contained HTML page or a PDF, with the same charts.

Charts: p99 against each model's target over time (faults shaded, guardian actions
drawn as spans: green when they held, red when rolled back), answers and failures per
second (503s and timeouts apart), and utilisation (busy fraction, server CPU and arena
use, memory).
"""

from __future__ import annotations

import datetime as dt
import html
import io
from pathlib import Path
from typing import Any, BinaryIO

from sordino.reports.charts import has_data, no_data
from sordino.reports.diagnose import when
from sordino.reports.postmortem import ClassAvailability, Postmortem
from sordino.reports.postmortem_incidents import QUIET_S
from sordino.reports.render import Chart, _img, _TextPages, chart_pages, forecast_of, layer_lines
from sordino.telemetry.availability import outcome_class, rejection_class

__all__ = ["draw_postmortem_charts", "render_postmortem_html", "render_postmortem_pdf"]

_COLORS = ["#2f6fed", "#e8590c", "#2b8a3e", "#ae3ec9", "#c92a2a", "#0b7285"]
TARGET_HEADER = ["objective", "target", "actual", "verdict"]
AVAILABILITY_HEADER = [
    "class", "accepted", "ok", "503", "timeout", "other errors", "refused at admission",
    "client errors (4xx)", "availability",
]  # fmt: skip
ERRORS_CHART = "Answers, refusals, errors and client errors per second"
RESOURCE_HEADER = ["resource", "mean", "peak", "peak at", "seconds"]
INCIDENT_HEADER = ["start", "cause", "time to repair", "requests failed", "seconds with errors"]
GUARDIAN_HEADER = ["time", "trigger", "action", "duration", "verify", "outcome", "explanation"]


def _figure(height: float, rows: int = 1) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, height), layout="constrained")
    return fig, fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _t(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t)


def _axis(ax: Any, pm: Postmortem) -> None:
    """Times on the x axis, over the whole period: every chart shares one time range, so
    the same moment sits at the same place in each."""
    import matplotlib.dates as mdates

    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))  # type: ignore[no-untyped-call]
    ax.set_xlim(_t(pm.start), _t(pm.end))
    ax.grid(True, alpha=0.3)


def _fault_spans(pm: Postmortem) -> list[tuple[float, float]]:
    spans, opened = [], {}
    for e in pm.window.events:
        if e.kind == "fault_injected":
            opened[e.payload.get("id")] = e.t
        elif e.kind == "fault_cleared" and e.payload.get("id") in opened:
            spans.append((opened.pop(e.payload.get("id")), e.t))
    spans += [(t, pm.end) for t in opened.values()]
    return spans


def _decorate(ax: Any, pm: Postmortem) -> None:
    for i, (start, end) in enumerate(_fault_spans(pm)):
        ax.axvspan(
            _t(start),
            _t(max(end, start + 1)),
            color="#ffa94d",
            alpha=0.3,
            label="chaos fault" if i == 0 else None,
        )
    for action in pm.guardian:
        start = action.started or action.t
        end = action.ended or start + 1
        color = "#c92a2a" if action.outcome == "rolled back" else "#2b8a3e"
        ax.axvspan(_t(start), _t(max(end, start + 1)), color=color, alpha=0.25)
        ax.axvline(_t(start), color=color, lw=1)
        ax.annotate(
            f"guardian: {action.action} ({action.outcome})",
            (_t(start), 1.0),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            rotation=90,
            va="top",
            color=color,
        )


def _latency_chart(pm: Postmortem) -> bytes:
    fig, (ax,) = _figure(3.6)
    for color, model in zip(_COLORS, pm.active_models, strict=False):
        rows = pm.window.rows_of(model)
        ax.plot(
            [_t(r.t) for r in rows],
            [float("nan") if r.p99_ms is None else r.p99_ms for r in rows],
            color=color,
            lw=1,
            label=f"{model} p99",
        )
        target = pm.slo_ms.get(model)
        if target:
            ax.axhline(target, color=color, ls="--", lw=1, label=f"{model} target")
    _decorate(ax, pm)
    latencies = [r.p99_ms for m in pm.active_models for r in pm.window.rows_of(m)]
    if has_data(latencies):
        ax.set_yscale("log")
    else:
        no_data(ax, "no latency: no request succeeded in this period")
    ax.set_ylabel("p99 ms")
    ax.legend(loc="upper left", fontsize=8)
    _axis(ax, pm)
    return _png(fig)


def _errors_chart(pm: Postmortem) -> bytes:
    fig, (ax,) = _figure(3.0)
    seconds: dict[int, dict[str, int]] = {}
    for row in pm.window.series:
        slot = seconds.setdefault(
            row.t, {"ok": 0, "unavailable": 0, "timeout": 0, "failed": 0, "client_error": 0}
        )
        slot["ok"] += row.requests - row.errors
        for reason, n in row.errors_by_reason.items():
            kind = outcome_class("failure", reason)
            slot[kind if kind in slot else "failed"] += n
        for reason, n in row.rejected_by_reason.items():
            kind = rejection_class(reason)
            slot["unavailable" if kind == "refused" else kind] += n
    xs = [_t(t) for t in sorted(seconds)]
    bottom = [0.0] * len(xs)
    for color, (key, label) in zip(
        ["#2b8a3e", "#e8590c", "#ae3ec9", "#c92a2a", "#868e96"],
        [
            ("ok", "answered"),
            ("unavailable", "503 / 429"),
            ("timeout", "timeout"),
            ("failed", "error"),
            ("client_error", "client error (4xx)"),
        ],
        strict=True,
    ):
        ys = [float(seconds[t][key]) for t in sorted(seconds)]
        ax.bar(xs, ys, width=1 / 86400, bottom=bottom, color=color, label=label, align="edge")
        bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    _decorate(ax, pm)
    ax.set_ylim(bottom=0, top=max(1.0, ax.get_ylim()[1]))
    ax.set_ylabel("requests/s")
    ax.legend(loc="upper left", fontsize=8)
    _axis(ax, pm)
    return _png(fig)


def _resources_chart(pm: Postmortem) -> bytes:
    fig, (busy, shares, memory) = _figure(6.4, rows=3)
    for color, model in zip(_COLORS, pm.active_models, strict=False):
        rows = pm.window.rows_of(model)
        busy.plot(
            [_t(r.t) for r in rows], [r.busy * 100 for r in rows], color=color, lw=1, label=model
        )
    busy.set_ylabel("instances busy %")
    busy.legend(loc="upper left", fontsize=8)
    _axis(busy, pm)
    res = pm.window.resources
    shares.plot(
        [_t(r.t) for r in res],
        [r.cpu_percent for r in res],
        color=_COLORS[0],
        lw=1,
        label="server CPU % of one core",
    )
    arena = [
        (r.t, 100 * r.pool_in_use_bytes / r.pool_reserved_bytes)
        for r in res
        if r.pool_in_use_bytes is not None and r.pool_reserved_bytes
    ]
    if arena:
        shares.plot(
            [_t(t) for t, _ in arena],
            [v for _, v in arena],
            color=_COLORS[1],
            lw=1,
            label="arena in use % of reserved",
        )
    shares.set_ylabel("%")
    shares.legend(loc="upper left", fontsize=8)
    _axis(shares, pm)
    memory.plot(
        [_t(r.t) for r in res],
        [r.rss_bytes / 2**20 for r in res],
        color=_COLORS[0],
        label="resident MiB",
    )
    pool = [(r.t, r.pool_in_use_bytes) for r in res if r.pool_in_use_bytes is not None]
    if pool:
        memory.plot(
            [_t(t) for t, _ in pool],
            [v / 2**20 for _, v in pool],
            color=_COLORS[1],
            label="pool in use MiB",
        )
    memory.set_ylabel("MiB")
    memory.legend(loc="upper left", fontsize=8)
    _axis(memory, pm)
    return _png(fig)


def draw_postmortem_charts(pm: Postmortem) -> list[Chart]:
    """The charts of the sections chosen, in reading order."""
    out = []
    if "latency" in pm.sections and pm.window.series:
        out.append(Chart("p99 against target", _latency_chart(pm)))
    if "availability" in pm.sections and pm.window.series:
        out.append(
            Chart("Answers, refusals, errors and client errors per second", _errors_chart(pm))
        )
    if "resources" in pm.sections and (pm.window.series or pm.window.resources):
        out.append(Chart("Utilisation", _resources_chart(pm)))
    return out


def _duration(start: float | None, end: float | None) -> str:
    if start is None or end is None:
        return "n/a"
    return f"{end - start:.1f} s"


def _availability_rows(classes: list[ClassAvailability]) -> list[list[str]]:
    return [
        [
            c.name,
            str(c.accepted),
            str(c.ok),
            str(c.unavailable),
            str(c.timeout),
            str(c.failed),
            str(c.refused),
            str(c.client_errors),
            "n/a" if c.availability is None else f"{c.availability:.3%}",
        ]
        for c in classes
    ]


def _guardian_rows(pm: Postmortem) -> list[list[str]]:
    return [
        [
            when(a.started or a.t),
            a.trigger,
            a.action,
            _duration(a.started, a.ended),
            a.verify,
            a.outcome,
            a.explanation,
        ]
        for a in pm.guardian
    ]


def _resource_rows(pm: Postmortem) -> list[list[str]]:
    def value(v: float, unit: str) -> str:
        return f"{v:.1f}%" if unit == "%" else f"{v:.1f} {unit}"

    return [
        [u.resource, value(u.mean, u.unit), value(u.peak, u.unit), when(u.peak_at), str(u.seconds)]
        for u in pm.resource_use
    ]


def _incident_rows(pm: Postmortem) -> list[list[str]]:
    return [
        [
            when(i.start),
            i.cause,
            "not repaired in the period"
            if i.time_to_repair is None
            else f"{i.time_to_repair:.1f} s",
            str(i.failed),
            str(i.seconds_with_errors),
        ]
        for i in pm.incidents
    ]


def _intervention_rows(pm: Postmortem) -> list[list[str]]:
    return [[when(i.t), i.kind, i.subject, i.detail] for i in pm.interventions]


def _blocks(pm: Postmortem) -> list[tuple[str, list[str], list[list[str]], list[str]]]:
    """(title, table header, table rows, paragraphs) of each section, in order."""
    out: list[tuple[str, list[str], list[list[str]], list[str]]] = []
    if "availability" in pm.sections:
        out.append(
            (
                "Availability by priority class",
                AVAILABILITY_HEADER,
                _availability_rows(pm.by_priority),
                list(pm.notes),
            )
        )
        out.append(
            (
                "Availability by model",
                AVAILABILITY_HEADER,
                _availability_rows([c for c in pm.by_model if c.received]),
                [],
            )
        )
    if "guardian" in pm.sections:
        none = [] if pm.guardian else ["The guardian took no action in this period."]
        out.append(("Guardian actions", GUARDIAN_HEADER, _guardian_rows(pm), none))
    if "interventions" in pm.sections:
        none = [] if pm.interventions else ["No manual intervention was journaled."]
        out.append(
            (
                "Manual interventions",
                ["time", "kind", "subject", "what"],
                _intervention_rows(pm),
                none,
            )
        )
    if "resources" in pm.sections:
        out.append(("Resource utilisation", RESOURCE_HEADER, _resource_rows(pm), pm.utilisation))
    for title, lines in layer_lines(pm.diagnosis):
        # Execution and resource layers with the resources, satisfaction with latency.
        if ("satisfaction" in title and "latency" in pm.sections) or (
            "satisfaction" not in title and "resources" in pm.sections
        ):
            out.append((title, [], [], lines))
    if "resources" in pm.sections:
        out.append(("Prediction layer: next-hour forecast", [], [], forecast_of(pm.diagnosis)))
    if "repair" in pm.sections:
        said = (
            f"An incident is a run of seconds in which clients saw failed requests (4xx client "
            f"errors aside), or a fault event; it is repaired at the first moment after which "
            f"clients saw no error for {QUIET_S} s. Time to repair runs from the earlier of its "
            "first failing second and its fault."
        )
        none = (
            []
            if pm.incidents
            else ["No incident: clients saw no error and no fault was journaled."]
        )
        out.append(
            ("Incidents and time to repair", INCIDENT_HEADER, _incident_rows(pm), [said, *none])
        )
    if "windows" in pm.sections:
        out.append(("Worst windows and likely causes", [], [], pm.worst or ["None found."]))
    out.append(("Recommendations", [], [], pm.recommendations))
    return out


_CSS = """
body{font:14px/1.5 system-ui,sans-serif;margin:24px auto;max-width:1060px;color:#1d2330}
h1{margin-bottom:0}.meta{color:#667085}table{border-collapse:collapse;margin:8px 0}
th,td{border-bottom:1px solid #e4e7ec;padding:3px 8px;text-align:left}
.met{color:#2b8a3e;font-weight:bold}.missed{color:#c92a2a;font-weight:bold}img{max-width:100%}
"""


def render_postmortem_html(pm: Postmortem, charts: list[Chart]) -> str:
    """The postmortem as one HTML page: the target table first."""
    e = html.escape
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>Postmortem {e(pm.name)}</title><style>{_CSS}</style></head><body>",
        f"<h1>Postmortem: {e(pm.name)}</h1>",
        f"<p class='meta'>{e(when(pm.start))} – {e(when(pm.end))} · journal {e(pm.source)} · "
        f"{len(pm.window.series)} series rows, {len(pm.window.events)} events</p>",
        "<h2>Targets</h2><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in TARGET_HEADER),
        "</tr>",
    ]
    for row in pm.targets:
        parts.append(
            f"<tr><td>{e(row.what)}</td><td>{e(row.target)}</td><td>{e(row.actual)}</td>"
            f"<td class='{e(row.verdict)}'>{e(row.verdict)}</td></tr>"
        )
    parts.append("</table>")
    by_title = {c.title: c for c in charts}
    placement = {
        "Availability by priority class": ERRORS_CHART,
        "Worst windows and likely causes": "p99 against target",
        "Resource utilisation": "Utilisation",
    }
    for title, header, rows, paragraphs in _blocks(pm):
        parts.append(f"<h2>{e(title)}</h2>")
        parts += [f"<p>{e(p)}</p>" for p in paragraphs if title != "Recommendations"]
        if title == "Recommendations":
            parts.append("<ol>" + "".join(f"<li>{e(p)}</li>" for p in paragraphs) + "</ol>")
        if header and rows:
            parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
            parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows]
            parts.append("</table>")
        chart = by_title.get(placement.get(title, ""))
        if chart is not None:
            parts.append(_img(chart))
    parts.append("</body></html>")
    return "\n".join(parts)


def _table(text: _TextPages, header: list[str], rows: list[list[str]]) -> None:
    cut = [[c[:48] for c in r] for r in [header, *rows]]
    widths = [max(len(r[i]) for r in cut) for i in range(len(header))]
    for n, row in enumerate(cut):
        line = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))
        text.line(line, size=6.5, bold=n == 0, mono=True)


def render_postmortem_pdf(pm: Postmortem, charts: list[Chart], path: Path | BinaryIO) -> None:
    """The postmortem as a PDF: the target table, the sections, then the charts."""
    from matplotlib.backends.backend_pdf import PdfPages

    with PdfPages(path) as pdf:
        text = _TextPages(pdf)
        text.line(f"Postmortem: {pm.name}", size=18, bold=True)
        text.line(f"{when(pm.start)} – {when(pm.end)} · journal {pm.source}")
        text.gap()
        text.line("Targets", size=13, bold=True)
        _table(text, TARGET_HEADER, [[r.what, r.target, r.actual, r.verdict] for r in pm.targets])
        for title, header, rows, paragraphs in _blocks(pm):
            text.gap()
            text.line(title, size=13, bold=True)
            for i, paragraph in enumerate(paragraphs, 1):
                text.line(f"{i}. {paragraph}" if title == "Recommendations" else paragraph)
            if header and rows:
                _table(text, header, rows)
        text.close()
        chart_pages(pdf, charts)
