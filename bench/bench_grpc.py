"""Issue 16: gRPC against HTTP at 64 in flight, this checkout beside another one.

    python -m bench.bench_grpc                               # this checkout only
    python -m bench.bench_grpc --compare /work/base-grpc     # beside an earlier checkout

W1 (the MLP of bench/models.py) served by ``sordino start`` with bench_workloads' peer
settings (max batch 32, 10 ms wait, adaptive mode, p99 target 100 ms, 2 intra-op
threads). For each checkout a server runs in its own process and two lean closed-loop
clients take turns, binary HTTP (aiohttp) and gRPC (grpc.aio, requests serialized
before the clock starts), 64 in flight; the rounds alternate checkout and protocol
(A-http, A-grpc, B-http, B-grpc, then B before A) so a busy moment on the machine hits both.
Each row gives req/s, p50, p99, the mean batch the server formed (its batch-size
histogram in ``/metrics``) and CPU per request of the server process, its workers and
the client. The table reports the median of the rounds; every 17th answer is checked
against in-process ONNX Runtime.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from rich.table import Table

from bench import models
from bench.bench_workloads import Workload, server_config
from bench.common import (
    Endpoints,
    batch_metrics,
    binary_request,
    closed_loop,
    console,
    decode_output,
    grpc_closed_loop,
    save,
    sordino_server,
    summarize,
)

HERE = Path(__file__).resolve().parent.parent


def measure(
    ends: Endpoints, protocol: str, w: Workload, arrays: list[np.ndarray], count: int,
    check: Any,
) -> dict[str, float]:  # fmt: skip
    """One closed-loop round of ``count`` requests at ``w.concurrency`` in flight."""
    if protocol == "grpc":

        def run(n: int) -> tuple[list[float], float]:
            return asyncio.run(
                grpc_closed_loop(ends.grpc, w.name, w.input_name, "FP32", arrays[:n],
                                 w.concurrency, check)
            )  # fmt: skip
    else:
        framed = [binary_request(w.input_name, a) for a in arrays[:count]]
        headers = {"Inference-Header-Content-Length": framed[0][1]}
        url = f"{ends.http}/v2/models/{w.name}/infer"

        def run(n: int) -> tuple[list[float], float]:
            return asyncio.run(
                closed_loop(url, [body for body, _ in framed[:n]], w.concurrency, headers,
                            lambda i, raw, length: check(i, decode_output(raw, length)))
            )  # fmt: skip

    run(200)  # warm-up: connections, the controller's first adjustments
    before, cpu_before = batch_metrics(ends.http, w.name), ends.cpu_seconds()
    latencies, seconds = run(count)
    after, cpu_after = batch_metrics(ends.http, w.name), ends.cpu_seconds()
    mean = (after[1] - before[1]) / max(after[0] - before[0], 1)
    m = summarize(protocol, w.concurrency, latencies, seconds, mean)
    row = {"req_s": m.rate, "p50_ms": m.p50_ms, "p99_ms": m.p99_ms, "mean_batch": mean,
           **controller(ends.http)}  # fmt: skip
    for part in cpu_after:
        row[f"cpu_ms_{part}"] = (cpu_after[part] - cpu_before[part]) * 1000 / count
    return row


def controller(url: str) -> dict[str, float]:
    """The adaptive controller's batch cap and wait at the end of a round."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    found = {}
    for family in text_string_to_metric_families(
        urllib.request.urlopen(f"{url}/metrics").read().decode()
    ):
        for sample in family.samples:
            if sample.name == "sordino_scheduler_max_batch":
                found["cap"] = sample.value
            elif sample.name == "sordino_scheduler_max_delay_seconds":
                found["wait_ms"] = sample.value * 1000
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", type=Path, help="another checkout to run beside this one")
    parser.add_argument("--requests", type=int, default=4000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    w = Workload("w1", models.mlp(), "x", (256,), 64, args.requests, 0, "adaptive")
    session = ort.InferenceSession(str(w.model_file), providers=["CPUExecutionProvider"])
    inputs = np.random.default_rng(0).random((256, 256), dtype=np.float32)
    expected = session.run(None, {"x": inputs})[0]
    arrays = [inputs[i % len(inputs)][None] for i in range(args.requests)]

    def check(i: int, got: np.ndarray) -> None:
        if i % 17 == 0 and not np.allclose(got.ravel(), expected[i % len(inputs)], atol=1e-4):
            raise AssertionError(f"answer {i} differs from in-process onnxruntime")

    checkouts = {"this": HERE}
    if args.compare is not None:
        checkouts = {"compare": args.compare.resolve(), **checkouts}
    rows: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch, ExitStack() as stack:
        config = server_config(w, Path(scratch), 2, "adaptive", 100.0)
        servers = {
            name: stack.enter_context(
                sordino_server(
                    ["--no-builtin", "--config", str(config)],
                    env={"PYTHONPATH": f"{path / 'src'}{os.pathsep}{HERE}"},
                )
            )
            for name, path in checkouts.items()
        }
        for round_ in range(args.rounds):
            # A, B then B, A: neither checkout always runs first.
            order = list(servers.items())
            for name, ends in order if round_ % 2 == 0 else order[::-1]:
                for protocol in ("http", "grpc"):
                    row = measure(ends, protocol, w, arrays, args.requests, check)
                    rows.setdefault(f"{name} {protocol}", []).append(row)
                    console.print(f"round {round_ + 1}: {name} {protocol}: {row['req_s']:,.0f} "
                                  f"req/s, p99 {row['p99_ms']:.0f} ms, mean batch "
                                  f"{row['mean_batch']:.1f}; then cap {row['cap']:.0f}, wait "
                                  f"{row['wait_ms']:.2f} ms")  # fmt: skip
    medians = {
        label: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for label, runs in rows.items()
    }
    table = Table(title=f"W1, 64 in flight, median of {args.rounds} rounds")
    columns = ["req/s", "p50 ms", "p99 ms", "mean batch", "CPU ms/req server", "workers",
               "client"]  # fmt: skip
    table.add_column("checkout, protocol")
    for column in columns:
        table.add_column(column, justify="right")
    for label, m in medians.items():
        table.add_row(
            label, f"{m['req_s']:,.0f}", f"{m['p50_ms']:.1f}", f"{m['p99_ms']:.1f}",
            f"{m['mean_batch']:.1f}", f"{m['cpu_ms_server']:.2f}", f"{m['cpu_ms_workers']:.2f}",
            f"{m['cpu_ms_client']:.2f}",
        )  # fmt: skip
    console.print(table)
    for name in checkouts:
        http, grpc = medians[f"{name} http"], medians[f"{name} grpc"]
        console.print(
            f"{name}: gRPC/HTTP req/s {grpc['req_s'] / http['req_s']:.2f}, "
            f"mean batch {grpc['mean_batch'] / max(http['mean_batch'], 1e-9):.2f}"
        )
    report = {
        "benchmark": "grpc",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "checkouts": {name: str(path) for name, path in checkouts.items()},
        "rounds": rows,
        "medians": medians,
    }
    console.print(f"wrote {save('grpc', report)}")


if __name__ == "__main__":
    main()
