"""The observability layers in diagnose and the postmortem, on journals of known history.

The journal is written with the server's own writer: per-second rows, ``utilisation``
events (as the telemetry hub journals them every 10 s) and ``feedback`` events (as
``POST /v2/feedback`` journals them), so every figure the reports print is known.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sordino.errors import RateLimited
from sordino.events import Event
from sordino.inference import ModelKey
from sordino.records import RequestDone
from sordino.reports.diagnose import diagnose
from sordino.reports.postmortem import postmortem
from sordino.reports.postmortem_render import render_postmortem_html
from sordino.reports.render import forecast_of
from sordino.telemetry.feedback import Feedback, RecentRequests
from sordino.telemetry.forecast import forecast_from_journal
from sordino.telemetry.journal import Journal
from sordino.telemetry.journal_reader import JournalReader
from sordino.telemetry.satisfaction import correlate
from sordino.telemetry.series import ResourceRow, SecondRow

T0 = 1_000_020  # a minute boundary
MB = 1e6


def _journal(path: Path, seconds: int, events: tuple[Event, ...] = ()) -> Path:
    writer = Journal(path, wall=lambda: T0 + seconds)
    writer.open()
    for s in range(seconds):
        row = SecondRow(T0 + s, "m", "1", 10, 0, {}, 5.0, 9.0, None, None, 2, 5.0, 0, 0.5, 10)
        writer.write_rows([row], ResourceRow(T0 + s, 200 << 20, 50.0, *[None] * 7))
    for event in events:
        writer.write_event(event)
    assert writer.flush()
    writer.close()
    return path


def test_forecast_says_how_many_minutes_it_needs_then_appears(tmp_path: Path) -> None:
    short = _journal(tmp_path / "short.sqlite3", 3 * 60)
    forecast = forecast_from_journal(short, now=T0 + 180)
    assert forecast.qps == {} and forecast.needs_minutes == {"m": 7}
    assert forecast.memory_needs_minutes == 7 and forecast.short
    with JournalReader(short) as reader:
        lines = forecast_of(diagnose(reader.window(T0, T0 + 180)))
    assert "m: no forecast yet: needs 7 more minutes of history (10 at least)" in lines
    assert "memory: no forecast yet: needs 7 more minutes of history (10 at least)" in lines

    enough = _journal(tmp_path / "enough.sqlite3", 12 * 60)
    forecast = forecast_from_journal(enough, now=T0 + 720)
    assert forecast.qps["m"].mean == pytest.approx(10.0) and not forecast.short
    with JournalReader(enough) as reader:
        lines = forecast_of(diagnose(reader.window(T0, T0 + 720)))
    assert lines[0].startswith("m: 10.0 requests/s on average next hour, peak 10.0")
    assert not any("needs" in line for line in lines)


def _utilisation(t: float, arena: float, hop: float, busy: tuple[float, float]) -> Event:
    payload = {
        "seconds": 10,
        "bandwidth": {
            "bytes_s": {"arena": arena, "worker_hop": hop},
            "moved_bytes_s": arena + hop,
            "capacity_bytes_s": 10_000 * MB,
            "saturation": (arena + hop) / (10_000 * MB),
        },
        "instances": {
            "m/1/0": {"busy": busy[0], "device": "cpu"},
            "m/1/1": {"busy": busy[1], "device": "cpu"},
        },
    }
    return Event("utilisation", "runtime", "", payload, time=t)


def _rating(t: float, rating: int, latency_ms: float, outcome: str = "success") -> Event:
    payload = {"rating": rating, "request_id": f"r{t}", "tag": None, "latency_ms": latency_ms,
               "outcome": outcome, "reason": "", "degraded": False}  # fmt: skip
    return Event("feedback", "m/1", f"rated {rating}/5", payload, time=t)


def test_the_postmortem_shows_every_layer(tmp_path: Path) -> None:
    events = [
        _utilisation(T0 + 10, 100 * MB, 200 * MB, (0.2, 0.4)),
        _utilisation(T0 + 20, 300 * MB, 400 * MB, (0.6, 0.8)),
        _rating(T0 + 5, 5, 50.0),
        _rating(T0 + 6, 4, 80.0),
        _rating(T0 + 7, 2, 1500.0),
        _rating(T0 + 8, 1, 4000.0, outcome="failure"),
    ]
    path = _journal(tmp_path / "j.sqlite3", 40, tuple(events))
    with JournalReader(path) as reader:
        window = reader.window(T0, T0 + 40)
    page = render_postmortem_html(postmortem(window, name="drill", source=str(path)), [])
    assert "Execution layer: instance (stream) utilisation" in page
    assert "m/1/0 on cpu: busy 40.00% on average, peak 60.00%" in page
    assert "moved 500.00 MB/s on average (arena 200.00 MB/s, worker hop 300.00 MB/s)" in page
    assert "saturation 5.00% on average, peak 7.00% of the measured copy bandwidth" in page
    assert "4 ratings, mean 3.00/5" in page
    assert "&lt; 100 ms: 4.50 (2)" in page and "≥ 3 s: 1.00 (1)" in page
    assert "slower answers are rated lower" in page
    assert "failed requests rated 1.00, successful ones 3.67" in page
    # A period without ratings says how to give them.
    with JournalReader(path) as reader:
        quiet = reader.window(T0 + 30, T0 + 40)
    page = render_postmortem_html(postmortem(quiet, name="q", source=str(path)), [])
    assert "no ratings in this period (clients rate requests with POST /v2/feedback)" in page


def test_correlation_of_known_ratings() -> None:
    found = correlate(
        [
            {"rating": 5, "latency_ms": 10.0, "outcome": "success"},
            {"rating": 3, "latency_ms": 20.0, "outcome": "success", "degraded": True},
            {"rating": 1, "latency_ms": 30.0, "outcome": "failure"},
            {"rating": 4, "tag": "poster"},
        ]
    )
    assert (found.count, found.rated_requests, found.mean) == (4, 3, 3.25)
    assert found.latency_r == pytest.approx(-1.0)
    assert (found.degraded_mean, found.undegraded_mean) == (3.0, 3.0)
    assert found.tags == {"poster": (1, 4.0)}
    assert correlate([{"rating": 4, "latency_ms": 5.0}] * 3).latency_r is None  # no variance


def test_each_client_may_rate_a_bounded_number_of_times_a_minute() -> None:
    now = [T0 + 0.0]
    journaled: list[str] = []
    requests = RecentRequests(keep=3, wall=lambda: now[0])
    feedback = Feedback(
        lambda kind, *a, **p: journaled.append(kind),
        requests=requests,
        wall=lambda: now[0],
        per_client_per_min=2,
        keep=2,
    )
    feedback.rate({"tag": "a", "rating": 5}, client="10.0.0.1")
    feedback.rate({"tag": "a", "rating": 4}, client="10.0.0.1")
    with pytest.raises(RateLimited, match="the most a client may send"):
        feedback.rate({"tag": "a", "rating": 3}, client="10.0.0.1")
    feedback.rate({"tag": "a", "rating": 3}, client="10.0.0.2")  # another client
    now[0] += 60
    feedback.rate({"tag": "a", "rating": 2}, client="10.0.0.1")  # a minute later
    assert journaled == ["feedback"] * 4 and [r.rating for r in feedback.ratings] == [3, 2]
    # Only the last `keep` request ids are remembered.
    for i in range(4):
        done = RequestDone(
            ModelKey("m", "1"), "success", "", 0, 0.0, 0.01, 0.02, request_id=f"q{i}"
        )
        requests.request_done(done)
    assert requests.find("q0") is None and requests.find("q3") is not None
