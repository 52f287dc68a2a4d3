"""The HTTP front end's CPU per request, A/B against another checkout (issue 16).

    python -m bench.bench_http_front                          # this checkout only
    python -m bench.bench_http_front --base /work/base-http16  # A/B: base src vs this src
    python -m bench.bench_http_front --profile profile.json     # py-spy the server at c64

One ``sordino start`` per checkout serving W1 with bench_triton's settings (max batch 32,
10 ms batching delay, 2 intra-op threads), the same lean HTTP load generator
(``bench/peer_load.py``: KServe binary tensors, keep-alive, one request in flight per
connection), cells interleaved (A, B, A, B …) at 64 and 1 in flight. Per cell: req/s,
p50, p99 and CPU ms per request of the front-end process and of the whole tree (psutil).
Medians over ``--repeat`` rounds and the B/A ratios are printed and saved to
``bench/results/http_front.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench import peer_load
from bench.common import console, save, sordino_server

ROWS = 256
HERE = Path(__file__).resolve().parents[1]


def _cpu(pid: int) -> tuple[float, float]:
    """CPU seconds so far of the front-end process and of its whole tree."""
    root = psutil.Process(pid)
    own = root.cpu_times()
    front = own.user + own.system
    tree = front
    for child in root.children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.NoSuchProcess:
            continue
        tree += times.user + times.system
    return front, tree


def cell(url: str, pid: int, requests: list[bytes], concurrency: int, seconds: float,
         warmup: float) -> dict[str, Any]:  # fmt: skip
    """One closed loop; every status must be 200."""
    asyncio.run(peer_load.http_closed_loop(url, requests, concurrency, warmup))
    front0, tree0 = _cpu(pid)
    answers = asyncio.run(peer_load.http_closed_loop(url, requests, concurrency, seconds))
    front1, tree1 = _cpu(pid)
    bad = sum(1 for s in answers.statuses if s != 200)
    if bad:
        raise SystemExit(f"{bad} answers were not 200; the first: {answers.bodies[0][:300]!r}")
    n = max(len(answers.latencies), 1)
    lat = np.asarray(answers.latencies) * 1000
    return {
        "concurrency": concurrency,
        "rate": n / answers.seconds,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "front_cpu_ms": (front1 - front0) * 1000 / n,
        "tree_cpu_ms": (tree1 - tree0) * 1000 / n,
    }


def profile(url: str, pid: int, requests: list[bytes], seconds: float, out: Path) -> None:
    """py-spy the front-end process (no native frames) under c64 for ``seconds``."""
    spy = Path(os.environ.get("PY_SPY", Path(sys.executable).parent / "py-spy"))
    proc = subprocess.Popen(
        [str(spy), "record", "--rate", "200", "--pid", str(pid), "--format", "speedscope",
         "--duration", str(int(seconds)), "--output", str(out), "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.0)  # py-spy attaches
    answers = asyncio.run(peer_load.http_closed_loop(url, requests, 64, seconds + 1))
    proc.wait(timeout=60)
    console.print(f"profiled {len(answers.latencies)} requests; speedscope profile in {out}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.bench_workloads import server_config, workload

    w1 = workload("w1", None, None)
    inputs = np.random.default_rng(0).random((ROWS, 256), dtype=np.float32)
    checkouts = {"this": HERE}
    if args.base:
        checkouts = {"base": Path(args.base).resolve(), "this": HERE}
    cells: list[dict[str, Any]] = []
    with ExitStack() as stack, tempfile.TemporaryDirectory() as scratch:
        config = server_config(w1, Path(scratch), 2, "adaptive", 100.0)
        servers = {}
        for label, root in checkouts.items():
            env = {"PYTHONPATH": f"{root / 'src'}:{HERE}"}
            servers[label] = stack.enter_context(
                sordino_server(["--no-builtin", "--config", str(config)], env=env)
            )
        if args.profile:
            s = servers["this"]
            host = s.http.split("//", 1)[1]
            requests = [peer_load.kserve_http_request(host, "w1", "x", r) for r in inputs]
            profile(s.http, s.pid, requests, args.seconds * 2, Path(args.profile))
            return {}
        for r in range(args.repeat):
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                for label, s in servers.items():
                    host = s.http.split("//", 1)[1]
                    requests = [peer_load.kserve_http_request(host, "w1", "x", r) for r in inputs]
                    c = cell(s.http, s.pid, requests, concurrency, args.seconds, args.warmup)
                    c.update(checkout=label, repeat=r)
                    cells.append(c)
                    console.print(
                        f"{label:5} c{concurrency:<3} {c['rate']:7.0f} req/s  p50 "
                        f"{c['p50_ms']:6.2f} ms  p99 {c['p99_ms']:6.2f} ms  front "
                        f"{c['front_cpu_ms']:.3f} ms  tree {c['tree_cpu_ms']:.3f} ms CPU/req"
                    )
    keys = ("rate", "p50_ms", "p99_ms", "front_cpu_ms", "tree_cpu_ms")
    medians: dict[str, dict[str, float]] = {}
    for c in cells:
        name = f"{c['checkout']} c{c['concurrency']}"
        medians.setdefault(name, {})
    for name in medians:
        chosen = [c for c in cells if f"{c['checkout']} c{c['concurrency']}" == name]
        medians[name] = {k: statistics.median(c[k] for c in chosen) for k in keys}
    console.print("\nmedians:")
    for name, m in medians.items():
        console.print(f"  {name:9} " + "  ".join(f"{k} {v:.3f}" for k, v in m.items()))
    if args.base:
        for concurrency in args.concurrency.split(","):
            a, b = medians[f"base c{concurrency}"], medians[f"this c{concurrency}"]
            console.print(
                f"  this/base c{concurrency}: "
                + "  ".join(f"{k} {b[k] / a[k]:.2f}" for k in keys if a[k])
            )
    return {"cells": cells, "medians": medians}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="another checkout's root (its src/ is served as 'base')")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds a cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds a cell")
    parser.add_argument("--repeat", type=int, default=3, help="rounds over every cell")
    parser.add_argument("--concurrency", default="64,1", help="requests in flight")
    parser.add_argument("--profile", help="py-spy this checkout's server at c64 into this file")
    args = parser.parse_args()
    result = run(args)
    if result:
        save("http_front", {"args": vars(args), **result})


if __name__ == "__main__":
    main()
