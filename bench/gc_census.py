"""What the cycle collector does while the server serves W1 at 64 in flight (issue 30).

    python -m bench.gc_census                       # this checkout, 4 s a phase
    python -m bench.gc_census --src /other/checkout/src --seconds 6
    python -m bench.gc_census --grpc                # gRPC ModelInfer instead of HTTP

A request that leaves a reference cycle behind (a closure held by what it closes over,
an exception kept with its traceback) is freed only when the collector finds it, and
every tracked object allocated counts towards the next collection. This runs
``sordino start`` with bench_triton's "sordino" settings on W1 and the lean closed-loop
client of ``bench/peer_load.py``, and asks the server, through a ``sitecustomize``
put first on its ``PYTHONPATH`` (signals, so nothing of it is in ``sordino``):

- **collections** — for ``--seconds`` of load, the collections of each generation: how
  many, their time (mean, longest, total and its share of the phase) and the objects
  they freed;
- **garbage** — for ``--seconds`` more, the collector keeps what it finds
  (``gc.DEBUG_SAVEALL``): the unreachable objects by type, per request. A server that
  makes no cycles a request shows only what the client's closing connections leave.

Results go to ``bench/results/gc_census.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
from rich.table import Table

from bench import peer_load
from bench.bench_workloads import server_config, workload
from bench.common import console, save, sordino_server

_SITECUSTOMIZE = """
import gc, json, os, signal, time
from collections import Counter

_OUT = os.environ["SORDINO_GC_CENSUS"]
_times = {}
_timing = [False, 0.0]


def _callback(phase, info):
    if not _timing[0]:
        return
    if phase == "start":
        _timing[1] = time.perf_counter()
        return
    took = time.perf_counter() - _timing[1]
    count, total, longest, freed = _times.get(info["generation"], (0, 0.0, 0.0, 0))
    _times[info["generation"]] = (
        count + 1, total + took, max(longest, took), freed + info.get("collected", 0)
    )


def _time(*_):
    _times.clear()
    _timing[0] = True


def _census(*_):
    _timing[0] = False
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)


def _report(*_):
    gc.collect()
    kinds = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage)
    gc.set_debug(0)
    gc.garbage.clear()
    with open(_OUT, "w") as out:
        json.dump({"collections": {str(g): v for g, v in _times.items()},
                   "garbage": kinds.most_common(30)}, out)


gc.callbacks.append(_callback)
signal.signal(signal.SIGUSR1, _time)
signal.signal(signal.SIGUSR2, _census)
signal.signal(signal.SIGHUP, _report)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--src", type=Path, help="the src/ to serve (default: this checkout's)")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each phase")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--grpc", action="store_true", help="gRPC ModelInfer instead of HTTP")
    parser.add_argument("--frontends", type=int, default=1, help="server.frontends")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    src = (args.src or here / "src").resolve()
    w1 = workload("w1", None, None)
    rows = np.random.default_rng(0).random((256, 256), dtype=np.float32)
    with tempfile.TemporaryDirectory() as scratch:
        hook = Path(scratch) / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        out = Path(scratch) / "census.json"
        env = {"PYTHONPATH": os.pathsep.join([str(hook), str(src), str(here)]),
               "SORDINO_GC_CENSUS": str(out)}  # fmt: skip
        config = server_config(w1, Path(scratch), 2, "adaptive", 100.0)
        start = ["--no-builtin", "--config", str(config), "--frontends", str(args.frontends)]
        with sordino_server(start, env=env) as server:
            host = urlparse(server.http).netloc
            if args.grpc:
                requests = [peer_load.kserve_grpc_request("w1", "x", row) for row in rows]
            else:
                requests = [peer_load.kserve_http_request(host, "w1", "x", row) for row in rows]

            def load(seconds: float) -> int:
                if args.grpc:
                    closed_loop = peer_load.grpc_closed_loop(
                        server.grpc, requests, args.concurrency, seconds
                    )
                else:
                    closed_loop = peer_load.http_closed_loop(
                        server.http, requests, args.concurrency, seconds
                    )
                return len(asyncio.run(closed_loop).latencies)

            transport = "gRPC" if args.grpc else "HTTP"
            console.print(
                f"serving W1 from {src} over {transport} at {args.concurrency} in flight"
                f" ({args.frontends} front-end process{'es' if args.frontends > 1 else ''})"
            )
            load(1.5)  # warm-up
            os.kill(server.pid, signal.SIGUSR1)
            timed = load(args.seconds)
            os.kill(server.pid, signal.SIGUSR2)
            censused = load(args.seconds)
            os.kill(server.pid, signal.SIGHUP)
            for _ in range(100):
                if out.exists():
                    break
                time.sleep(0.1)
            report: dict[str, Any] = json.loads(out.read_text())
    table = Table(title=f"the collector over {args.seconds:g} s, {timed:,} requests")
    for column in (
        "generation",
        "collections",
        "mean",
        "longest",
        "total",
        "of the phase",
        "freed",
    ):
        table.add_column(column, justify="right")
    for generation, (count, total, longest, freed) in sorted(report["collections"].items()):
        table.add_row(generation, f"{count:,}", f"{total / count * 1e6:.0f} µs",
                      f"{longest * 1e3:.2f} ms", f"{total * 1e3:.1f} ms",
                      f"{total / args.seconds:.1%}", f"{freed:,}")  # fmt: skip
    console.print(table)
    garbage = Table(
        title=f"unreachable objects found over {args.seconds:g} s, {censused:,} requests"
    )
    garbage.add_column("type")
    garbage.add_column("objects", justify="right")
    garbage.add_column("a request", justify="right")
    for kind, count in report["garbage"]:
        garbage.add_row(kind, f"{count:,}", f"{count / max(censused, 1):.3f}")
    console.print(garbage)
    save("gc_census", {"src": str(src), "timed_requests": timed, "census_requests": censused,
                       **report})  # fmt: skip


if __name__ == "__main__":
    main()
