"""Process isolation versus in-process execution, and the device switch time.

Runs ``sordino start`` twice on the built-in digits classifier, once with
``isolation: process`` (the default: a worker process, tensors through shared memory)
and once with ``isolation: thread``, and drives each over real HTTP with an aiohttp
client at concurrency 1 and 64 (one 64-pixel row per request). Then it starts a
server whose digits classifier runs on a chain of two CPU devices, injects an
``error`` fault on the primary through the admin API under load, and reads the
switch time (failure on the primary to the result from the fallback) from /metrics.

    .venv/bin/python bench/bench_isolation.py [--seconds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from sordino.control.client import AdminClient
from sordino.models.repository import builtin_sources

BODY = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [3.0] * 64}]}
TOKEN = "bench-admin-token"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """``sordino start`` in a subprocess with a generated config file."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = tempfile.TemporaryDirectory()
        path = Path(self._dir.name) / "sordino.yaml"
        server = {"http_port": self.port, "grpc_port": 0, "data_dir": self._dir.name}
        config = {"server": server, **config}
        path.write_text(yaml.safe_dump(config))
        self._process = subprocess.Popen(
            [sys.executable, "-m", "sordino", "start", "--config", str(path), "--no-builtin"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "SORDINO_ADMIN_TOKEN": TOKEN},
        )

    async def ready(self, within_s: float = 120) -> None:
        deadline = time.monotonic() + within_s
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self._process.poll() is not None:
                    raise RuntimeError(self._process.stderr.read().decode())  # type: ignore[union-attr]
                try:
                    async with session.get(self.url + "/v2/health/ready") as response:
                        if response.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        raise TimeoutError("server did not start")

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait(30)
        self._dir.cleanup()


def digits_model(**extra: Any) -> dict[str, Any]:
    source = next(s for s in builtin_sources() if s.name == "digits-classifier")
    return {"name": source.name, "path": str(source.path), "max_batch_size": 64, **extra}


async def drive(url: str, concurrency: int, seconds: float) -> dict[str, float]:
    """Closed-loop load: ``concurrency`` clients for ``seconds``; latency in ms."""
    latencies: list[float] = []
    errors = 0
    target = url + "/v2/models/digits-classifier/infer"
    payload = json.dumps(BODY).encode()
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client(until: float, record: bool) -> None:
            nonlocal errors
            while time.perf_counter() < until:
                start = time.perf_counter()
                async with session.post(target, data=payload, headers=headers) as response:
                    await response.read()
                    ok = response.status == 200
                if record:
                    latencies.append((time.perf_counter() - start) * 1000)
                    errors += not ok

        warm = time.perf_counter() + 1.0
        await asyncio.gather(*(client(warm, False) for _ in range(concurrency)))
        began = time.perf_counter()
        await asyncio.gather(*(client(began + seconds, True) for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    ordered = sorted(latencies)
    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": statistics.median(ordered),
        "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "errors": errors,
    }


async def isolation(seconds: float) -> dict[str, dict[int, dict[str, float]]]:
    results: dict[str, dict[int, dict[str, float]]] = {}
    for mode in ("process", "thread"):
        server = Server({"models": [digits_model(isolation=mode)]})
        try:
            await server.ready()
            results[mode] = {c: await drive(server.url, c, seconds) for c in (1, 64)}
        finally:
            server.stop()
    return results


def _metric(text: str, name: str) -> float:
    values = [float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)]
    return sum(values)


async def switch_time(seconds: float) -> dict[str, float]:
    server = Server(
        {
            "devices": [
                {"name": "cpu_a", "provider": "cpu", "intra_op_threads": 1},
                {"name": "cpu_b", "provider": "cpu", "intra_op_threads": 2},
            ],
            "scheduler": {
                "strategies": [
                    {
                        "name": "fallback_chain",
                        "primary": "cpu_a",
                        "fallbacks": ["cpu_b"],
                        "switch_threshold": "error_rate>5% for 30s",
                        "min_requests": 50,
                        "cooldown": "1s",
                    }
                ]
            },
            "models": [digits_model()],
        }
    )
    try:
        await server.ready()
        admin = AdminClient(server.url, TOKEN)
        admin.inject("device:cpu_a", "error", rate=0.5)
        load = await drive(server.url, 8, seconds)
        admin.clear()
        async with (
            aiohttp.ClientSession() as session,
            session.get(server.url + "/metrics") as response,
        ):
            text = await response.text()
    finally:
        server.stop()
    count = _metric(text, "sordino_device_switch_seconds_count")
    return {
        "switches": count,
        "mean_ms": 1000 * _metric(text, "sordino_device_switch_seconds_sum") / max(count, 1),
        "dispatch_mean_ms": 1000
        * _metric(text, "sordino_device_switch_dispatch_seconds_sum")
        / max(count, 1),
        "max_ms": 1000 * _metric(text, "sordino_device_switch_seconds_max"),
        "client_p50_ms": load["p50_ms"],
        "client_p99_ms": load["p99_ms"],
        "client_errors": load["errors"],
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured time per point")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    results = await isolation(args.seconds)
    print(f"digits-classifier over HTTP, {os.cpu_count()} CPUs, {args.seconds:g} s per point")
    print(f"{'isolation':<10}{'conc':>6}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}")
    for mode, points in results.items():
        for conc, r in points.items():
            print(
                f"{mode:<10}{conc:>6}{r['rps']:>10.0f}{r['p50_ms']:>10.2f}"
                f"{r['p99_ms']:>10.2f}{r['errors']:>8.0f}"
            )
    switch = await switch_time(args.seconds)
    print(
        f"device switch (error fault at rate 0.5 on the primary, breaker min_requests 50): "
        f"{switch['switches']:.0f} switches, mean {switch['mean_ms']:.2f} ms failure->result "
        f"(of which {switch['dispatch_mean_ms']:.3f} ms to hand over), max {switch['max_ms']:.2f} "
        f"ms; clients saw p50 {switch['client_p50_ms']:.2f} ms, p99 "
        f"{switch['client_p99_ms']:.2f} ms, {switch['client_errors']:.0f} errors"
    )
    if args.json:
        args.json.write_text(json.dumps({"isolation": results, "switch": switch}, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
