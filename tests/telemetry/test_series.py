"""The per-second series: buckets by wall-clock second, rows for quiet seconds, figures."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sordino.inference import ModelKey
from sordino.records import BatchDone, QueueStatistics, RequestDone, SchedulerStatistics
from sordino.telemetry.series import ResourceRow, SecondRow, SeriesRecorder

KEY = ModelKey("m", "1")


class Wall:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _stats(depth: int = 0) -> SchedulerStatistics:
    queue = QueueStatistics.__new__(QueueStatistics)
    object.__setattr__(queue, "depth", depth)
    stats = SchedulerStatistics.__new__(SchedulerStatistics)
    for name, value in {"model": "m", "version": "1", "queue": queue}.items():
        object.__setattr__(stats, name, value)
    return stats


def _recorder(wall: Wall, depth: Callable[[], int] = lambda: 0) -> SeriesRecorder:
    return SeriesRecorder(
        models=lambda: [_stats(depth())],
        instances=lambda key: 2,
        slo_s=lambda key: 0.050,
        wall=wall,
        window_s=60,
    )


def _done(
    rec: SeriesRecorder, total_s: float, outcome: str = "success", reason: str = "ok"
) -> None:
    done = RequestDone(KEY, outcome, reason, 2, total_s / 2, total_s / 2, total_s)  # type: ignore[arg-type]
    rec.request_done(done)


def test_requests_land_in_the_second_they_finish_in() -> None:
    wall = Wall(1000.2)
    rec = _recorder(wall)
    for ms in range(1, 101):
        _done(rec, ms / 1000)
    wall.t = 1001.5
    _done(rec, 0.2)
    rows = rec.close_until(1001)
    assert [r.t for r in rows] == [1000]
    row = rows[0]
    assert row.requests == 100 and row.errors == 0
    assert row.p50_ms == pytest.approx(50.5, abs=0.01)
    assert row.p99_ms == pytest.approx(99.01, abs=0.01)
    assert row.slo_met == 50  # 1..50 ms are within the 50 ms SLO
    (later,) = rec.close_until(1002)
    assert later.requests == 1 and later.slo_met == 0


def test_quiet_seconds_get_zero_rows() -> None:
    wall = Wall(1000.0)
    rec = _recorder(wall)
    rec.close_until(1000)
    rows = rec.close_until(1004)
    assert [r.t for r in rows] == [1000, 1001, 1002, 1003]
    assert all(r.requests == 0 and r.p99_ms is None and r.batch_size is None for r in rows)


def test_errors_are_counted_by_reason() -> None:
    wall = Wall(50.0)
    rec = _recorder(wall)
    _done(rec, 0.01)
    _done(rec, 0.0, "failure", "queue_timeout")
    _done(rec, 0.0, "failure", "queue_timeout")
    _done(rec, 0.0, "failure", "inference_failed")
    (row,) = rec.close_until(51)
    assert row.requests == 4 and row.errors == 3
    assert row.errors_by_reason == {"queue_timeout": 2, "inference_failed": 1}
    assert row.error_rate == 0.75


def test_batches_give_batch_size_and_busy_fraction() -> None:
    wall = Wall(10.0)
    rec = _recorder(wall)
    for rows in (4, 8):
        rec.batch_done(BatchDone(KEY, rows, rows, 0.0, 0.25, 0.0, ok=True))
    rec.queue_changed(KEY, 7)
    (row,) = rec.close_until(11)
    assert row.batches == 2 and row.batch_size == 6.0
    assert row.busy == pytest.approx(0.25)  # 0.5 s of compute over 2 instances
    assert row.queue_depth == 7


def test_recent_keeps_a_bounded_window_and_listeners_see_every_second() -> None:
    wall = Wall(0.0)
    rec = _recorder(wall)
    seen: list[tuple[list[SecondRow], ResourceRow | None]] = []
    rec.subscribe(lambda rows, res: seen.append((rows, res)))
    rec.close_until(0)
    for second in range(1, 100):
        rec.close_until(second)
    assert len(rec.recent()[KEY]) == 60
    assert len(rec.recent(5)[KEY]) == 5
    assert sum(len(rows) for rows, _ in seen) == 100
    assert rec.statistics().last_closed == 98


def test_a_clock_set_back_goes_on_from_the_new_time(caplog: pytest.LogCaptureFixture) -> None:
    """Set back by NTP or by hand, the wall clock repeats seconds already closed. The
    recorder waited for it to pass the last closed second again, dropping every request
    meanwhile (an hour of series, and of the guardian's windows, for an hour's step)."""
    wall = Wall(1000.5)
    rec = _recorder(wall)
    rec.close_until(1000)
    for second in range(1000, 1004):
        wall.t = second + 0.5
        _done(rec, 0.01)
        rec.close_until(second + 1)
    wall.t = 1004.5
    _done(rec, 0.01)  # in a second the jump leaves in the future: never closed
    closed: list[tuple[int, int]] = []
    with caplog.at_level("WARNING", logger="sordino.telemetry"):
        for second in range(900, 904):
            wall.t = second + 0.5
            _done(rec, 0.01)
            closed += [(r.t, r.requests) for r in rec.close_until(second + 1)]
    assert closed == [(900, 1), (901, 1), (902, 1), (903, 1)]  # before: []
    assert [r.getMessage() for r in caplog.records] == [
        "the wall clock went back (by 103 s at least): the per-second series goes on from "
        "the new time (the journal's rows of the seconds it repeats are written again)"
    ]
    # The in-memory window no longer holds the seconds that are now in the future.
    assert [r.t for r in rec.recent()[KEY]] == [900, 901, 902, 903]
