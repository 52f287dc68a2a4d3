"""Findings and suggestions from measured numbers (a result built by hand, no server)."""

from __future__ import annotations

from pathlib import Path

from sordino.config import load_config
from sordino.loadtest.findings import apply_suggestions, client_warnings, findings, suggestions
from sordino.loadtest.profiles import Profile, Segment
from sordino.loadtest.results import Recorder, parse_conditions
from sordino.loadtest.run import StressResult, judge
from sordino.loadtest.sender import SendStatistics
from sordino.loadtest.server_metrics import ServerSample, parse_metrics


def _result(samples: list[ServerSample], *, sent: int = 1000, lag_s: float = 0.001) -> StressResult:
    profile = Profile(segments=(Segment(duration=10, rate=100),))
    recorder = Recorder(window_s=1.0, windows=10)
    for i in range(sent):
        t = i / 100
        recorder.record_send(t, lag_s)
        latency = 0.004 if t < 6 else 0.4  # the knee: from 6 s on
        recorder.record(t, latency, "ok" if i % 100 else "503", [("class", "default")])
    send = SendStatistics(started_at=0.0, elapsed_s=10.0, scheduled=1000, sent=sent,
                          answered=sent, in_flight_cap=256, max_in_flight=40,
                          last_send_s=9.99)  # fmt: skip
    result = StressResult(
        url="http://x", profile=profile, window_s=1.0, intended_rate=[100.0] * 10,
        sent_rate=[n / 1.0 for n in recorder.sent], windows=recorder.window_summaries(),
        window_errors=[dict(c) for c in recorder.window_errors], total=recorder.summary(),
        groups={}, errors=dict(recorder.errors), lag_p99_ms=lag_s * 1000, lag_max_ms=lag_s * 1000,
        send=send, server=samples, server_observed=bool(samples),
    )  # fmt: skip
    result.slos = judge(recorder, parse_conditions("p99<250ms", option="--slo", op="<"))
    return result


def _sample(t: float, **values: float) -> ServerSample:
    return ServerSample(t=t, **values)  # type: ignore[arg-type]


def test_findings_say_what_happened_with_numbers() -> None:
    samples = [
        _sample(0, queue_depth=0, batches=0, batch_rows=0, max_batch=32, fragmentation=0.2,
                pool_in_use_bytes=100 * 2**20, pool_reserved_bytes=256 * 2**20),
        _sample(10, queue_depth=180, batches=100, batch_rows=3100, max_batch=32,
                fragmentation=0.68, pool_in_use_bytes=230 * 2**20,
                pool_reserved_bytes=256 * 2**20),
    ]  # fmt: skip
    result = _result(samples)
    text = "\n".join(findings(result))
    assert "p99 rose from 4.0 ms (typical) to 400" in text and "at 00:06" in text
    assert "Memory fragmentation rose to 68% under load (threshold 70%)" in text
    assert "Queue depth peaked at 180" in text and "31.0 rows on average (cap 32)" in text
    assert "10 requests failed (1.00%; 503: 10)" in text
    assert "SLO p99<250ms: p99 was 400" in text and "missed" in text
    suggested = {s.key: s for s in suggestions(result)}
    assert suggested["scheduler.strategies.dynamic_batching.max_batch"].value == 64
    assert (
        "while up to 180 requests waited"
        in suggested["scheduler.strategies.dynamic_batching.max_batch"].why
    )
    assert suggested["memory.pool_size"].value == "512MB"
    assert suggested["memory.strategy"].value == "fragmentation_aware"
    assert "fragmentation reached 68% under load" in suggested["memory.defrag_interval"].why
    assert suggested["memory.defrag_threshold"].value == 0.3
    assert suggested["scheduler.slo_p99_ms"].value == 250.0
    assert "server.max_connections" in suggested
    assert client_warnings(result) == []


def test_suggestions_applied_load_as_a_configuration(tmp_path: Path) -> None:
    result = _result([
        _sample(0, queue_depth=0, batches=0, batch_rows=0, max_batch=32),
        _sample(10, queue_depth=99, batches=10, batch_rows=320, max_batch=32),
    ])  # fmt: skip
    path = tmp_path / "new.yaml"
    apply_suggestions(path, suggestions(result))
    config = load_config(path)
    (batching,) = config.scheduler.strategies
    assert batching.max_batch == 64  # type: ignore[union-attr]
    assert "# stress-test suggested scheduler.strategies" in path.read_text()


def test_a_late_client_is_named_as_the_bottleneck() -> None:
    result = _result([], sent=900, lag_s=0.2)
    warnings = "\n".join(client_warnings(result))
    assert "could not keep the schedule" in warnings  # 900 of 1000 sent
    assert "left up to 200 ms late" in warnings
    assert "was not observed" in "\n".join(findings(result))


def test_metrics_parsing_tolerates_missing_series() -> None:
    text = (
        "# TYPE sordino_queue_depth gauge\n"
        'sordino_queue_depth{model="a",version="1"} 3\n'
        'sordino_queue_depth{model="b",version="1"} 4\n'
        "# TYPE sordino_guardian_actions counter\n"
        'sordino_guardian_actions_total{action="defragment"} 2\n'
    )
    sample = parse_metrics(text, 1.0)
    assert sample is not None and sample.queue_depth == 7 and sample.guardian_actions == 2
    assert sample.fragmentation is None and sample.worker_restarts is None
    assert parse_metrics("# TYPE other gauge\nother 1\n", 1.0) is None


def test_a_looser_slo_never_loosens_the_servers_own_target() -> None:
    """--slo p99<500ms against a server whose target is 100 ms suggests nothing, and says so."""
    samples = [_sample(0, slo_target_s=0.1), _sample(10, slo_target_s=0.1)]
    result = _result(samples)
    result.slos = judge(
        Recorder(1.0, 10), parse_conditions("premium:p99<500ms", option="--slo", op="<")
    )
    assert "scheduler.slo_p99_ms" not in {s.key for s in suggestions(result)}
    assert "looser than the server's own (100 ms" in "\n".join(findings(result))
    result.slos = judge(Recorder(1.0, 10), parse_conditions("p99<50ms", option="--slo", op="<"))
    (tighter,) = [s for s in suggestions(result) if s.key == "scheduler.slo_p99_ms"]
    assert tighter.value == 50.0
