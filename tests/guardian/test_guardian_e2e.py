"""The guardian on a real server with real faults from the chaos API.

Windows are seconds long and every bound on real time is generous: each test waits
for the state it needs (tests/waiting.py), never for a length of time.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from sordino.config import RuntimeConfig
from sordino.control.client import AdminClient
from sordino.telemetry.journal_reader import JournalReader
from sordino.testing import Fragmentation, RunningServer, fragment_arena, serve_in_thread
from tests.execution.load import BODY, Load, digits, events
from tests.waiting import wait_for
from tests.webhook import receiving

TOKEN = "guardian-test-token"
INFER = "/v2/models/digits-classifier/infer"


def _config(*triggers: dict[str, Any], **healing: Any) -> RuntimeConfig:
    return RuntimeConfig.model_validate(
        {
            "server": {"admin_token": TOKEN},
            "self_healing": {
                "enabled": True,
                "triggers": list(triggers),
                "recovery": {"warmup_requests": 2, "ramp_step": "0.3s"},
                **healing,
            },
        }
    )


def _records(server: RunningServer) -> list[dict[str, Any]]:
    """The verdicts and reverts (each action's first record, at action time, left out)."""
    return [e.payload for e in events(server, "guardian") if e.payload["phase"] != "acted"]


def _dead_url() -> str:
    """A loopback URL nobody listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


def test_error_fault_restarts_the_worst_worker_and_alerts_slack(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """error at rate 0.5 on the only instance → restart_worker of it within 3 s of the
    window; no error after it; one record, journaled, also delivered to Slack. (With two
    instances, outlier ejection keeps clients from seeing the errors at all:
    tests/execution/test_outliers.py.)"""
    with receiving() as slack:
        monkeypatch.setenv("SORDINO_SLACK_WEBHOOK", slack.url)
        trigger = {
            "metric": "error_rate",
            "model": "digits-classifier",
            "threshold": "5%",
            "window": "2s",
            "action": "restart_worker",
        }
        config = _config(trigger, alert_channels=["slack:#runtime-guard"])
        with serve_in_thread(config, digits(), data_dir=tmp_path) as server:
            admin = AdminClient(server.url, TOKEN)
            with Load(server.url, clients=4) as load:
                load.wait_ok(30)
                injected = time.time()
                admin.inject("worker:digits-classifier/0", "error", rate=0.5)
                wait_for(lambda: _records(server), "the guardian's record", 60)
                errors_after = len(load.errors)
                load.wait_ok(100)
            (record,) = _records(server)
            assert record["action"] == "restart_worker" and record["verify"] == "cleared"
            assert record["parameters"] == {"model": "digits-classifier", "instance": 0}
            assert record["started"] - (injected + 2.0) < 3.0 + 4.0  # generous: a loaded 2-core CI
            assert "restarted instance 0" in record["explanation"]
            assert len(load.errors) == errors_after  # error rate back to 0
            assert admin.faults() == []  # the sick process (and its fault) is gone
            restarted = events(server, "worker_restarted")
            assert [e.subject for e in restarted] == ["digits-classifier/0"]
            wait_for(lambda: len(slack.bodies) >= 2, "the Slack webhook to receive both", 30)
            journal = tmp_path / config.telemetry.journal_file

            def journaled() -> list[Any]:
                with JournalReader(journal) as reader:
                    return reader.latest_events("guardian", time.time() + 1)

            wait_for(lambda: len(journaled()) >= 2, "the records in the journal", 30)
            acted, kept = journaled()  # the action as it happened, then its verdict
            assert (acted.payload["phase"], kept.payload["phase"]) == ("acted", "verdict")
            assert acted.payload["action_id"] == kept.payload["action_id"]
            assert kept.payload["explanation"] == record["explanation"]
            assert {"trigger", "observed", "action", "parameters", "started", "ended",
                    "verify", "rolled_back"} <= set(kept.payload)  # fmt: skip
        first, message = slack.bodies
        assert message["channel"] == first["channel"] == "#runtime-guard"
        assert "restarted instance 0" in first["text"]
        assert record["explanation"] in message["text"]


def test_temperature_throttles_low_priority_by_20_percent_then_lifts_it() -> None:
    """An injected 90 °C → throttle_requests_by 20%: low priority loses 1 in 5, high none;
    once the reading is back and stays so for the cooldown, the throttle is lifted."""
    trigger = {
        "metric": "device_temperature",
        "threshold": "80°C",
        "window": "2s",
        "cooldown": "3s",
        "action": "throttle_requests_by 20%",
    }
    with serve_in_thread(_config(trigger), digits()) as server:
        admin = AdminClient(server.url, TOKEN)
        gate = server.runtime.gate
        admin.inject("device:cpu", "temperature", celsius=90)
        wait_for(lambda: gate.throttling(None) > 0, "the throttle", 60)
        admin.clear()
        assert gate.throttling(None) == pytest.approx(0.2)
        with httpx.Client(base_url=server.url, timeout=30) as client:
            low = [
                client.post(INFER, json={**BODY, "parameters": {"priority": "low"}}).status_code
                for _ in range(50)
            ]
            high = [
                client.post(INFER, json={**BODY, "parameters": {"priority": "high"}}).status_code
                for _ in range(50)
            ]
        assert low.count(503) == 10 and low.count(200) == 40
        assert high.count(200) == 50
        wait_for(lambda: gate.throttling(None) == 0, "the throttle to be lifted", 60)
        first, lifted = _records(server)
        assert first["action"] == "throttle_requests_by 20%" and first["observed"][0] == 90
        assert lifted["reverted"] is True and "lifted the 20% throttle" in lifted["explanation"]


def test_surge_scales_up_and_drop_alerts_while_a_dead_channel_changes_nothing() -> None:
    """A surge of traffic → scale_workers +2 (1 → 3 instances); the drop after it → alert;
    the webhook channel is dead all along and no client notices."""
    triggers = (
        {
            "metric": "qps",
            "model": "digits-classifier",
            "threshold": "sudden_rise>300% in 2s",
            "cooldown": "30s",
            "action": "scale_workers +2",
        },
        {
            "metric": "qps",
            "model": "digits-classifier",
            "threshold": "sudden_drop>40% in 2s",
            "cooldown": "30s",
            "action": "alert",
        },
    )
    config = _config(*triggers, alert_channels=[f"webhook:{_dead_url()}"])
    with serve_in_thread(config, digits()) as server:
        executor = server.runtime.executor
        key = server.runtime.get("digits-classifier").key
        stop = threading.Event()

        def paced() -> None:  # about 20 requests a second: the baseline
            with httpx.Client(base_url=server.url, timeout=30) as client:
                while not stop.is_set():
                    assert client.post(INFER, json=BODY).status_code == 200
                    time.sleep(0.05)

        baseline = threading.Thread(target=paced)
        baseline.start()
        try:
            time.sleep(5)  # load shape: five seconds of baseline before the surge
            with Load(server.url, clients=4) as load:
                wait_for(lambda: executor.instances(key) == 3, "the scale-up to 3 instances", 60)
                load.wait_ok(50)
            assert load.errors == []
        finally:
            stop.set()
            baseline.join(30)
        # Each action's verdict comes after its own verify window: the scale-up's (its
        # instances ramped in first) may come after the drop alert's.
        wait_for(
            lambda: {"alert", "scale_workers +2"} <= {r["action"] for r in _records(server)},
            "the drop alert and the scale-up's verdict",
            60,
        )
        scaled = next(r for r in _records(server) if r["action"] == "scale_workers +2")
        assert scaled["parameters"] == {"model": "digits-classifier", "before": 1, "after": 3}
        wait_for(
            lambda: (
                server.runtime.guardian is not None
                and server.runtime.guardian.statistics().alerts_failed >= 1
            ),
            "a delivery to the dead channel to fail",
            60,
        )
        assert events(server, "recovery_done")  # the new instances were ramped in


def test_a_change_that_makes_p99_worse_is_rolled_back() -> None:
    """Errors → throttle; then latency makes p99 far worse → the throttle is rolled back."""
    trigger = {
        "metric": "error_rate",
        "threshold": "5%",
        "window": "2s",
        "verify_window": "3s",
        "cooldown": "60s",
        "action": "throttle_requests_by 20%",
    }
    with serve_in_thread(_config(trigger), digits()) as server:
        admin = AdminClient(server.url, TOKEN)
        gate = server.runtime.gate
        with Load(server.url, clients=3) as load:
            load.wait_ok(30)
            admin.inject("worker:digits-classifier", "error", rate=0.5)
            wait_for(lambda: gate.throttling(None) > 0, "the throttle", 60)
            admin.clear()
            admin.inject("worker:digits-classifier", "latency", latency="150ms")
            wait_for(lambda: _records(server), "the verdict", 60)
            admin.clear()
        (record,) = _records(server)
        assert record["verify"] == "worse" and record["rolled_back"] is True
        assert "p99 latency went from" in record["explanation"]
        assert gate.throttling(None) == 0


def test_deep_health_names_the_failing_model() -> None:
    """/health?deep=true runs a real inference per model: 503 naming the one that fails."""
    config = RuntimeConfig.model_validate({"server": {"admin_token": TOKEN}})
    with serve_in_thread(config, digits()) as server:
        admin = AdminClient(server.url, TOKEN)
        assert httpx.get(server.url + "/health?deep=true").status_code == 200
        admin.inject("worker:digits-classifier", "error", rate=1.0)
        for path in ("/health?deep=true", "/v2/health/ready?deep=true"):
            response = httpx.get(server.url + path, timeout=30)
            assert response.status_code == 503
            assert list(response.json()["failing"]) == ["digits-classifier/1"]
        assert httpx.get(server.url + "/v2/health/ready").status_code == 200
        admin.clear()
        assert httpx.get(server.url + "/health?deep=true").status_code == 200


def test_slow_primary_device_is_switched_away_from() -> None:
    """A latency fault on the primary device → p99 over 50 ms → switch_device: its breaker
    opens and the batches run on the fallback device."""
    config = RuntimeConfig.model_validate(
        {
            "server": {"admin_token": TOKEN},
            "devices": [
                {"name": "cpu_fast", "provider": "cpu", "intra_op_threads": 1},
                {"name": "cpu_wide", "provider": "cpu", "intra_op_threads": 1},
            ],
            "scheduler": {"strategies": [{
                "name": "fallback_chain", "primary": "cpu_fast", "fallbacks": ["cpu_wide"],
                "switch_threshold": "error_rate>50% for 30s", "cooldown": "60s"}]},
            "self_healing": {"enabled": True, "triggers": [{
                "metric": "p99_latency", "threshold": "50ms", "window": "2s",
                "cooldown": "60s", "action": "switch_device"}]},
        }
    )  # fmt: skip
    with serve_in_thread(config, digits()) as server:
        admin = AdminClient(server.url, TOKEN)

        def on(device: str) -> int:
            workers = server.runtime.executor.statistics().workers
            return sum(w.batches for w in workers if w.device == device)

        with Load(server.url, clients=2) as load:
            load.wait_ok(20)
            admin.inject("device:cpu_fast", "latency", latency="100ms")
            wait_for(lambda: server.runtime.guardian is not None
                     and server.runtime.guardian.statistics().triggers[0].fired,
                     "the switch", 60)  # fmt: skip
            before = on("cpu_wide")
            load.wait_ok(30)
            assert on("cpu_wide") >= before + 20
        assert load.errors == []
        (opened,) = events(server, "breaker_open")
        assert opened.subject == "device:cpu_fast" and opened.cause.startswith("guardian:")
        wait_for(lambda: _records(server), "the record", 30)
        assert _records(server)[0]["parameters"] == {
            "model": "digits-classifier",
            "from_device": "cpu_fast",
            "to_device": "cpu_wide",
        }


def test_ready_is_false_while_no_instance_can_serve() -> None:
    """A crashed worker waiting out its restart backoff: /v2/health/ready answers 503
    naming nothing served, and 200 again once the worker is back."""
    config = RuntimeConfig.model_validate(
        {"server": {"admin_token": TOKEN}, "workers": {"restart_backoff": "3s"}}
    )
    with serve_in_thread(config, digits()) as server:
        admin = AdminClient(server.url, TOKEN)
        admin.inject("worker:digits-classifier", "crash", rate=1.0)

        def send() -> None:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                client.post(INFER, json=BODY)

        sender = threading.Thread(target=send)
        sender.start()
        wait_for(
            lambda: httpx.get(server.url + "/v2/health/ready").status_code == 503,
            "ready to turn false while the only worker restarts",
            30,
        )
        body = httpx.get(server.url + "/health").json()
        assert body["failing"] == {"digits-classifier/1": body["reason"]}
        admin.clear()
        wait_for(
            lambda: httpx.get(server.url + "/v2/health/ready").status_code == 200,
            "ready again once the worker serves",
            60,
        )
        sender.join(60)


def test_fragmentation_drives_defrag_through_the_runtime() -> None:
    """The real memory manager's arena fragmented past 65 % → trigger_defrag → a real
    defragmentation by the runtime's manager; the record has before and after."""
    trigger = {
        "metric": "memory_fragmentation",
        "threshold": "65%",
        "window": "2s",
        "action": "trigger_defrag",
    }
    with serve_in_thread(_config(trigger), digits()) as server:
        runtime = server.runtime

        async def fragment() -> Fragmentation:
            return fragment_arena(runtime, 0.7)

        held = server.call(fragment())
        assert isinstance(held, Fragmentation) and held.fragmentation >= 0.7
        try:
            wait_for(lambda: _records(server), "the defrag record", 60)
            (record,) = _records(server)
            statistics = runtime.memory.statistics()
        finally:
            server.call(_release(held))
    assert record["action"] == "trigger_defrag" and record["verify"] == "cleared"
    assert record["parameters"]["fragmentation_before"] >= 0.65
    assert record["parameters"]["fragmentation_after"] < 0.65
    assert record["parameters"]["bytes_moved"] > 0
    assert "fragmentation" in record["explanation"]
    assert (
        statistics.last_defrag is not None
        and "memory_fragmentation" in statistics.last_defrag.reason
    )


async def _release(held: Fragmentation) -> None:
    held.release()
