"""The telemetry snapshot's ``workers`` object: what monitor and the dashboard show."""

from __future__ import annotations

import re
import threading
from typing import Any

import httpx
from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.config import RuntimeConfig
from sordino.control.client import AdminClient
from sordino.records import ExecutionStatistics, InstanceState, WorkerStatistics
from sordino.telemetry.snapshot import workers_summary
from sordino.testing import serve_in_thread
from tests.execution.load import BODY, digits
from tests.waiting import wait_for

TOKEN = "test-admin-token"


def _worker(index: int, state: InstanceState, busy: bool) -> WorkerStatistics:
    return WorkerStatistics(
        model="m", version="1", index=index, tier="cpu", device="cpu", isolation="process",
        state=state, busy=busy, pid=100 + index, restarts=0, batches=0, failures=0,
        last_cause="", profiling=False,
    )  # fmt: skip


def test_summary_counts_instances_by_what_they_do() -> None:
    workers = (
        _worker(0, "ready", True),
        _worker(1, "ready", False),
        _worker(2, "restarting", False),
    )
    execution = ExecutionStatistics(
        workers=workers, devices=(), switches=(), retries=0, arena=None, faults_active=0,
        faults_applied=0,
    )  # fmt: skip
    summary = workers_summary(execution)
    assert (summary["instances"], summary["busy"]) == (3, 1)
    assert (summary["serving"], summary["restarting"]) == (2, 1)
    assert [w["index"] for w in summary["workers"]] == [0, 1, 2]  # the full statistics stay
    assert workers_summary(None) == {}


def test_busy_mean_counts_instances_by_their_share_of_time_computing() -> None:
    workers = tuple(_worker(i, "ready", False) for i in range(5))
    execution = ExecutionStatistics(
        workers=workers, devices=(), switches=(), retries=0, arena=None, faults_active=0,
        faults_applied=0,
    )  # fmt: skip
    # 5 instances of m:1 each computing 28 % of the time: 1.4 busy on average, none now.
    summary = workers_summary(execution, {("m", "1"): 0.28, ("other", "1"): 1.0})
    assert (summary["busy"], summary["busy_mean"]) == (0, 1.4)
    assert workers_summary(execution)["busy_mean"] == 0.0


def _workers(url: str) -> dict[str, Any]:
    snap: dict[str, Any] = httpx.get(f"{url}/v2/sordino/telemetry?seconds=5").json()
    return snap["workers"]


def test_busy_workers_show_while_a_batch_is_held() -> None:
    """A latency fault holds batches: the snapshot and `sordino monitor` count them busy."""
    config = RuntimeConfig.model_validate({"server": {"admin_token": TOKEN}})
    with serve_in_thread(config, digits(instance_count=2)) as server:
        idle = _workers(server.url)
        assert (idle["instances"], idle["busy"], idle["serving"]) == (2, 0, 2)
        admin = AdminClient(server.url, TOKEN)
        admin.inject("worker:digits-classifier", "latency", latency="1s")
        stop = threading.Event()
        statuses: list[int] = []

        def client() -> None:
            with httpx.Client(timeout=60) as http:
                while not stop.is_set():
                    url = f"{server.url}/v2/models/digits-classifier/infer"
                    statuses.append(http.post(url, json=BODY).status_code)

        thread = threading.Thread(target=client)
        thread.start()
        outputs: list[str] = []

        def monitor_shows_busy() -> bool:
            result = CliRunner().invoke(
                cli, ["monitor", "--url", server.url, "--once", "--metrics", "qps"]
            )
            assert result.exit_code == 0, result.output
            outputs.append(result.output)
            shown = re.search(r"workers (\d+\.\d)/2 busy", result.output)
            return shown is not None and float(shown.group(1)) > 0

        try:
            wait_for(lambda: _workers(server.url)["busy"] == 1, "a worker held by the fault")
            wait_for(monitor_shows_busy, "sordino monitor to show the busy worker")
        finally:
            admin.clear()
            stop.set()
            thread.join(60)
        assert "workers 0/0 busy" not in "".join(outputs)
        assert statuses and set(statuses) == {200}
        wait_for(lambda: _workers(server.url)["busy"] == 0, "the workers to be idle again")
