"""The memory manager on a real server: defragmentation under load, overflow, quotas.

Real worker processes, real ONNX Runtime, real HTTP clients. Every answer is compared
with an unbatched ONNX Runtime session; no request may end in a 500 or go unanswered.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import numpy as np
import pytest

from sordino.config import RuntimeConfig
from sordino.config.memory import MemoryConfig
from sordino.config.workers import WorkersConfig
from sordino.errors import OutOfMemory
from sordino.inference import ModelKey
from sordino.memory.refs import Lease, Tensors
from sordino.models.repository import builtin_sources
from sordino.testing import Fragmentation, RunningServer, fragment_arena, serve_in_thread
from tests.conftest import digits_pixels
from tests.waiting import wait_for

DIGITS = "digits-classifier"


def _config(arena: str | None = None, **memory: Any) -> RuntimeConfig:
    """``arena``: a tiny arena for overflow tests, below memory.pool_size's 64KB floor."""
    workers = WorkersConfig(shared_memory=arena) if arena is not None else WorkersConfig()
    return RuntimeConfig(memory=MemoryConfig(**memory), workers=workers)


def _sources(*names: str) -> list[Any]:
    return [s for s in builtin_sources() if s.name in names]


def _fragmented(server: RunningServer) -> tuple[Fragmentation, set[int]]:
    """Fragment ``server``'s arena to at least 0.5; the holder and the blocks it keeps."""

    async def fragment() -> Fragmentation:
        return fragment_arena(server.runtime, 0.5)

    held = server.call(fragment())
    assert isinstance(held, Fragmentation) and held.fragmentation >= 0.5
    return held, {int(t["block"][0]) for t in held.tensors}


def _digits_body(pixels: np.ndarray, tenant: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [
            {"name": "pixels", "shape": list(pixels.shape), "datatype": "FP32",
             "data": pixels.ravel().tolist()}
        ]
    }  # fmt: skip
    if tenant is not None:
        body["parameters"] = {"tenant": tenant}
    return body


def _probabilities(answer: dict[str, Any], rows: int) -> np.ndarray:
    output = next(o for o in answer["outputs"] if o["name"] == "probabilities")
    return np.asarray(output["data"], np.float32).reshape(rows, -1)


@pytest.fixture(scope="module")
def defrag_server() -> Iterator[RunningServer]:
    # Without incremental compaction: these tests watch what the timer's runs move.
    config = _config(
        strategy="fragmentation_aware", pool_size="32MB", defrag_interval=0.2, compact_step=0
    )
    with serve_in_thread(config, _sources(DIGITS, "countdown")) as running:
        yield running


def test_batch_boundaries_compact_a_fragmented_arena_step_by_step(
    reference: dict[str, Any],
) -> None:
    """fragmentation_aware's default compaction steps, with no defrag run at all: the
    batches of a light load sink the holes between parked blocks, each step within
    memory.compact_step; moved blocks keep their contents and answers stay exact."""
    config = _config(strategy="fragmentation_aware", pool_size="32MB")
    with serve_in_thread(config, _sources(DIGITS)) as server:
        runtime = server.runtime
        held, kept = _fragmented(server)
        pixels = digits_pixels(8, seed=9)
        session = reference[DIGITS]
        expected = session.run(None, {session.get_inputs()[0].name: pixels})[0]

        def fragmentation() -> float:
            return runtime.memory.statistics().arena.fragmentation  # type: ignore[union-attr]

        with httpx.Client(base_url=server.url, timeout=30) as client:
            for i in range(200):
                answer = client.post(
                    f"/v2/models/{DIGITS}/infer", json=_digits_body(pixels[i % 8 : i % 8 + 1])
                )
                assert answer.status_code == 200, answer.text
                got = _probabilities(answer.json(), 1)[0]
                np.testing.assert_allclose(got, expected[i % 8], rtol=1e-5, atol=1e-6)
                if fragmentation() < 0.05:
                    break
        stats = runtime.memory.statistics()
        compaction = stats.compaction
        assert compaction is not None and compaction.budget_bytes == 2 * 2**20
        assert stats.defrag_runs == 0 and fragmentation() < 0.05
        assert compaction.steps_moving >= 2  # more than one boundary's budget was needed
        assert compaction.bytes_moved <= compaction.steps_moving * 2 * 2**20

        async def check_and_release() -> tuple[set[int], bool]:
            firsts = {int(t["block"][0]) for t in held.tensors}
            uniform = all(bool((t["block"] == t["block"][0]).all()) for t in held.tensors)
            held.release()
            return firsts, uniform

        firsts, uniform = server.call(check_and_release())
        assert firsts == kept and uniform, "a moved block lost its contents"


def test_defrag_every_200ms_under_load_keeps_every_answer_exact(
    defrag_server: RunningServer, reference: dict[str, Any]
) -> None:
    """Concurrent one-shot and streaming load while defrag runs: exact answers, no error."""
    server = defrag_server
    runtime = server.runtime
    held, kept = _fragmented(server)
    n = 192
    pixels = digits_pixels(n, seed=5)
    session = reference[DIGITS]
    expected = session.run(None, {session.get_inputs()[0].name: pixels})[0]

    runs_before = runtime.memory.statistics().defrag_runs

    def defrags_seen() -> int:
        return runtime.memory.statistics().defrag_runs - runs_before

    async def load() -> tuple[int, list[list[int]]]:
        # Clients keep going until three timed runs happened during the load.
        checked = 0
        streams: list[list[int]] = []
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as client:

            async def one(worker: int) -> None:
                nonlocal checked
                url = f"{server.url}/v2/models/{DIGITS}/infer"
                i = worker
                while i < n or (defrags_seen() < 3 and i < 50 * n):
                    row = i % n
                    async with client.post(url, json=_digits_body(pixels[row : row + 1])) as r:
                        assert r.status == 200, await r.text()
                        got = _probabilities(await r.json(), 1)[0]
                    np.testing.assert_allclose(got, expected[row], rtol=1e-5, atol=1e-6)
                    checked += 1
                    i += 32

            async def stream(count: int) -> None:
                url = f"{server.url}/v2/models/countdown/generate_stream"
                for _ in range(4):
                    async with client.post(url, json={"COUNT": count}) as r:
                        assert r.status == 200, await r.text()
                        text = await r.text()
                    seen = [int(line.split('"REMAINING":')[1].split(",")[0].strip("[] }"))
                            for line in text.splitlines() if "REMAINING" in line]  # fmt: skip
                    streams.append(seen)

            await asyncio.gather(*[one(w) for w in range(32)], *[stream(6) for _ in range(16)])
        return checked, streams

    checked, streams = asyncio.run(load())
    assert checked >= n
    assert defrags_seen() >= 3, "the load ended before three defrag runs"
    assert len(streams) == 64 and all(seen == [5, 4, 3, 2, 1, 0] for seen in streams), streams
    runs = [e for e in runtime.events.recent("memory") if e.subject == "defrag"]
    assert runs and all(e.payload["reason"] == "interval" for e in runs)
    assert {"bytes_moved", "fragmentation_before", "fragmentation_after", "pause_s"} <= set(
        runs[0].payload
    )
    learned = {f.model: f for f in runtime.memory.statistics().forecasts}
    assert learned[DIGITS].buckets[0][0] == 1 and learned[DIGITS].bytes_per_request > 0
    fragmented = [e for e in runs if e.payload["fragmentation_before"] >= 0.5]
    assert fragmented and fragmented[0].payload["bytes_moved"] > 0
    assert fragmented[0].payload["fragmentation_after"] < 0.5

    async def check_and_release() -> tuple[set[int], bool, float]:
        firsts = {int(t["block"][0]) for t in held.tensors}
        uniform = all(bool((t["block"] == t["block"][0]).all()) for t in held.tensors)
        held.release()
        return firsts, uniform, runtime.memory.statistics().arena.fragmentation  # type: ignore[union-attr]

    firsts, uniform, _ = server.call(check_and_release())  # type: ignore[misc]
    assert firsts == kept and uniform, "a moved block lost its contents"
    wait_for(
        lambda: runtime.memory.statistics().arena.in_use_bytes == 0,  # type: ignore[union-attr]
        "every arena block back",
    )


def test_manual_defrag_report_and_status_endpoint(defrag_server: RunningServer) -> None:
    """POST /v2/sordino/memory/defrag reports the run; GET shows tiers and counters."""
    with httpx.Client(base_url=defrag_server.url, timeout=30) as client:
        report = client.post("/v2/sordino/memory/defrag")
        status = client.get("/v2/sordino/memory")
    assert report.status_code == 200, report.text
    assert report.json()["reason"] == "manual"
    document = status.json()
    assert document["strategy"] == "fragmentation_aware"
    assert document["arena"]["reserved_bytes"] == 32 * 2**20
    assert {t["tier"] for t in document["tiers"]} == {"small", "medium", "large"}
    assert document["defrag_runs"] >= 1


def test_tiny_arena_burst_shrinks_batches_and_answers_everyone() -> None:
    """An arena of 8 KB and a burst of 8-row requests: shrunk batches, no 500, none lost."""
    config = _config(arena="8KB", overflow_wait=5.0)
    with serve_in_thread(config, _sources(DIGITS)) as server:
        n = 120
        pixels = digits_pixels(n * 8, seed=9)

        async def burst() -> list[int]:
            statuses: list[int] = []
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:

                async def one(i: int) -> None:
                    body = _digits_body(pixels[i * 8 : (i + 1) * 8])
                    url = f"{server.url}/v2/models/{DIGITS}/infer"
                    async with client.post(url, json=body) as r:
                        statuses.append(r.status)
                        if r.status == 503:
                            assert r.headers.get("Retry-After"), "503 without Retry-After"

                await asyncio.gather(*(one(i) for i in range(n)))
            return statuses

        statuses = asyncio.run(burst())
        assert len(statuses) == n and set(statuses) <= {200, 503}, sorted(set(statuses))
        with httpx.Client(base_url=server.url, timeout=30) as client:
            too_big = client.post(
                f"/v2/models/{DIGITS}/infer", json=_digits_body(digits_pixels(64, seed=1))
            )
        assert too_big.status_code == 400
        assert "8192 bytes" in too_big.json()["error"], too_big.json()
        stats = server.runtime.memory.statistics()
        assert stats.overflow_shrinks > 0
        assert stats.oversized_rejections == 1
        assert stats.overflow_rejections == statuses.count(503)


def test_a_full_arena_answers_503_with_retry_after() -> None:
    """Space that never comes within overflow_wait: 503 + Retry-After, never a 500."""
    config = _config(arena="8KB", overflow_wait=0.2)
    with serve_in_thread(config, _sources(DIGITS)) as server:
        arena = server.runtime.executor.staging.arena

        async def fill() -> Lease:
            lease = Lease(arena)
            lease.acquire_nowait(arena.allocator.largest_free())
            return lease

        lease = server.call(fill())
        assert isinstance(lease, Lease)
        with httpx.Client(base_url=server.url, timeout=30) as client:
            answer = client.post(
                f"/v2/models/{DIGITS}/infer", json=_digits_body(digits_pixels(2, seed=2))
            )

        async def free() -> None:
            lease.release()

        server.call(free())
        assert answer.status_code == 503, answer.text
        assert int(answer.headers["Retry-After"]) >= 1
        assert "memory.pool_size" in answer.json()["error"]
        assert server.runtime.memory.statistics().overflow_rejections == 1


def test_memory_manager_off_a_batch_too_large_for_the_arena_never_wedges_the_server() -> None:
    """Issue 27: with --disable-memory-pool, one batch whose inputs fit the arena but
    whose outputs did not waited for ever, first in the arena's line, and every later
    request timed out while readiness said 200. Now: the oversized request gets a 400
    naming the arena's size, a batch of fitting requests is kept within the arena, a
    batch that cannot fit is refused at once, and everything after is served."""
    config = _config("16KB", enabled=False)  # 16384 bytes; a row needs 296
    with serve_in_thread(config, _sources(DIGITS)) as server:
        url = f"/v2/models/{DIGITS}/infer"
        with httpx.Client(base_url=server.url, timeout=30) as client:
            too_big = client.post(url, json=_digits_body(digits_pixels(60, seed=1)))
            assert too_big.status_code == 400, too_big.text
            message = too_big.json()["error"]
            assert "16384 bytes" in message and "memory.pool_size" in message, message
            normal = client.post(url, json=_digits_body(digits_pixels(1, seed=2)))
            assert normal.status_code == 200, normal.text
            assert client.get("/v2/health/ready").status_code == 200

        async def burst() -> list[int]:
            # 30-row requests (8880 bytes each): any two together overflow the arena.
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as c:

                async def one(i: int) -> int:
                    body = _digits_body(digits_pixels(30, seed=10 + i))
                    async with c.post(f"{server.url}{url}", json=body) as r:
                        return r.status

                return list(await asyncio.gather(*(one(i) for i in range(6))))

        assert asyncio.run(burst()) == [200] * 6

        # The executor itself (as the deep health check calls it, past the scheduler):
        # 2 x 30 rows, inputs 15360 bytes (they fit), outputs 2400 more (they cannot).
        key = ModelKey(DIGITS, "1")
        parts = [{"pixels": digits_pixels(30, seed=3)}, {"pixels": digits_pixels(30, seed=4)}]

        async def run_too_large() -> str:
            try:
                outputs = await server.runtime.executor.run(key, parts)
            except OutOfMemory as exc:
                return exc.message
            outputs.release()
            return "ran"

        refused = server.call(run_too_large(), timeout=10)
        assert isinstance(refused, str) and "cannot fit" in refused, refused
        assert "memory.pool_size" in refused
        arena = server.runtime.executor.staging.arena
        assert arena.statistics().in_use_bytes == 0
        with httpx.Client(base_url=server.url, timeout=30) as client:
            normal = client.post(url, json=_digits_body(digits_pixels(4, seed=5)))
            assert normal.status_code == 200, normal.text
            assert client.get("/v2/health/ready", params={"deep": "true"}).status_code == 200


def test_a_flooding_tenant_cannot_make_another_fail() -> None:
    """Tenant A floods past its quota (429s); tenant B's requests all succeed."""
    row = 64 * 4 + 10 * 4
    config = _config(
        quotas=[{"tenant": "flood", "max": 2 * 8 * row}, {"tenant": "calm", "max": "1MB"}],
        quota_wait=0.02,
    )
    with serve_in_thread(config, _sources(DIGITS)) as server:
        pixels = digits_pixels(8, seed=3)

        async def mixed() -> tuple[list[int], list[int]]:
            flood: list[int] = []
            calm: list[int] = []
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
                url = f"{server.url}/v2/models/{DIGITS}/infer"

                async def one(tenant: str, sink: list[int]) -> None:
                    async with client.post(url, json=_digits_body(pixels, tenant)) as r:
                        sink.append(r.status)
                        if r.status == 429:
                            assert r.headers.get("Retry-After")

                tasks = [one("flood", flood) for _ in range(150)]
                tasks += [one("calm", calm) for _ in range(40)]
                await asyncio.gather(*tasks)
            return flood, calm

        flood, calm = asyncio.run(mixed())
        assert calm == [200] * 40
        assert set(flood) <= {200, 429} and 429 in flood and 200 in flood
        owners = {o.owner: o for o in server.runtime.memory.statistics().owners}
        assert owners["flood"].rejections == flood.count(429)
        assert owners["flood"].peak_bytes <= 2 * 8 * row
        assert owners["calm"].rejections == 0
        assert all(o.in_use_bytes == 0 for o in owners.values())
        assert server.runtime.executor.staging.arena.zero_on_free


def test_parked_tensors_are_released_cleanly() -> None:
    """Tensors.release unparks: a lease's parked list never keeps a released holder."""
    config = _config()
    with serve_in_thread(config, _sources(DIGITS)) as server:
        arena = server.runtime.executor.staging.arena

        async def scenario() -> tuple[int, int]:
            lease = Lease(arena)
            lease.acquire_nowait(256)
            tensors = Tensors({}, (lease,))
            tensors.park()
            shared = tensors.share()
            shared.park()
            parked = len(lease._parked)
            tensors.release()
            shared.release()
            return parked, len(lease._parked)

        assert server.call(scenario()) == (2, 0)
        report = server.call(server.runtime.memory.defragment("test"))
        assert dataclasses.asdict(report)["reason"] == "test"  # type: ignore[call-overload]


def test_metrics_show_tiers_owners_overflow_and_defrag(defrag_server: RunningServer) -> None:
    """/metrics carries the memory families, per tier and per owner."""
    from prometheus_client.parser import text_string_to_metric_families

    defrag_server.call(defrag_server.runtime.memory.defragment("metrics"))
    text = httpx.get(f"{defrag_server.url}/metrics", timeout=30).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    tiers = {(s.labels["tier"], s.labels["lifetime"])
             for s in families["sordino_memory_tier_in_use_bytes"].samples}  # fmt: skip
    assert ("small", "short") in tiers and ("large", "long") in tiers
    owners = {s.labels["owner"] for s in families["sordino_memory_owner_in_use_bytes"].samples}
    assert {"default", "other"} <= owners
    runs = families["sordino_memory_defrag_runs"].samples[0].value
    assert runs >= 1
    assert "sordino_memory_overflow_shrinks" in families
