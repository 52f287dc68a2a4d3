"""Report charts and pages (issue 27, item 20): pages that fill, one time axis, no data."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from pypdf import PdfReader

from sordino.loadtest import report as stress_report
from sordino.loadtest.profiles import Profile, Segment
from sordino.loadtest.results import Recorder
from sordino.loadtest.run import StressResult
from sordino.loadtest.sender import SendStatistics
from sordino.reports import postmortem_render
from sordino.reports.diagnose import diagnose
from sordino.reports.postmortem import postmortem
from sordino.reports.render import Chart, render_pdf
from sordino.telemetry.journal_reader import JournalWindow
from sordino.telemetry.series import ResourceRow, SecondRow

T0 = 1_700_000_000


def _row(t: int, p99: float | None = 5.0) -> SecondRow:
    return SecondRow(
        t=t, model="m", version="1", requests=10 if p99 else 0, errors=0, errors_by_reason={},
        p50_ms=p99, p99_ms=p99, queue_ms=0.1, compute_ms=1.0, batches=2, batch_size=5.0,
        queue_depth=0, busy=0.2, slo_met=10 if p99 else 0,
    )  # fmt: skip


def _res(t: int) -> ResourceRow:
    return ResourceRow(t, 100 << 20, 5.0, None, None, None, None, None, None, None)


def _capture(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[Any]:
    figures: list[Any] = []

    def keep(fig: Any) -> bytes:
        figures.append(fig)
        return b""

    monkeypatch.setattr(module, "_png", keep)
    return figures


def test_postmortem_charts_share_one_time_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """Series rows start later than resource rows: every chart still spans the period."""
    window = JournalWindow(
        T0, T0 + 300, [_row(t) for t in range(T0 + 100, T0 + 160)],
        [_res(t) for t in range(T0 + 20, T0 + 290)], [],
    )  # fmt: skip
    pm = postmortem(window, name="drill", source="test")
    figures = _capture(monkeypatch, postmortem_render)
    postmortem_render.draw_postmortem_charts(pm)
    ranges = {tuple(ax.get_xlim()) for fig in figures for ax in fig.axes}
    assert len(figures) == 3 and len(ranges) == 1, ranges


def test_an_empty_latency_chart_says_no_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request refused: the stress report's latency chart says so on a 0..1 axis."""
    recorder = Recorder(window_s=1.0, windows=5)
    for i in range(20):
        recorder.record_send(i / 4, 0.001)
        recorder.record(i / 4, 0.002, "400", [("class", "default")], "no digit")
    send = SendStatistics(scheduled=20, sent=20, answered=20, in_flight_cap=8, last_send_s=4.8)
    result = StressResult(
        url="http://x", profile=Profile(segments=(Segment(duration=5, rate=4),)), window_s=1.0,
        intended_rate=[4.0] * 5, sent_rate=[4.0] * 5, windows=recorder.window_summaries(),
        window_errors=[dict(c) for c in recorder.window_errors], total=recorder.summary(),
        groups={}, errors=dict(recorder.errors), lag_p99_ms=1.0, lag_max_ms=1.0, send=send,
        server=[], server_observed=False,
    )  # fmt: skip
    figures = _capture(monkeypatch, stress_report)
    stress_report._latency_chart(result)
    (ax,) = figures[0].axes
    assert ax.get_yscale() == "linear" and tuple(ax.get_ylim()) == (0.0, 1.0)
    assert any("no latency" in t.get_text() for t in ax.texts)


def _png(height: float) -> bytes:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, height))
    fig.add_subplot().plot([0, 1], [0, 1])
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=50)
    return buf.getvalue()


def test_pdf_charts_fill_pages_instead_of_half_pages(tmp_path: Path) -> None:
    """Three 10×3 charts fit on one A4 page; a tall one that does not fit starts the next."""
    window = JournalWindow(T0, T0 + 60, [_row(t) for t in range(T0, T0 + 60)], [], [])
    diagnosis = diagnose(window)

    def chart_pages(charts: list[Chart]) -> int:
        path = tmp_path / "r.pdf"
        render_pdf(diagnosis, charts, path)
        return len(PdfReader(path).pages)

    text = chart_pages([])
    assert chart_pages([Chart(f"c{i}", _png(3.0)) for i in range(3)]) - text == 1
    tall = [Chart("a", _png(7.5)), Chart("b", _png(4.2)), Chart("c", _png(3.0))]
    assert chart_pages(tall) - text == 2
