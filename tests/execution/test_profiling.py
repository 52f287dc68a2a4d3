"""Operator profiling of models in worker processes (the default isolation).

One server serves every test here: the digits classifier in two worker processes
and the text normalizer (string outputs: every batch makes an ``alloc`` round trip
with the server) in one. Tests that kill workers wait for them to serve again first.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from sordino.config import RuntimeConfig
from sordino.execution.profiling import SYNTHETIC_BATCHES
from sordino.models.repository import builtin_sources
from sordino.telemetry.profile_data import OperatorProfile
from sordino.testing import RunningServer, serve_in_thread
from tests.execution.load import Load, digits, wait_until, worker

TEXT = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["  Hi  "]}]}


@pytest.fixture(scope="module")
def served() -> Iterator[RunningServer]:
    config = RuntimeConfig.model_validate(
        {"workers": {"heartbeat_timeout": "3s", "restart_backoff": "0.2s"}}
    )
    text = next(s for s in builtin_sources() if s.name == "text-normalizer")
    with serve_in_thread(config, [*digits(instance_count=2), text]) as server:
        yield server


def _profile(url: str, model: str, seconds: float) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=120) as client:
        return client.post("/v2/sordino/profile", json={"model": model, "seconds": seconds})


def _both_serving(server: RunningServer) -> None:
    wait_until(
        lambda: all(worker(server, i).state == "ready" for i in (0, 1)),  # type: ignore[attr-defined]
        60,
        "both digits workers to serve",
    )


def _ops(profile: OperatorProfile) -> set[str]:
    return {op.op for op in profile.operators}


def test_live_traffic_in_worker_processes_is_profiled(served: RunningServer) -> None:
    """Live batches in both workers are profiled; the workers serve normally after."""
    with Load(served.url, clients=4) as load:
        load.wait_ok(20)
        response = _profile(served.url, "digits-classifier", 1.0)
        load.wait_ok(10)
    assert load.errors == []
    assert response.status_code == 200, response.text
    profile = OperatorProfile.from_json(response.json())
    assert not profile.synthetic and profile.batches > 0 and profile.lost == ()
    assert "Gemm" in _ops(profile) and profile.total_ms > 0
    workers = [worker(served, i) for i in (0, 1)]
    assert not any(w.profiling for w in workers)  # type: ignore[attr-defined]


def test_profiling_waits_for_a_batchs_output_allocation(served: RunningServer) -> None:
    """String outputs need an ``alloc`` round trip per batch; profiling never breaks it."""
    stop = threading.Event()
    failures: list[str] = []
    done = [0]

    def client() -> None:
        with httpx.Client(base_url=served.url, timeout=60) as c:
            while not stop.is_set():
                r = c.post("/v2/models/text-normalizer/infer", json=TEXT)
                if r.status_code != 200:
                    failures.append(r.text)
                done[0] += 1

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: done[0] >= 20, 60, "text-normalizer traffic")
        response = _profile(served.url, "text-normalizer", 0.5)
        seen = done[0]
        wait_until(lambda: done[0] >= seen + 20, 60, "traffic after profiling")
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert failures == []
    assert response.status_code == 200, response.text
    profile = OperatorProfile.from_json(response.json())
    assert not profile.synthetic and profile.batches > 0 and profile.operators


def test_without_traffic_zero_filled_batches_are_profiled(served: RunningServer) -> None:
    _both_serving(served)
    response = _profile(served.url, "digits-classifier", 0.2)
    assert response.status_code == 200, response.text
    profile = OperatorProfile.from_json(response.json())
    assert profile.synthetic and profile.batches == SYNTHETIC_BATCHES
    assert "Gemm" in _ops(profile)


def test_one_profiling_window_at_a_time_per_model(served: RunningServer) -> None:
    _both_serving(served)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(_profile, served.url, "digits-classifier", 1.0)
        wait_until(
            lambda: all(worker(served, i).profiling for i in (0, 1)),  # type: ignore[attr-defined]
            30,
            "both workers to profile",
        )
        second = _profile(served.url, "digits-classifier", 0.2)
        assert first.result(timeout=60).status_code == 200
    assert second.status_code == 503
    assert "is being profiled already" in second.json()["error"]


def _kill_mid_profile(server: RunningServer, indexes: tuple[int, ...]) -> httpx.Response:
    """Profile for 3 s with no traffic; SIGKILL the workers ``indexes`` once both profile."""
    _both_serving(server)
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(_profile, server.url, "digits-classifier", 3.0)
        wait_until(
            lambda: all(worker(server, i).profiling for i in (0, 1)),  # type: ignore[attr-defined]
            30,
            "both workers to profile",
        )
        for index in indexes:
            os.kill(worker(server, index).pid, signal.SIGKILL)  # type: ignore[attr-defined]
        response: Any = future.result(timeout=60)
    return response  # type: ignore[no-any-return]


def test_a_worker_killed_mid_profile_leaves_the_others_profile(served: RunningServer) -> None:
    response = _kill_mid_profile(served, (0,))
    assert response.status_code == 200, response.text
    profile = OperatorProfile.from_json(response.json())
    assert profile.lost == ("digits-classifier/0: killed by SIGKILL",)
    # No live traffic: the zero-filled batches ran on the worker still profiling.
    assert profile.synthetic and profile.batches == SYNTHETIC_BATCHES
    assert "Gemm" in _ops(profile)


def test_every_worker_killed_mid_profile_is_a_clear_error(served: RunningServer) -> None:
    response = _kill_mid_profile(served, (0, 1))
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert "could not profile model digits-classifier/1" in error
    assert "digits-classifier/0: killed by SIGKILL" in error
    assert "digits-classifier/1: killed by SIGKILL" in error
    _both_serving(served)  # the replacements serve, not profiling
    assert not any(worker(served, i).profiling for i in (0, 1))  # type: ignore[attr-defined]
