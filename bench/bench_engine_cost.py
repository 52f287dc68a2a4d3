"""The engine's CPU a request, without a transport: what issue 30's engine costs (W1-sized
digits classifier, 64 in flight by default).

    python -m bench.bench_engine_cost                          # this checkout, 3 runs
    python -m bench.bench_engine_cost --base /work/main --pairs 3   # main and this, alternated
    python -m bench.bench_engine_cost --base /work/main --concurrency 1  # the c1 path

A real server in a child process (``sordino.testing.serve_in_thread``, the built-in digits
classifier, default settings); on its event loop 64 tasks (``--concurrency``) each call
``InferenceService.infer`` on an already decoded request (one FP32 row), one after another,
for ``--seconds`` a round: the service (tenant, validation, admission, ticket), the
scheduler (request, queue, batcher, outcomes), staging into the arena, the worker pipe and
the telemetry, but no HTTP, gRPC, decode or encode. The figure is the loop thread's own
CPU time (``time.thread_time``) over the requests answered, the median of ``--rounds``
rounds after one unmeasured; the worker process is not counted. With ``--base DIR`` the
same runs alternate with DIR's ``src/`` (base, this, base, this …) so both share the
machine's noise. Results go to ``bench/results/engine_cost.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.common import (
    alternated,
    alternation_arguments,
    child_run,
    console,
    report_alternation,
    save,
)

CHILD = r"""
import asyncio, json, statistics, sys, time
import numpy as np
from sordino.config import load_config
from sordino.inference import InferRequest
from sordino.testing import serve_in_thread

rounds, seconds, clients = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
rows = np.random.default_rng(0).integers(0, 17, size=(256, 64)).astype(np.float32)
runtimes = []
with serve_in_thread(load_config(None, {}), prepare=runtimes.append) as server:
    parts = runtimes[0].inference

    async def cell():
        route = parts.registry.route("digits-classifier")
        stop = time.perf_counter() + seconds
        count = 0

        async def client(i):
            nonlocal count
            while time.perf_counter() < stop:
                request = InferRequest(model="digits-classifier",
                                       inputs={"pixels": rows[i % 256][None, :]},
                                       input_datatypes={"pixels": "FP32"})
                response = await parts.service.infer(request, route)
                response.release()
                count += 1
                i += clients

        started = time.thread_time()
        await asyncio.gather(*(client(i) for i in range(clients)))
        return (time.thread_time() - started) / count * 1e6, count / seconds

    cells = [asyncio.run_coroutine_threadsafe(cell(), server.loop).result()
             for _ in range(rounds + 1)][1:]
print(json.dumps({"us": [c[0] for c in cells], "rate": [c[1] for c in cells]}))
"""


def one_run(src: Path, rounds: int, seconds: float, clients: int = 64) -> dict[str, Any]:
    """One child process on ``src``: its rounds' µs of loop CPU a request."""
    command = [sys.executable, "-c", CHILD, str(rounds), str(seconds), str(clients)]
    return child_run(command, src, timeout=300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    alternation_arguments(parser)
    parser.add_argument(
        "--concurrency", type=int, default=64, help="requests in flight (1: the c1 path)"
    )
    args = parser.parse_args()
    codes = alternated(args.base)
    runs: dict[str, list[float]] = {label: [] for label, _ in codes}
    for pair in range(args.pairs):
        for label, src in codes:
            result = one_run(src, args.rounds, args.seconds, args.concurrency)
            runs[label].append(result["median_us"])
            rate = statistics.median(result["rate"])
            console.print(f"[{pair + 1}/{args.pairs}] {label}: {result['median_us']:.1f} µs "
                          f"CPU a request on the loop ({rate:,.0f} req/s, "
                          f"{1e6 / rate * args.concurrency:.0f} µs wall a request)")  # fmt: skip
    report: dict[str, Any] = {
        "benchmark": "engine_cost",
        "concurrency": args.concurrency,
        "runs_us": runs,
    }
    report_alternation(runs, report, "a request")
    console.print(f"wrote {save('engine_cost', report)}")


if __name__ == "__main__":
    main()
