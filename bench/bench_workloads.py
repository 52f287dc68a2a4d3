"""Workload benchmarks W1 (light MLP) and W2 (compute-bound CNN), side by side with the limit.

    python -m bench.bench_workloads w1            # HTTP JSON, HTTP binary, gRPC vs ONNX Runtime
    python -m bench.bench_workloads w2 --slo-ms 100
    python -m bench.bench_workloads w1 --open-loop

For each transport, ``sordino start`` serves the model in its own process with the
peers' settings (max batch 32, 10 ms wait, one instance, 2 intra-op threads; W1 in the
default adaptive mode, W2 in auto mode), and a client in this process (aiohttp, or
tritonclient's gRPC aio client) sends a closed loop at 64 (W1) or 16 (W2) concurrent,
then one request at a time. ``--slo-ms`` is the scheduler's p99 target and the bound
the report checks the concurrent rows against. ONNX Runtime in-process at batch 1 and
at its best batch size gives the limit, measured in the same run. A sample of answers
is checked against in-process ONNX Runtime. ``--open-loop`` also searches the highest
fixed arrival rate the server sustains with p99 <= 50 ms.

``--instances`` and ``--spinning`` set the model's ``instance_count`` and
``thread_spinning``; ``--defaults`` sets no thread count anywhere, so sordino's derived
defaults run against ONNX Runtime's own (a thread per physical core, spinning on).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from bench import models
from bench.common import (
    Measurement,
    batch_metrics,
    binary_request,
    closed_loop,
    console,
    decode_output,
    grpc_closed_loop,
    json_request,
    open_loop,
    progress,
    save,
    show,
    sordino_server,
    summarize,
)


@dataclass(frozen=True)
class Workload:
    name: str
    model_file: Path
    input_name: str
    item_shape: tuple[int, ...]
    concurrency: int
    requests: int
    single: int
    mode: str


def workload(name: str, requests: int | None, single: int | None) -> Workload:
    if name == "w1":
        return Workload(
            "w1", models.mlp(), "x", (256,), 64, requests or 2000, single or 300, "adaptive"
        )
    # W2 runs in auto mode: the batch cap comes from the model's measured curve.
    return Workload(
        "w2", models.cnn(), "image", (3, 64, 64), 16, requests or 600, single or 100, "auto"
    )


def raw_limit(w: Workload, threads: int | None) -> list[Measurement]:
    """ONNX Runtime in-process: batch 1, and the best of batch 1..32 (always two rows).

    ``threads`` None leaves ONNX Runtime at its own defaults (a thread per physical
    core, spinning on)."""
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(w.model_file), options, providers=["CPUExecutionProvider"])
    rows = []
    for batch in (1, 4, 8, 16, 32):
        x = np.random.default_rng(batch).random((batch, *w.item_shape), dtype=np.float32)
        session.run(None, {w.input_name: x})
        latencies = []
        start = time.perf_counter()
        while time.perf_counter() - start < 1.0:
            t = time.perf_counter()
            session.run(None, {w.input_name: x})
            latencies.append(time.perf_counter() - t)
        seconds = time.perf_counter() - start
        m = summarize(f"onnxruntime in-process, batch {batch}", 1, latencies, seconds, batch)
        rows.append(
            Measurement(m.label, 1, len(latencies) * batch, seconds, m.p50_ms, m.p99_ms, batch)
        )
    return [rows[0], max(rows, key=lambda m: m.rate)]


def server_config(
    w: Workload, directory: Path, args: argparse.Namespace | int, mode: str, slo_ms: float
) -> Path:
    """The server's configuration: the peers' batching settings; threads, instances and
    spinning only where given (``--defaults`` leaves all three to sordino). ``args`` as
    an int: the intra-op threads alone (the other benchmarks' call)."""
    if isinstance(args, int):
        args = argparse.Namespace(threads=args, instances=None, spinning=None)
    path = directory / "runtime_config.yaml"
    extra = ""
    if args.threads is not None:
        extra += f"    intra_op_threads: {args.threads}\n"
    if args.instances is not None:
        extra += f"    instance_count: {args.instances}\n"
    if args.spinning is not None:
        extra += f"    thread_spinning: {str(args.spinning == 'on').lower()}\n"
    path.write_text(
        "scheduler:\n"
        f"  mode: {mode}\n"
        f"  slo_p99_ms: {slo_ms}\n"
        "  strategies:\n"
        "    - {name: dynamic_batching, max_batch: 32, timeout_ms: 10}\n"
        "models:\n"
        f"  - name: {w.name}\n"
        f"    path: {w.model_file}\n"
        "    max_batch_size: 32\n" + extra
    )
    return path


def run(args: argparse.Namespace) -> None:
    w = workload(args.workload, args.requests, args.single)
    session = ort.InferenceSession(str(w.model_file), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    inputs = rng.random((256, *w.item_shape), dtype=np.float32)
    expected = session.run(None, {w.input_name: inputs})[0]
    rows: list[Measurement] = []
    open_rows: dict[str, float] = {}
    cpu_ms: dict[str, dict[str, float]] = {}
    transports = args.transports.split(",")
    # The limit is measured before and after the server runs; the better figure is kept,
    # so a busy moment on the machine can only make sordino's ratio look worse.
    limit_before = raw_limit(w, args.threads)
    n = max(w.requests, w.single)
    arrays = [inputs[i % len(inputs)][None] for i in range(n)]

    def agrees(i: int, got: np.ndarray) -> None:
        if i % 17 == 0 and not np.allclose(
            got.ravel(), expected[i % len(inputs)].ravel(), rtol=1e-3, atol=1e-4
        ):
            raise AssertionError(f"answer {i} differs from in-process onnxruntime")

    with tempfile.TemporaryDirectory() as scratch, progress() as bar:
        config = server_config(w, Path(scratch), args, args.mode or w.mode, args.slo_ms)
        with sordino_server(["--no-builtin", "--config", str(config)]) as ends:
            infer = f"{ends.http}/v2/models/{w.name}/infer"
            for transport in transports:
                label = "sordino gRPC" if transport == "grpc" else f"sordino HTTP {transport}"
                bodies: list[bytes] = []
                headers: dict[str, str] = {}
                if transport == "json":
                    bodies = [json_request(w.input_name, a) for a in arrays]
                    headers = {"Content-Type": "application/json"}
                elif transport == "binary":
                    framed = [binary_request(w.input_name, a) for a in arrays]
                    bodies = [framed_body for framed_body, _ in framed]
                    headers = {"Inference-Header-Content-Length": framed[0][1]}

                def load(
                    count: int, concurrency: int, task: Any, transport: str = transport,
                    bodies: list[bytes] = bodies, headers: dict[str, str] = headers,
                ) -> tuple[list[float], float]:  # fmt: skip
                    def done(t: Any = task) -> None:
                        bar.advance(t)

                    if transport == "grpc":
                        return asyncio.run(grpc_closed_loop(
                            ends.grpc, w.name, w.input_name, "FP32", arrays[:count],
                            concurrency, agrees, done,
                        ))  # fmt: skip
                    return asyncio.run(closed_loop(
                        infer, bodies[:count], concurrency, headers,
                        lambda i, raw, length: agrees(i, decode_output(raw, length)), done,
                    ))  # fmt: skip

                load(100, 8, bar.add_task(f"{label}: warm-up", total=100))
                for concurrency, count in ((w.concurrency, w.requests), (1, w.single)):
                    task = bar.add_task(f"{label}: {concurrency} concurrent", total=count)
                    before = batch_metrics(ends.http, w.name)
                    cpu_before = ends.cpu_seconds()
                    latencies, seconds = load(count, concurrency, task)
                    cpu_after = ends.cpu_seconds()
                    after = batch_metrics(ends.http, w.name)
                    mean = (after[1] - before[1]) / max(after[0] - before[0], 1)
                    rows.append(summarize(label, concurrency, latencies, seconds, mean))
                    # Where the machine's CPU went, per request, while this row ran.
                    cpu_ms[f"{label} c{concurrency}"] = {
                        part: (cpu_after[part] - cpu_before[part]) * 1000 / count
                        for part in cpu_after
                    }
                if args.open_loop and transport != "grpc":
                    open_rows[transport] = search_rate(infer, bodies, headers, bar, args.p99_ms)
    limit_after = raw_limit(w, args.threads)
    limit = [
        max(a, b, key=lambda m: m.rate) for a, b in zip(limit_before, limit_after, strict=True)
    ]
    served = len(rows)
    rows += limit
    show(f"{w.name.upper()}: {w.model_file.name}", rows, unit="req/s (rows/s)")
    best = max(limit, key=lambda m: m.rate)
    ratios = {f"{r.label} c{r.concurrency} / raw best": r.rate / best.rate for r in rows[:served]}
    for label, ratio in ratios.items():
        console.print(f"{label}: {ratio:.3f}")
    for label, parts in cpu_ms.items():
        spent = ", ".join(f"{part} {ms:.2f}" for part, ms in parts.items())
        console.print(f"CPU ms per request, {label}: {spent}")
    for r in rows[:served]:
        if r.concurrency > 1:
            verdict = "within" if r.p99_ms <= args.slo_ms else "OVER"
            slo = f"{args.slo_ms:g} ms SLO"
            console.print(f"{r.label} c{r.concurrency}: p99 {r.p99_ms:.1f} ms {verdict} the {slo}")
    for transport, rate in open_rows.items():
        console.print(
            f"open loop {transport}: highest rate with p99 <= {args.p99_ms} ms: {rate:.0f} req/s"
        )
    report = {
        "benchmark": w.name,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "onnxruntime": ort.__version__},
        "rows": [r.as_dict() for r in rows],
        "ratios_to_raw_best": ratios,
        "open_loop_max_rate": open_rows,
        "cpu_ms_per_request": cpu_ms,
        "slo_p99_ms": args.slo_ms,
        "mode": args.mode or w.mode,
        "threads": args.threads, "instances": args.instances, "spinning": args.spinning,
        "load_average": os.getloadavg(),
    }  # fmt: skip
    console.print(f"wrote {save(w.name, report)}")


def search_rate(
    infer: str, bodies: list[bytes], headers: dict[str, str], bar, p99_ms: float
) -> float:  # type: ignore[no-untyped-def]
    """Highest fixed arrival rate (req/s) whose p99 stays within ``p99_ms``, by bisection."""
    low, high = 50.0, 4000.0
    task = bar.add_task("open loop: rate search", total=7)
    for _ in range(7):
        rate = (low + high) / 2
        count = min(len(bodies), max(100, int(rate * 2)))  # about two seconds of traffic
        latencies, _, failures = asyncio.run(open_loop(infer, bodies[:count], rate, headers))
        p99 = float(np.percentile(np.asarray(latencies) * 1000, 99))
        if failures == 0 and p99 <= p99_ms:
            low = rate
        else:
            high = rate
        bar.advance(task)
    return low


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=["w1", "w2"])
    parser.add_argument("--transports", default="json,binary,grpc")
    parser.add_argument("--requests", type=int, help="requests in the concurrent closed loop")
    parser.add_argument("--single", type=int, help="requests sent one at a time")
    parser.add_argument(
        "--threads", type=int, help="ONNX Runtime intra-op threads, server and raw (default 2)"
    )
    parser.add_argument(
        "--instances", type=int, help="the model's instance_count (default: sordino's)"
    )
    parser.add_argument(
        "--spinning", choices=["on", "off"], help="thread_spinning (default: sordino's)"
    )
    parser.add_argument(
        "--defaults", action="store_true",
        help="no threads setting anywhere: sordino's derived defaults against ONNX Runtime's own",
    )  # fmt: skip
    parser.add_argument("--mode", help="scheduler mode (default: adaptive for w1, auto for w2)")
    parser.add_argument("--slo-ms", type=float, default=100.0, help="p99 target (ms)")
    parser.add_argument("--open-loop", action="store_true")
    parser.add_argument("--p99-ms", type=float, default=50.0, help="open-loop latency bound")
    args = parser.parse_args()
    if args.threads is None and not args.defaults:
        args.threads = 2
    run(args)


if __name__ == "__main__":
    main()
