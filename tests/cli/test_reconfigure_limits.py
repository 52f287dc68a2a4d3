"""``sordino reconfigure`` against a real server: malformed keys, absurd values, and a
change being verified never wedge the calls that follow."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.config import load_config
from sordino.models.repository import builtin_sources
from sordino.testing import RunningServer, serve_in_thread

TOKEN = "reconfigure-limits-token"
MODEL = "digits-classifier"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    config = load_config(None, {"server.admin_token": TOKEN})
    with serve_in_thread(config, [s for s in builtin_sources() if s.name == MODEL]) as running:
        yield running


def _post(server: RunningServer, body: dict[str, Any], timeout: float = 30) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v2/sordino/config", json=body, headers=HEADERS, timeout=timeout
    )


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_a_key_of_ten_thousand_dots_is_a_clear_400(server: RunningServer) -> None:
    for key in ("." * 10_000, "scheduler." + "a." * 5_000 + "b", "scheduler..mode"):
        answer = _post(server, {"set": {key: 1}, "verify_window": 0})
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert "dotted key" in error and len(error) < 400, error
    code, out = _cli(
        "reconfigure", "--url", server.url, "--token", TOKEN, "--set", "." * 10_000 + "=1"
    )
    assert code == 2 and "too long" in out and "Traceback" not in out, out[-300:]
    code, out = _cli(
        "reconfigure", "--url", server.url, "--token", TOKEN,
        "--set", "scheduler.mode=manual", "--verify-window", "100000000000h",
    )  # fmt: skip
    assert code == 2 and "at most" in out and "Traceback" not in out, out[-300:]


def test_a_deeply_nested_overlay_is_a_clear_400(server: RunningServer) -> None:
    overlay = '{"a": ' * 1000 + "{}" + "}" * 1000  # written out: json.dumps would recurse
    answer = httpx.post(
        f"{server.url}/v2/sordino/config",
        content=f'{{"config": {{"scheduler": {overlay}}}, "verify_window": 0}}',
        headers={**HEADERS, "Content-Type": "application/json"},
        timeout=30,
    )
    assert answer.status_code == 400 and "nested more than" in answer.json()["error"]


@pytest.mark.parametrize(
    ("assignment", "needle"),
    [
        ({f"models.{MODEL}.max_batch_size": 10**12}, "less than or equal to 65536"),
        ({f"models.{MODEL}.max_batch_size": True}, "max_batch_size"),
        ({"scheduler.slo_p99_ms": True}, "slo_p99_ms"),
        ({"memory.pool_size": "4KB"}, "at least 65536 bytes"),
        ({"memory.defrag_interval": "1ms"}, "too short"),
        ({"reconfigure.verify_window": 10**100}, "at most 366d"),
        ({"reconfigure.verify_window": "2h"}, "less than or equal to 3600"),
    ],
    ids=["max_batch_huge", "max_batch_bool", "slo_bool", "pool_4k", "defrag_1ms", "window", "2h"],
)
def test_values_out_of_range_are_refused_and_nothing_changes(
    server: RunningServer, assignment: dict[str, Any], needle: str
) -> None:
    before = server.runtime.config
    scheduling = server.runtime.get(MODEL).scheduling
    answer = _post(server, {"set": {"scheduler.mode": "manual", **assignment}})
    assert answer.status_code == 400, answer.text
    assert needle in answer.json()["error"], answer.json()
    assert server.runtime.config == before
    assert server.runtime.get(MODEL).scheduling == scheduling


def test_a_huge_verify_window_is_refused_and_later_changes_still_apply(
    server: RunningServer,
) -> None:
    answer = _post(server, {"set": {"scheduler.mode": "manual"}, "verify_window": 10**100})
    assert answer.status_code == 400 and "verify_window" in answer.json()["error"], answer.text
    applied = _post(server, {"set": {"scheduler.slo_p99_ms": 90}, "verify_window": 0})
    assert applied.status_code == 200 and applied.json()["result"] == "applied", applied.text
    _post(server, {"set": {"scheduler.slo_p99_ms": 100}, "verify_window": 0})


def test_a_change_during_another_ones_verify_window_gets_409_not_a_hang(
    server: RunningServer,
) -> None:
    first: dict[str, Any] = {}

    def slow() -> None:
        first["answer"] = _post(
            server, {"set": {"scheduler.slo_p99_ms": 80}, "verify_window": "3s"}, timeout=60
        )

    thread = threading.Thread(target=slow)
    thread.start()
    try:
        for _ in range(200):  # the first change is applied within moments
            if server.runtime.config.scheduler.slo_p99_ms == 80:
                break
            threading.Event().wait(0.05)
        second = _post(server, {"set": {"scheduler.slo_p99_ms": 70}}, timeout=10)
        assert second.status_code == 409, second.text
        assert "being verified" in second.json()["error"]
        assert int(second.headers["Retry-After"]) >= 1
        dry = _post(server, {"set": {"scheduler.slo_p99_ms": 70}, "dry_run": True}, timeout=10)
        assert dry.status_code == 200 and dry.json()["result"] == "dry_run", dry.text
    finally:
        thread.join(60)
    assert not thread.is_alive()
    assert first["answer"].status_code == 200, first["answer"].text
    third = _post(server, {"set": {"scheduler.slo_p99_ms": 100}, "verify_window": 0})
    assert third.status_code == 200 and third.json()["result"] == "applied", third.text
