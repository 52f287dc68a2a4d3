"""Queue limits and deadlines over real HTTP, with a model slow enough to queue behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sordino.config import ModelConfig, RuntimeConfig
from sordino.models.repository import sources_for
from sordino.testing import RunningServer, serve_in_thread
from tests.metrics import counter_sum
from tests.models import slow_model

BODY = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    path = slow_model(Path(tmp_path_factory.mktemp("slow")) / "slow.onnx", repeats=8)
    config = ModelConfig(
        name="slow",
        path=path,
        max_batch_size=1,
        dynamic_batching={"default_queue_policy": {"max_queue_size": 1}},
    )
    with serve_in_thread(RuntimeConfig(), sources_for(config)) as server:
        yield server


def _busy(server: RunningServer) -> bool:
    stats = server.runtime.scheduler_statistics()[0]
    return stats.running_batches == 1


def _occupy(server: RunningServer, results: list[int], n: int) -> list[threading.Thread]:
    def send() -> None:
        results.append(
            httpx.post(f"{server.url}/v2/models/slow/infer", json=BODY, timeout=120).status_code
        )

    threads = [threading.Thread(target=send) for _ in range(n)]
    for t in threads:
        t.start()
        deadline = time.monotonic() + 60
        while not _busy(server) and time.monotonic() < deadline:
            time.sleep(0.001)
    return threads


def test_full_queue_answers_503_with_retry_after(slow_server: RunningServer) -> None:
    results: list[int] = []
    threads = _occupy(slow_server, results, 1)  # one running
    deadline = time.monotonic() + 60
    queued = threading.Thread(
        target=lambda: results.append(
            httpx.post(
                f"{slow_server.url}/v2/models/slow/infer", json=BODY, timeout=120
            ).status_code
        )
    )
    queued.start()
    while slow_server.runtime.scheduler_statistics()[0].queue.depth < 1:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    refused = httpx.post(f"{slow_server.url}/v2/models/slow/infer", json=BODY, timeout=120)
    assert refused.status_code == 503
    assert refused.headers["Retry-After"] == "1"
    assert "queue is full" in refused.json()["error"]
    for t in [*threads, queued]:
        t.join(timeout=120)
    assert results == [200, 200]


def _not_served(server: RunningServer) -> int:
    """Requests to ``slow`` counted with any outcome but success (each request once)."""
    return counter_sum(
        server, "sordino_requests", lambda s: s["model"] == "slow" and s["outcome"] != "success"
    )


def test_deadline_in_queue_answers_503_and_never_runs(slow_server: RunningServer) -> None:
    before = slow_server.runtime.scheduler_statistics()[0]
    not_served = _not_served(slow_server)
    results: list[int] = []
    threads = _occupy(slow_server, results, 1)
    body = {**BODY, "parameters": {"timeout": 1000}}  # 1 ms: expires behind the running batch
    late = httpx.post(f"{slow_server.url}/v2/models/slow/infer", json=body, timeout=120)
    for t in threads:
        t.join(timeout=120)
    assert late.status_code == 503
    # Refused for its deadline: at arrival, since a batch alone takes longer than 1 ms
    # (shed), or, before the model has run a batch, once it expires in the queue — or,
    # on a busy machine, before it reached the queue at all, its 1 ms spent being read.
    error = late.json()["error"]
    assert "overloaded" in error or "timed out in the queue" in error
    after = slow_server.runtime.scheduler_statistics()[0]
    assert _not_served(slow_server) == not_served + 1  # counted once, wherever refused
    assert after.batches == before.batches + 1  # only the occupying request ran
