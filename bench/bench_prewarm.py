"""The memory manager's pre-warming and step planning: resize cost, resize under load, plans.

1. **Resize cost** — a real shared-memory arena holding 8 to 128 MiB of parked blocks
   (queued work, carried state) replaced by one twice its size (``Arena.resize``): the
   pause (new segment, copy, repoint) per live MiB.
2. **Resize under load** — ``sordino start --pool-size auto`` serving the digits
   classifier to 64 closed-loop clients for about N s, without and with a resize every
   2 s (``POST /v2/sordino/memory/resize``, alternating 32 and 64 MiB): p50/p99, the
   resizes done and their pauses (new batches held back until every block is parked).
3. **Step plans** — the same server streams countdown (20 steps) and generates with
   digits-diffusion (20 steps): the greedy-by-size region of the last request of each,
   next to the naive sum of its step tensors (``GET /v2/sordino/memory``, ``plans``),
   and the region its steps' outputs really ran in: reserved at the plan of its
   outputs, the most bytes of it in use at once, outputs that did not fit it.

    python -m bench.bench_prewarm [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import urllib.request
from typing import Any

import numpy as np
from rich.table import Table

from bench.common import closed_loop, console, json_request, save, sordino_server
from sordino.memory import Arena, Lease, TensorRef, Tensors
from sordino.memory.strategies import allocator_factory

MiB = 1 << 20


def resize_cost(live_mib: int) -> dict[str, float]:
    """Park ``live_mib`` MiB of 2 MiB blocks in an arena 4x that, resize it to 8x."""
    arena = Arena(4 * live_mib * MiB, allocator=allocator_factory("fragmentation_aware"))
    held: list[Tensors] = []
    try:
        for index in range(live_mib // 2):
            lease = Lease(arena)
            block = lease.acquire_nowait(2 * MiB)
            view = np.ndarray((2 * MiB,), np.uint8, arena.buffer, block.offset)
            view[:] = index % 251
            tensors = Tensors({"x": TensorRef(view, block.offset)}, (lease,))
            tensors.park()
            held.append(tensors)
        started = time.perf_counter()
        report = arena.resize(8 * live_mib * MiB, "bench")
        pause = time.perf_counter() - started
        assert report is not None
        intact = all(int(t["x"][-1]) == i % 251 for i, t in enumerate(held))
        return {"copied_mib": report.bytes_copied / MiB, "pause_ms": pause * 1000,
                "intact": float(intact)}  # fmt: skip
    finally:
        for tensors in held:
            tensors.release()
        arena.close()


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        result: dict[str, Any] = json.loads(answer.read())
        return result


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=60) as answer:
        result: dict[str, Any] = json.loads(answer.read())
        return result


def under_load(seconds: float) -> tuple[dict[str, dict[str, float]], list[dict[str, Any]]]:
    pixels = np.random.default_rng(3).integers(0, 17, (1, 64)).astype(np.float32)
    payload = json_request("pixels", pixels)
    rows: dict[str, dict[str, float]] = {}
    plans: list[dict[str, Any]] = []
    flags = ["--builtin", "--memory-strategy", "fragmentation_aware", "--pool-size", "auto",
             "--pool-min", "16MB", "--pool-max", "128MB"]  # fmt: skip
    for label, resizing in (("no resize", False), ("resize every 2 s", True)):
        with sordino_server(flags) as ends:
            url = f"{ends.http}/v2/models/digits-classifier/infer"
            headers = {"Content-Type": "application/json"}
            asyncio.run(closed_loop(url, [payload] * 500, 16, headers))  # warm up
            stop = threading.Event()
            pauses: list[float] = []

            def resizer(base: str, stop: threading.Event, pauses: list[float]) -> None:
                sizes = ("32MB", "64MB")
                i = 0
                while not stop.wait(2.0):
                    report = _post(f"{base}/v2/sordino/memory/resize", {"size": sizes[i % 2]})
                    if report.get("resized"):
                        pauses.append(report["pause_s"] * 1000)
                    i += 1

            thread = threading.Thread(target=resizer, args=(ends.http, stop, pauses), daemon=True)
            if resizing:
                thread.start()
            count = int(seconds * 2500)
            latencies, wall = asyncio.run(closed_loop(url, [payload] * count, 64, headers))
            stop.set()
            if resizing:
                thread.join()
            ms = np.asarray(latencies) * 1000
            rows[label] = {
                "requests": len(latencies),
                "seconds": wall,
                "p50_ms": float(np.percentile(ms, 50)),
                "p99_ms": float(np.percentile(ms, 99)),
                "resizes": len(pauses),
                "pause_max_ms": max(pauses, default=0.0),
                "pause_mean_ms": float(np.mean(pauses)) if pauses else 0.0,
            }
            if resizing:
                base = ends.http
                stream = urllib.request.Request(
                    f"{base}/v2/models/countdown/generate_stream",
                    json.dumps({"COUNT": 20}).encode(),
                    {"Content-Type": "application/json"},
                    method="POST",
                )
                with urllib.request.urlopen(stream, timeout=60) as answer:
                    answer.read()
                _post(f"{base}/v2/models/digits-diffusion/generate", {"prompt": "a 7", "steps": 20})
                plans = _get(f"{base}/v2/sordino/memory")["plans"]
    return rows, plans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    results: dict[str, object] = {}

    table = Table(title="Arena.resize: a segment twice the size, live blocks copied")
    for column in ("live", "copied", "pause", "contents intact"):
        table.add_column(column, justify="right")
    cost = {}
    for live in (8, 32, 128):
        row = resize_cost(live)
        cost[f"{live} MiB"] = row
        table.add_row(f"{live} MiB", f"{row['copied_mib']:.0f} MiB", f"{row['pause_ms']:.1f} ms",
                      "yes" if row["intact"] else "NO")  # fmt: skip
    console.print(table)
    results["resize_cost"] = cost

    rows, plans = under_load(args.seconds)
    table = Table(title="digits classifier, 64 clients, pool_size auto (16..128 MiB)")
    for column in ("run", "requests", "p50", "p99", "resizes", "pause mean", "pause max"):
        table.add_column(column, justify="right")
    for label, row in rows.items():
        table.add_row(
            label,
            str(int(row["requests"])),
            f"{row['p50_ms']:.1f} ms",
            f"{row['p99_ms']:.1f} ms",
            str(int(row["resizes"])),
            f"{row['pause_mean_ms']:.1f} ms",
            f"{row['pause_max_ms']:.1f} ms",
        )
    console.print(table)
    results["under_load"] = rows

    table = Table(title="step plans: one region per request (greedy by size) vs naive sum")
    for column in ("model", "steps", "planned region", "naive sum", "ratio",
                   "output region reserved", "used at most", "fallbacks"):  # fmt: skip
        table.add_column(column, justify="right")
    for plan in plans:
        ratio = plan["naive_bytes"] / max(1, plan["planned_peak_bytes"])
        table.add_row(plan["model"], str(plan["steps"]), f"{plan['planned_peak_bytes']} B",
                      f"{plan['naive_bytes']} B", f"{ratio:.1f}x",
                      f"{plan['region_bytes']} B", f"{plan['region_peak_bytes']} B",
                      str(plan["region_fallbacks"]))  # fmt: skip
    console.print(table)
    results["plans"] = plans
    console.print(f"saved {save('prewarm', results)}")


if __name__ == "__main__":
    main()
