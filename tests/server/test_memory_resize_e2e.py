"""Resizing the arena on a real server while requests flow: nothing lost, answers exact.

Real worker processes map the new segment with their next batch; a worker still
reading the old (removed) one would answer from stale bytes, and the comparison with
unbatched ONNX Runtime would catch it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import numpy as np
import pytest
from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.config import RuntimeConfig
from sordino.config.memory import MemoryConfig
from sordino.models.repository import builtin_sources
from sordino.records import ResizeReport
from sordino.testing import RunningServer, serve_in_thread
from tests.conftest import digits_pixels
from tests.waiting import wait_for

DIGITS = "digits-classifier"
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def auto_server() -> Iterator[RunningServer]:
    config = RuntimeConfig(
        memory=MemoryConfig(
            strategy="fragmentation_aware",
            pool_size="auto",
            pool_min="4MB",
            pool_max="64MB",
            prewarm_interval="1h",  # the test drives the steps itself
        )
    )
    sources = [s for s in builtin_sources() if s.name in (DIGITS, "countdown")]
    with serve_in_thread(config, sources) as running:
        yield running


def _body(pixels: np.ndarray) -> dict[str, Any]:
    return {"inputs": [{"name": "pixels", "shape": list(pixels.shape), "datatype": "FP32",
                        "data": pixels.ravel().tolist()}]}  # fmt: skip


def test_resizes_under_load_lose_nothing_and_answers_stay_exact(
    auto_server: RunningServer, reference: dict[str, Any]
) -> None:
    server = auto_server
    runtime = server.runtime
    n = 96
    pixels = digits_pixels(n, seed=11)
    session = reference[DIGITS]
    expected = session.run(None, {session.get_inputs()[0].name: pixels})[0]
    sizes = [16 * MIB, 6 * MIB, 24 * MIB, 8 * MIB]
    reports: list[ResizeReport | None] = []

    async def load() -> tuple[int, list[list[int]]]:
        checked = 0
        streams: list[list[int]] = []
        done = asyncio.Event()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:

            async def one(worker: int) -> None:
                nonlocal checked
                url = f"{server.url}/v2/models/{DIGITS}/infer"
                i = worker
                while i < n or not done.is_set():
                    row = i % n
                    async with client.post(url, json=_body(pixels[row : row + 1])) as r:
                        assert r.status == 200, await r.text()
                        answer = await r.json()
                    out = next(o for o in answer["outputs"] if o["name"] == "probabilities")
                    got = np.asarray(out["data"], np.float32)
                    np.testing.assert_allclose(got, expected[row], rtol=1e-5, atol=1e-6)
                    checked += 1
                    i += 16

            async def stream() -> None:
                url = f"{server.url}/v2/models/countdown/generate_stream"
                while not done.is_set():
                    async with client.post(url, json={"COUNT": 6}) as r:
                        assert r.status == 200, await r.text()
                        text = await r.text()
                    lines = [line for line in text.splitlines() if "REMAINING" in line]
                    streams.append(
                        [
                            int(line.split('"REMAINING":')[1].split(",")[0].strip("[] }"))
                            for line in lines
                        ]
                    )

            async def resizes() -> None:
                await asyncio.sleep(0.2)  # the load is flowing
                for size in sizes:
                    report = await asyncio.to_thread(
                        server.call, runtime.memory.resize(size, "manual")
                    )
                    reports.append(report)  # type: ignore[arg-type]
                    await asyncio.sleep(0.1)
                done.set()

            await asyncio.gather(*[one(w) for w in range(16)], *[stream() for _ in range(4)],
                                 resizes())  # fmt: skip
        return checked, streams

    names_before = runtime.executor.staging.arena.name
    checked, streams = asyncio.run(load())
    assert checked >= n and streams
    assert all(seen == [5, 4, 3, 2, 1, 0] for seen in streams), streams
    assert all(r is not None for r in reports), reports
    assert [r.bytes_after for r in reports if r is not None] == sizes
    arena = runtime.executor.staging.arena
    assert arena.capacity == 8 * MIB and arena.name != names_before
    events = [e for e in runtime.events.recent("memory") if e.subject == "resize"]
    assert len(events) >= len(sizes)
    assert {"bytes_before", "bytes_after", "bytes_copied", "pause_s", "reason"} <= set(
        events[-1].payload
    )
    pool = runtime.memory.statistics().pool
    assert pool is not None and pool.auto and pool.resizes >= len(sizes)
    assert pool.capacity_bytes == 8 * MIB


def test_resize_endpoint_cli_and_auto_step(auto_server: RunningServer) -> None:
    server = auto_server
    runtime = server.runtime
    # Something ran, so the arena exists (the test above, or this request).
    pixels = digits_pixels(1, seed=3)
    r = httpx.post(f"{server.url}/v2/models/{DIGITS}/infer", json=_body(pixels), timeout=30)
    assert r.status_code == 200
    r = httpx.post(f"{server.url}/v2/sordino/memory/resize", json={"size": "lots"}, timeout=30)
    assert r.status_code == 400 and "size" in r.text
    r = httpx.post(f"{server.url}/v2/sordino/memory/resize", json={"size": "100TB"}, timeout=30)
    assert r.status_code == 400 and "at most" in r.text  # past memory.pool_size's bound
    r = httpx.post(f"{server.url}/v2/sordino/memory/resize", json={"size": "900GB"}, timeout=30)
    assert r.status_code == 400 and "/dev/shm has room" in r.text
    result = CliRunner().invoke(cli, ["memory", "resize", "32MB", "--url", server.url])
    assert result.exit_code == 0, result.output
    assert "-> 32.0 MiB" in result.output
    assert runtime.executor.staging.arena.capacity == 32 * MIB
    # pool_size auto: the real peak here is far below half of 32 MiB: shrink to pool_min.
    report = server.call(runtime.memory.prewarm())
    assert isinstance(report, ResizeReport) and report.reason == "shrink"
    assert runtime.executor.staging.arena.capacity == 4 * MIB
    r = httpx.post(f"{server.url}/v2/models/{DIGITS}/infer", json=_body(pixels), timeout=30)
    assert r.status_code == 200
    result = CliRunner().invoke(cli, ["memory", "status", "--url", server.url])
    assert result.exit_code == 0, result.output
    assert "pool auto: 4.0 MiB" in result.output and "predicted peak" in result.output
    assert "real peak" in result.output


def test_a_worker_started_after_a_resize_serves_from_the_new_segment(
    auto_server: RunningServer, reference: dict[str, Any]
) -> None:
    """The segment named when the instance was created is gone: the replacement maps
    the one its first batch names."""
    server = auto_server
    runtime = server.runtime
    pixels = digits_pixels(4, seed=21)
    url = f"{server.url}/v2/models/{DIGITS}/infer"
    assert httpx.post(url, json=_body(pixels), timeout=30).status_code == 200
    capacity = runtime.executor.staging.arena.capacity
    report = server.call(runtime.memory.resize(capacity + 2 * MIB, "manual"))
    assert isinstance(report, ResizeReport)
    (worker,) = [w for w in runtime.memory.statistics().workers if w.model == DIGITS]
    assert worker.pid is not None
    os.kill(worker.pid, signal.SIGKILL)

    def replaced() -> bool:
        workers = [w for w in runtime.memory.statistics().workers if w.model == DIGITS]
        stats = runtime.executor.statistics().workers
        serving = [w for w in stats if w.model == DIGITS and w.state == "ready"]
        return bool(workers) and workers[0].pid not in (None, worker.pid) and bool(serving)

    wait_for(replaced, "the killed worker to be replaced")
    session = reference[DIGITS]
    expected = session.run(None, {session.get_inputs()[0].name: pixels})[0]
    r = httpx.post(url, json=_body(pixels), timeout=30)
    assert r.status_code == 200, r.text
    out = next(o for o in r.json()["outputs"] if o["name"] == "probabilities")
    np.testing.assert_allclose(
        np.asarray(out["data"], np.float32).reshape(4, -1), expected, rtol=1e-5, atol=1e-6
    )
