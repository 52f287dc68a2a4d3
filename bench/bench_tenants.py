"""Tenants: what keys, limits and fair share cost on the hot path, and what they buy.

Two parts in one run on this machine:

- in-process: the admission chain per request without and with a tenant (the key's
  hash, the priority cap, the token bucket, the concurrency slot and its release), and
  the queue's ``take`` per batch of 64 with 1, 4 and 32 tenants on one level (the
  weighted deficit round robin) — the figures the engine's hot path pays;
- end to end, real ``sordino start`` (digits classifier): tenant A floods with 48
  closed-loop clients while tenant B sends 20 req/s open loop, three ways — no tenants
  (A and B only claim names), tenants with weights 4:1, and tenants with weights and
  rates (A 200/s, B 50/s). B's p50/p99 and refusals, A's goodput and 429s.

    python -m bench.bench_tenants [--seconds 8]     # writes bench/results/tenants.json
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import platform
import tempfile
import time
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
from rich.table import Table

from bench.common import console, save, sordino_server
from sordino.admission.chain import AdmissionChain, AdmissionContext, default_links
from sordino.admission.gate import TrafficGate
from sordino.admission.tenants import Tenants
from sordino.config.tenants import TenantConfig, hash_key
from sordino.inference import InferRequest
from sordino.memory.refs import Tensors
from sordino.records import QueueSettings
from sordino.scheduling.queue import RequestQueue
from sordino.scheduling.work import Request, WorkItem, signature_of

MODEL = "digits-classifier"
A_KEY, B_KEY = "bench-tenant-a-key-000", "bench-tenant-b-key-000"


# -- in-process ------------------------------------------------------------------------


def admission_ns(n: int) -> dict[str, float]:
    """Nanoseconds per request through admission, without and with a tenant."""
    settings = QueueSettings()
    request = InferRequest(model="m", inputs={}, headers={"authorization": f"Bearer {A_KEY}"})
    plain = AdmissionChain([*default_links(), TrafficGate()])
    tenants = Tenants(
        [
            TenantConfig(
                name="a",
                keys=(hash_key(A_KEY),),
                rate=1e12,
                max_concurrency=10**9,
                max_priority="high",
            )
        ]
    )
    chained = AdmissionChain([*default_links(), tenants.cap_priority, TrafficGate(), tenants])
    out: dict[str, float] = {}
    start = time.perf_counter_ns()
    for _ in range(n):
        plain.admit(request, AdmissionContext(model="m", settings=settings, priority_rules={}))
    out["no tenants"] = (time.perf_counter_ns() - start) / n
    start = time.perf_counter_ns()
    for _ in range(n):
        tenant = tenants.authenticate(request.headers["authorization"])
        context = chained.admit(
            request,
            AdmissionContext(model="m", settings=settings, priority_rules={}, tenant=tenant),
        )
        tenants.finished(context, "success")
    out["tenant (key, cap, bucket, slot)"] = (time.perf_counter_ns() - start) / n
    return out


def take_us(tenant_count: int, items: int = 4096, batch: int = 64) -> float:
    """Microseconds per ``take`` of ``batch`` rows from ``items`` queued, one level."""
    inputs = {"x": np.zeros((1, 4), dtype=np.float32)}
    signature = signature_of(inputs, True)
    queue = RequestQueue(priority_levels=1, max_size=items, delay_expired=False)
    names = [f"t{i}" if tenant_count > 1 else "" for i in range(tenant_count)]
    for i in range(items):
        name = names[i % tenant_count]
        request = Request(
            inputs=Tensors.of(inputs),
            priority=1,
            arrival=0.0,
            tenant=name,
            weight=1 + i % tenant_count % 4,
        )
        queue.put_nowait(
            WorkItem(
                inputs=inputs, rows=1, signature=signature, priority=1, arrival=0.0, request=request
            )
        )
    batches = 0
    start = time.perf_counter_ns()
    while len(queue):
        queue.take(signature, batch)
        batches += 1
    return (time.perf_counter_ns() - start) / batches / 1000


# -- end to end ------------------------------------------------------------------------


def _config(kind: str) -> str:
    if kind == "none":
        return "{}\n"
    rate_a = "\n    rate: 200/s" if kind == "rates" else ""
    rate_b = "\n    rate: 50/s" if kind == "rates" else ""
    return (
        f'tenants:\n  - name: a\n    keys: ["{hash_key(A_KEY)}"]\n    weight: 4{rate_a}\n'
        f'  - name: b\n    keys: ["{hash_key(B_KEY)}"]\n    weight: 1{rate_b}\n'
    )


def _headers(kind: str, key: str, name: str) -> dict[str, str]:
    base = {"Content-Type": "application/json"}
    if kind == "none":
        return {**base, "X-Sordino-Tenant": name}
    return {**base, "Authorization": f"Bearer {key}"}


async def _contend(url: str, payload: bytes, kind: str, seconds: float) -> dict[str, Any]:
    stop = time.perf_counter() + seconds
    a_status: dict[int, int] = {}
    b_status: dict[int, int] = {}
    b_latency: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def flood() -> None:
            headers = _headers(kind, A_KEY, "a")
            while time.perf_counter() < stop:
                async with session.post(url, data=payload, headers=headers) as answer:
                    await answer.read()
                    a_status[answer.status] = a_status.get(answer.status, 0) + 1
                if answer.status == 429:
                    await asyncio.sleep(0.005)  # a polite client backs off a little

        async def steady_one(headers: dict[str, str]) -> None:
            started = time.perf_counter()
            async with session.post(url, data=payload, headers=headers) as answer:
                await answer.read()
            b_status[answer.status] = b_status.get(answer.status, 0) + 1
            if answer.status == 200:
                b_latency.append(time.perf_counter() - started)

        async def steady() -> None:
            headers = _headers(kind, B_KEY, "b")
            tasks = []
            begun = time.perf_counter()
            n = 0
            while time.perf_counter() < stop:
                tasks.append(asyncio.create_task(steady_one(headers)))
                n += 1
                await asyncio.sleep(max(0.0, begun + n / 20 - time.perf_counter()))
            await asyncio.gather(*tasks)

        await asyncio.gather(steady(), *(flood() for _ in range(48)))
    lat = np.array(b_latency) * 1000 if b_latency else np.array([np.nan])
    return {
        "a_ok_per_s": a_status.get(200, 0) / seconds,
        "a_429": a_status.get(429, 0),
        "b_sent": sum(b_status.values()),
        "b_refused": sum(v for k, v in b_status.items() if k != 200),
        "b_p50_ms": float(np.percentile(lat, 50)),
        "b_p99_ms": float(np.percentile(lat, 99)),
    }


def end_to_end(seconds: float) -> dict[str, dict[str, Any]]:
    path = str(resources.files("sordino.models.builtin").joinpath(f"{MODEL}.onnx"))
    pixels = np.random.default_rng(0).integers(0, 17, size=(1, 64)).astype(np.float32)
    payload = orjson.dumps(
        {
            "inputs": [
                {"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": pixels[0].tolist()}
            ]
        }
    )
    results: dict[str, dict[str, Any]] = {}
    for kind in ("none", "weights", "rates"):
        with tempfile.TemporaryDirectory() as scratch:
            config = Path(scratch) / "tenants.yaml"
            config.write_text(_config(kind))
            args = ["--no-builtin", "--model", f"{MODEL}={path}", "--config", str(config)]
            with sordino_server(args) as ends:
                url = f"{ends.http}/v2/models/{MODEL}/infer"
                asyncio.run(_contend(url, payload, kind, 1.0))  # warm-up
                results[kind] = asyncio.run(_contend(url, payload, kind, seconds))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per e2e run")
    parser.add_argument("--iterations", type=int, default=200_000)
    args = parser.parse_args()

    admission = admission_ns(args.iterations)
    take = {str(n): take_us(n) for n in (1, 4, 32)}
    table = Table(title="in-process cost")
    table.add_column("what")
    table.add_column("cost", justify="right")
    for label, ns in admission.items():
        table.add_row(f"admission, {label}", f"{ns / 1000:.2f} µs/request")
    for n, us in take.items():
        table.add_row(f"queue take of 64 rows, {n} tenant(s) on the level", f"{us:.1f} µs/batch")
    console.print(table)

    e2e = end_to_end(args.seconds)
    table = Table(title=f"A floods (48 clients), B sends 20 req/s; {args.seconds:g} s each")
    for column in ("setup", "A ok/s", "A 429", "B sent", "B refused", "B p50 ms", "B p99 ms"):
        table.add_column(column, justify="right")
    labels = {
        "none": "no tenants (claimed names)",
        "weights": "tenants, weights 4:1",
        "rates": "+ rates A 200/s, B 50/s",
    }
    for kind, r in e2e.items():
        table.add_row(
            labels[kind],
            f"{r['a_ok_per_s']:.0f}",
            str(r["a_429"]),
            str(r["b_sent"]),
            str(r["b_refused"]),
            f"{r['b_p50_ms']:.1f}",
            f"{r['b_p99_ms']:.1f}",
        )
    console.print(table)
    save(
        "tenants",
        {
            "machine": platform.platform(),
            "date": datetime.now(UTC).isoformat(),
            "admission_ns": admission,
            "take_us": take,
            "end_to_end": e2e,
            "key_hash_check": hashlib.sha256(A_KEY.encode()).hexdigest()[:8],
        },
    )


if __name__ == "__main__":
    main()
