"""Anomaly detectors and event correlation on synthetic journal windows."""

from __future__ import annotations

from sordino.reports.anomalies import (
    correlate,
    error_bursts,
    fragmentation_climbs,
    latency_spikes,
    memory_growth,
)
from sordino.reports.diagnose import diagnose
from sordino.reports.render import render_html
from sordino.telemetry.journal_reader import JournalEvent, JournalWindow
from sordino.telemetry.series import ResourceRow, SecondRow


def _row(
    t: int, p99: float, *, requests: int = 50, errors: int = 0, reason: str = "x"
) -> SecondRow:
    return SecondRow(
        t=t, model="m", version="1", requests=requests, errors=errors,
        errors_by_reason={reason: errors} if errors else {}, p50_ms=p99 / 2, p99_ms=p99,
        queue_ms=0.1, compute_ms=p99 / 3, batches=10, batch_size=5.0, queue_depth=1,
        busy=0.2, slo_met=requests - errors,
    )  # fmt: skip


def _res(t: int, rss: int = 100 << 20, frag: float | None = None) -> ResourceRow:
    return ResourceRow(t, rss, 5.0, None, None, frag, None, None, None, None)


def _spiky(spike: range) -> list[SecondRow]:
    return [_row(t, 200.0 if t in spike else 2.0 + (t % 3) * 0.1) for t in range(100)]


def test_a_latency_spike_is_found_with_its_window_and_numbers() -> None:
    (spike,) = latency_spikes(_spiky(range(40, 50)))
    assert (spike.start, spike.end, spike.model) == (40, 50, "m")
    assert spike.peak == 200.0 and 1.9 < spike.baseline < 2.3
    assert spike.context["qps_during"] == 50.0


def test_noise_and_single_blips_are_not_spikes() -> None:
    assert latency_spikes(_spiky(range(0))) == []
    assert latency_spikes(_spiky(range(40, 41))) == []  # one second is a blip
    # Doubling a 2 ms p99 is under the 10 ms minimum increase.
    assert latency_spikes([_row(t, 4.0 if 40 <= t < 50 else 2.0) for t in range(100)]) == []


def test_nearby_seconds_merge_into_one_spike() -> None:
    rows = _spiky(range(40, 50))
    rows[45] = _row(45, 2.0)
    (spike,) = latency_spikes(rows)
    assert (spike.start, spike.end) == (40, 50)


def _fault(t: float, kind: str, target: str, fault_id: str) -> JournalEvent:
    """A chaos event as ``FaultRegistry`` journals it."""
    if kind == "fault_injected":
        payload = {"id": fault_id, "fault": "latency", "rate": 1.0, "latency_s": 0.2}
        return JournalEvent(t, kind, target, "chaos API", payload)
    return JournalEvent(t, kind, target, "duration elapsed", {"id": fault_id, "fault": "latency"})


def test_chaos_at_the_onset_is_the_likely_cause() -> None:
    (spike,) = latency_spikes(_spiky(range(40, 50)))
    events = [
        JournalEvent(10.0, "model_loaded", "m/1", "", {}),
        _fault(39.6, "fault_injected", "worker:m", "f1"),
        _fault(39.8, "fault_injected", "worker:other/0", "f2"),
        _fault(49.7, "fault_cleared", "worker:m", "f1"),
        JournalEvent(300.0, "config_changed", "scheduler", "", {}),
    ]
    ranked = correlate(spike, events)
    assert ranked.likely_cause is not None
    assert ranked.likely_cause.event.subject == "worker:m"
    assert "concerns m" in ranked.likely_cause.why and "cleared" in ranked.likely_cause.why
    other = next(c for c in ranked.causes if c.event.subject == "worker:other/0")
    assert "concerns another model (other)" in other.why
    assert all(c.event.kind != "config_changed" for c in ranked.causes)  # after the window


def test_a_fault_just_after_a_noisy_first_second_is_still_the_cause() -> None:
    """A noisy second merged with the spike puts the window's start before the fault (as
    on a loaded machine in CI: the window began 2.05 s before the injection), while a
    worker started 3 s before the window: the fault on the model, cleared as the spike
    ended, is the cause, not the worker's start."""
    rows = _spiky(range(42, 50))
    rows[40] = _row(40, 200.0)  # a noisy second, merged across the gap
    (spike,) = latency_spikes(rows)
    assert spike.start == 40
    events = [
        JournalEvent(37.0, "worker_started", "m/0", "model loaded", {"model": "m"}),
        _fault(42.05, "fault_injected", "worker:m", "f1"),
        _fault(49.8, "fault_cleared", "worker:m", "f1"),
    ]
    ranked = correlate(spike, events)
    assert ranked.likely_cause is not None
    assert ranked.likely_cause.event.kind == "fault_injected", ranked.causes


def test_clearing_near_the_end_is_said_in_words_not_signs() -> None:
    """Said in words ("cleared 0.3 s before the anomaly ended"), never with a sign."""
    (spike,) = latency_spikes(_spiky(range(40, 50)))
    for cleared_at, words in [
        (49.7, "cleared 0.3 s before the anomaly ended"),
        (51.5, "cleared 1.5 s after the anomaly ended"),
        (50.0, "cleared as the anomaly ended"),
    ]:
        events = [
            _fault(39.6, "fault_injected", "worker:m", "f1"),
            _fault(cleared_at, "fault_cleared", "worker:m", "f1"),
        ]
        why = correlate(spike, events).causes[0].why
        assert words in why, why
        assert "-" not in why and "+" not in why


def test_an_injection_cleared_before_the_onset_is_not_the_cause() -> None:
    (spike,) = latency_spikes(_spiky(range(40, 50)))
    events = [
        _fault(10.0, "fault_injected", "worker:m", "f1"),
        _fault(20.0, "fault_cleared", "worker:m", "f1"),
    ]
    ranked = correlate(spike, events)
    assert ranked.likely_cause is None
    assert "cleared 20 s before the onset" in ranked.causes[0].why
    # A later fault on the same target is not ended by f1's clearing.
    events.append(_fault(39.5, "fault_injected", "worker:m", "f3"))
    ranked = correlate(spike, events)
    assert ranked.likely_cause is not None and ranked.likely_cause.event.payload["id"] == "f3"


def test_without_events_there_is_no_likely_cause() -> None:
    (spike,) = latency_spikes(_spiky(range(40, 50)))
    assert correlate(spike, []).likely_cause is None


def test_error_bursts_carry_their_reasons() -> None:
    rows = [
        _row(t, 2.0, errors=20 if 30 <= t < 33 else 0, reason="queue_timeout") for t in range(60)
    ]
    (burst,) = error_bursts(rows)
    assert (burst.start, burst.end) == (30, 33)
    assert burst.detail == {"queue_timeout": 60}
    assert burst.during == 0.4


def test_fragmentation_climb_and_memory_growth() -> None:
    frag = [_res(t, frag=0.05 if t < 50 else 0.05 + (t - 50) * 0.01) for t in range(100)]
    (climb,) = fragmentation_climbs(frag)
    assert climb.peak > 0.5 and climb.baseline == 0.05
    assert fragmentation_climbs([_res(t, frag=0.1) for t in range(100)]) == []
    growing = [_res(t, rss=(100 << 20) + t * (2 << 20)) for t in range(120)]
    (growth,) = memory_growth(growing)
    assert growth.context["bytes_per_hour"] > 0
    assert memory_growth([_res(t) for t in range(120)]) == []


def test_diagnose_recommends_with_numbers_and_honours_focus() -> None:
    rows = _spiky(range(40, 50))
    events = [_fault(39.5, "fault_injected", "worker:m", "f1")]
    window = JournalWindow(0, 100, rows, [_res(t) for t in range(100)], events)
    diagnosis = diagnose(window, focus="all")
    assert [a.kind for a in diagnosis.anomalies] == ["latency_spike"]
    assert any(
        "fault_injected" in r and "a latency fault" in r and "200.0 ms" in r
        for r in diagnosis.recommendations
    )
    assert diagnose(window, focus="memory").anomalies == []


def _steady(requests: int, seconds: int, p99: float | None = 2.0) -> JournalWindow:
    """``seconds`` quiet seconds of ``requests`` each, every one of them over a 1 ms SLO."""
    rows = []
    for t in range(seconds):
        rows.append(SecondRow(
            t=t, model="m", version="1", requests=requests, errors=0, errors_by_reason={},
            p50_ms=p99, p99_ms=p99, queue_ms=0.1, compute_ms=0.5, batches=1, batch_size=1.0,
            queue_depth=0, busy=0.1, slo_met=0,
        ))  # fmt: skip
    slo = JournalEvent(0.0, "model_loaded", "m/1", "", {"slo_p99_ms": 1.0})
    return JournalWindow(0, seconds, rows, [], [slo])


def test_no_slo_recommendation_from_a_handful_of_requests() -> None:
    """One request over its SLO is no evidence; a hundred of them are."""
    few = diagnose(_steady(requests=1, seconds=1)).recommendations
    assert not any("SLO" in r for r in few), few
    many = diagnose(_steady(requests=10, seconds=10)).recommendations
    assert any("answered 0.0% of 100 requests within its 1 ms SLO (target 99%)" in r for r in many)


def test_no_number_is_written_as_n_a_ms() -> None:
    """Without per-second p99s the SLO line leaves the p99 out instead of "n/a ms"."""
    lines = diagnose(_steady(requests=10, seconds=10, p99=None)).recommendations
    (slo,) = [r for r in lines if "SLO" in r]
    assert slo.endswith("within its 1 ms SLO (target 99%).")
    assert not any("n/a" in r for r in lines), lines


def _load_spike() -> JournalWindow:
    """p99 and load rise together in seconds 40-49 (5 → 50 requests/s); no event at all."""
    rows = [
        _row(t, 200.0, requests=50) if 40 <= t < 50 else _row(t, 2.0 + (t % 3) * 0.1, requests=5)
        for t in range(100)
    ]
    return JournalWindow(0, 100, rows, [_res(t) for t in range(100)], [])


def test_a_load_rise_in_the_same_seconds_is_named_as_the_explanation() -> None:
    diagnosis = diagnose(_load_spike())
    assert [a.kind for a in diagnosis.anomalies] == ["latency_spike"]
    text = render_html(diagnosis, [])
    assert "Likely cause: load rose from 5.0 to 50.0 requests/s (10.0×)" in text
    assert "no journaled event explains it." not in text
    assert any("Load rose from 5.0 to 50.0" in r for r in diagnosis.recommendations)


def test_focus_filters_the_same_detection_and_says_what_it_left_out() -> None:
    rows = [
        _row(t, 200.0 if 40 <= t < 50 else 2.0, errors=20 if 40 <= t < 43 else 0)
        for t in range(100)
    ]
    window = JournalWindow(0, 100, rows, [_res(t) for t in range(100)], [])
    everything = diagnose(window, focus="all").anomalies
    for focus, kinds in (("latency_spike", {"latency_spike"}), ("errors", {"error_burst"})):
        focused = diagnose(window, focus=focus)
        assert focused.anomalies == [a for a in everything if a.kind in kinds]
    latency = diagnose(window, focus="latency_spike")
    assert latency.hidden == {"error_burst": 1}
    assert any("--focus all" in r for r in latency.recommendations)
