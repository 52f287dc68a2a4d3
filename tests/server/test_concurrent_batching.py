"""64 concurrent clients: requests are batched, and every answer equals the unbatched one."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from sordino.testing import RunningServer
from tests.conftest import digits_pixels

CLIENTS = 64
PER_CLIENT = 6


def _batch_histogram(metrics_text: str, model: str) -> tuple[float, float]:
    count = total = 0.0
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "sordino_batch_size":
            continue
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            if sample.name.endswith("_count"):
                count = sample.value
            elif sample.name.endswith("_sum"):
                total = sample.value
    return count, total


async def _load(url: str, payloads: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = [{} for _ in payloads]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(payloads)):
        queue.put_nowait(i)

    async def client(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            model, body = payloads[i]
            async with session.post(f"{url}/v2/models/{model}/infer", json=body) as r:
                assert r.status == 200, await r.text()
                results[i] = await r.json()

    connector = aiohttp.TCPConnector(limit=CLIENTS)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(client(session) for _ in range(CLIENTS)))
    return results


def test_64_concurrent_clients_are_batched_and_exact(
    server: RunningServer, reference: dict[str, Any]
) -> None:
    before = _batch_histogram(server.runtime.metrics.exposition().decode(), "digits-classifier")
    n = CLIENTS * PER_CLIENT
    pixels = digits_pixels(n, seed=11)
    ints = np.random.default_rng(5).integers(-1000, 1000, size=(n, 2, 16)).astype(np.int32)
    words = [f"Word{i} MiXeD" for i in range(n)]
    payloads: list[tuple[str, dict[str, Any]]] = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            payloads.append(("digits-classifier", {"inputs": [
                {"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": pixels[i].tolist()}
            ]}))  # fmt: skip
        elif kind == 1:
            a, b = ints[i, 0].tolist(), ints[i, 1].tolist()
            payloads.append(("simple", {"inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": b},
            ]}))  # fmt: skip
        else:
            payloads.append(("text-normalizer", {"inputs": [
                {"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [words[i]]}
            ]}))  # fmt: skip

    results = asyncio.run(_load(server.url, payloads))

    for i, body in enumerate(results):
        outputs = {o["name"]: np.array(o["data"]) for o in body["outputs"]}
        kind = i % 3
        if kind == 0:
            alone = reference["digits-classifier"].run(None, {"pixels": pixels[i : i + 1]})[0]
            np.testing.assert_allclose(outputs["probabilities"].reshape(1, 10), alone, rtol=1e-5)
        elif kind == 1:
            np.testing.assert_array_equal(outputs["OUTPUT0"], ints[i, 0] + ints[i, 1])
            np.testing.assert_array_equal(outputs["OUTPUT1"], ints[i, 0] - ints[i, 1])
        else:
            assert outputs["normalized"].tolist() == [words[i].lower()]

    count, total = _batch_histogram(
        server.runtime.metrics.exposition().decode(), "digits-classifier"
    )
    batches, rows = count - before[0], total - before[1]
    assert rows == n // 3 + (1 if n % 3 else 0)
    assert batches < rows, "no two requests ever shared a batch"
    stats = {s.model: s for s in server.runtime.scheduler_statistics()}["digits-classifier"]
    assert stats.accepted == stats.succeeded + stats.failed + stats.cancelled + stats.in_flight
