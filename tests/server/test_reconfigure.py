"""Hot reconfiguration against a real server: live changes, refusals, verify and rollback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.config import load_config
from sordino.control.client import ClientError, request_json
from sordino.models.repository import builtin_sources
from sordino.testing import RunningServer, serve_in_thread
from tests.waiting import wait_for

TOKEN = "reconfigure-test-token"
MODEL = "digits-classifier"
BODY = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}


@contextmanager
def _server() -> Iterator[RunningServer]:
    config = load_config(None, {"server.admin_token": TOKEN})
    digits = [s for s in builtin_sources() if s.name == MODEL]
    with serve_in_thread(config, digits) as server:
        yield server


class Load:
    """``clients`` threads sending one request after another; every answer is recorded."""

    def __init__(self, server: RunningServer, clients: int) -> None:
        self.url = f"{server.url}/v2/models/{MODEL}/infer"
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run) for _ in range(clients)]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                request_json("POST", self.url, BODY, timeout=30)
                self.ok += 1
            except ClientError as exc:
                self.failures.append(str(exc))

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def _traffic_for(server: RunningServer, seconds: int) -> None:
    """Wait until ``seconds`` closed seconds of the model's series had requests."""

    def enough() -> bool:
        rows = [r for rows in server.runtime.telemetry.series.recent().values() for r in rows]
        return sum(1 for row in rows if row.requests) >= seconds

    wait_for(enough, f"{seconds} seconds of traffic in the series", timeout=60)


def test_reconfigure_under_load_drops_nothing() -> None:
    """Mode, batch cap and queue limit change live while 4 clients send; none fails."""
    with _server() as server, Load(server, clients=4) as load:
        wait_for(lambda: load.ok > 50, "the load to get going")
        code, out = _cli(
            "reconfigure", "--url", server.url, "--token", TOKEN,
            "--set", "scheduler.mode=conservative",
            "--set", f"models.{MODEL}.max_batch=16",
            "--set", f"models.{MODEL}.dynamic_batching.default_queue_policy.max_queue_size=512",
            "--verify-window", "1s", "--no-rollback",
        )  # fmt: skip
        assert code == 0, out
        assert "scheduler.mode: 'adaptive' -> 'conservative'  (live)" in out
        model = server.runtime.get(MODEL)
        assert model.scheduling.mode == "conservative"
        assert model.scheduling.max_batch_size == 16
        assert model.scheduler.statistics().controller.mode == "conservative"
        before = load.ok
        wait_for(lambda: load.ok > before + 50, "requests to keep being served")
    assert load.failures == []
    code, out = _cli("config", "show", "--url", server.url, "--token", TOKEN)
    # The server has stopped: the command says so instead of a traceback.
    assert code == 1 and "cannot reach" in out and "Traceback" not in out


def test_a_worse_change_is_rolled_back() -> None:
    """Making every request wait 1 s for a batch of 8 raises p99: the change comes back."""
    with _server() as server, Load(server, clients=2) as load:
        _traffic_for(server, 3)
        before = server.runtime.get(MODEL).scheduling
        prefix = f"models.{MODEL}"
        code, out = _cli(
            "reconfigure", "--url", server.url, "--token", TOKEN,
            "--set", f"{prefix}.scheduler_mode=manual",
            "--set", f"{prefix}.dynamic_batching.min_batch_size=8",
            "--set", f"{prefix}.dynamic_batching.max_queue_delay_microseconds=1000000",
            "--verify-window", "3s",
        )  # fmt: skip
        assert code == 1, out
        assert "rolled_back: worse:" in out and "p99" in out
        assert server.runtime.get(MODEL).scheduling == before
        code, out = _cli("config", "history", "--url", server.url, "--token", TOKEN)
        assert code == 0 and "#1 " in out and "rolled_back" in out, out
        calls = [e for e in server.runtime.events.recent("admin_call") if e.subject == "config"]
        assert calls and calls[-1].payload["outcome"].startswith("rolled_back")
    assert load.failures == []


def test_keys_that_need_a_restart_are_named_and_nothing_changes() -> None:
    with _server() as server:
        code, out = _cli(
            "reconfigure", "--url", server.url, "--token", TOKEN,
            "--set", "memory.strategy=simple", "--set", "server.http_port=9999",
            "--set", "scheduler.mode=manual",
        )  # fmt: skip
        assert code == 1
        assert "memory.strategy" in out and "server.http_port" in out
        assert "scheduler.mode" not in out.split("cannot change")[1]
        assert server.runtime.config.scheduler.mode == "adaptive"
        code, out = _cli(
            "reconfigure", "--url", server.url, "--token", TOKEN,
            "--set", "scheduler.mode=manual", "--set", "memory.strategy=simple", "--dry-run",
        )  # fmt: skip
        assert code == 0, out
        assert "scheduler.mode: 'adaptive' -> 'manual'  (live)" in out
        assert "memory.strategy: 'best_fit' -> 'simple'  (needs a restart" in out
        assert "dry_run" in out and server.runtime.config.scheduler.mode == "adaptive"


def test_bad_values_get_the_start_up_message() -> None:
    with _server() as server:
        code, out = _cli(
            "reconfigure", "--url", server.url, "--token", TOKEN, "--set", "scheduler.mode=fast"
        )
        assert code == 1 and "scheduler.mode" in out and "conservative" in out, out
        code, out = _cli(
            "reconfigure", "--url", server.url, "--token", TOKEN,
            "--set", f"models.{MODEL}.max_batch_size=-1",
        )  # fmt: skip
        assert code == 1 and f"models.{MODEL}.max_batch_size" in out, out
        code, out = _cli(
            "reconfigure", "--url", server.url, "--token", TOKEN, "--set", "models.nope.x=1"
        )
        assert code == 1 and "no model 'nope' is served" in out, out
        code, out = _cli("reconfigure", "--url", server.url, "--set", "scheduler.mode=manual")
        assert code == 1 and "admin token" in out and "Traceback" not in out


def test_file_change_and_config_show(tmp_path: Path) -> None:
    change = tmp_path / "change.yaml"
    change.write_text(
        "memory:\n  defrag_interval: 3m\n"
        "scheduler:\n  strategies:\n    - {name: dynamic_batching, max_batch: 8}\n"
    )
    with _server() as server:
        code, out = _cli(
            "reconfigure", "--url", server.url, "--token", TOKEN, "--file", str(change),
            "--verify-window", "0s",
        )  # fmt: skip
        assert code == 0, out
        assert "memory.defrag_interval: 0.0 -> 180.0  (live)" in out
        assert server.runtime.memory.config.defrag_interval == 180.0
        assert server.runtime.get(MODEL).scheduling.policy.max_batch <= 8
        code, out = _cli("config", "show", "--url", server.url, "--token", TOKEN)
        assert code == 0 and "defrag_interval: 180.0" in out and f"{MODEL}:" in out, out
        assert TOKEN not in out and "<hidden>" in out


def test_the_memory_pool_is_resized_live_without_dropping_a_request() -> None:
    """The brief's `reconfigure --memory-pool-size` without a restart: the arena's segment
    is replaced at a quiet moment while clients keep sending; none of them notices."""
    with _server() as server, Load(server, clients=4) as load:
        wait_for(lambda: load.ok > 20, "traffic before the change", 30)
        code, out = _cli(
            "reconfigure", "--url", server.url, "--token", TOKEN,
            "--memory-pool-size", "64MB", "--verify-window", "0s",
        )  # fmt: skip
        assert code == 0, out
        arena = server.runtime.memory.owner.existing()
        assert arena is not None and arena.capacity == 64 * 2**20
        resized = [e for e in server.runtime.events.recent("memory") if e.subject == "resize"]
        assert resized and resized[-1].payload["reason"] == "reconfigure"
        served = load.ok
        wait_for(lambda: load.ok > served + 20, "traffic after the change", 30)
        code, out = _cli(
            "reconfigure", "--url", server.url, "--token", TOKEN, "--set", "memory.pool_size=auto"
        )
        assert code == 1 and "switching to or from 'auto' needs a restart" in out, out
    assert load.failures == []
