"""The worker hop (issue 16): the pipe's round trip per batch, and W1 served by two checkouts.

    python -m bench.bench_hop                                   # round trip only
    python -m bench.bench_hop --compare /work/base-hop          # + W1 side by side

Round trip: a spawned child process answers a typical batch (a ``Run`` with one input
and one output reserved, answered by a ``Done``) over a socket pair, ``--round-trips``
times, the way the server and a worker talk: once pickled through
``multiprocessing.Connection`` (``send``/``poll``/``recv``, the hop before issue 16), once
as binary frames (:func:`sordino.execution.messages.encode`, one ``os.read`` per wake-up).
Both run in this one process, interleaved; it prints microseconds and CPU microseconds
(both processes) per round trip.

``--compare CHECKOUT`` also runs ``sordino start`` on the W1 MLP (bench/models.py; max
batch 32, 10 ms wait, one instance, as ``bench_workloads``) from this checkout and from
``CHECKOUT`` (its ``src`` first on ``PYTHONPATH``), alternating A, B, A, B for
``--rounds`` rounds, HTTP JSON at 64 in flight and one at a time (``--workload w2``: the
W2 CNN, binary HTTP, 16 in flight, auto mode): req/s, p50/p99, mean
batch and CPU ms per request of the server process and of its workers (psutil). With
``--threads N`` both get ``intra_op_threads: N``; without it each uses its own default.
``--spinning-row`` adds this checkout with ``thread_spinning: true`` (the frames alone,
ONNX Runtime's threads spinning as before).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import select
import statistics
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench import models
from bench.common import (
    batch_metrics,
    binary_request,
    closed_loop,
    console,
    json_request,
    save,
    sordino_server,
    summarize,
)
from sordino.execution.messages import Done, FrameReader, Run, encode
from sordino.memory.tensors import TensorHandle

RUN = Run(
    123456,
    {"x": TensorHandle(4096, 32 * 1024, "<f4", (32, 256), 32 * 1024)},
    {"y": TensorHandle(65536, 0, "", (), 4096)},
    None,
    "psm_0123abcd",
)
DONE = Done(123456, {"y": TensorHandle(65536, 32 * 40, "<f4", (32, 10), 4096)}, 0.000321)


def _echo_pickled(conn: Connection) -> None:
    while True:
        try:
            conn.recv()
        except EOFError:
            return
        conn.send(DONE)


def _echo_framed(conn: Connection) -> None:
    fd, reader, done = conn.fileno(), FrameReader(), encode(DONE)
    while True:
        data = os.read(fd, 1 << 16)
        if not data:
            return
        for _ in reader.feed(data):
            os.write(fd, done)


def round_trips(kind: str, count: int) -> tuple[float, float]:
    """Microseconds and CPU microseconds (both processes) per round trip."""
    spawn = multiprocessing.get_context("spawn")
    mine, theirs = spawn.Pipe(duplex=True)
    target = _echo_pickled if kind == "pickle" else _echo_framed
    child = spawn.Process(target=target, args=(theirs,), daemon=True)
    child.start()
    theirs.close()
    fd = mine.fileno()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    reader = FrameReader()
    me, it = psutil.Process(), psutil.Process(child.pid)

    def one() -> None:
        if kind == "pickle":
            mine.send(RUN)
            poller.poll()  # the event loop's wake-up
            while mine.poll():
                mine.recv()
        else:
            os.write(fd, encode(RUN))
            while True:
                poller.poll()
                if reader.feed(os.read(fd, 1 << 16)):
                    break

    for _ in range(200):
        one()
    cpu = sum(sum(p.cpu_times()[:2]) for p in (me, it))
    started = time.perf_counter()
    for _ in range(count):
        one()
    wall = time.perf_counter() - started
    cpu = sum(sum(p.cpu_times()[:2]) for p in (me, it)) - cpu
    mine.close()
    child.join(10)
    return wall / count * 1e6, cpu / count * 1e6


def hop(count: int, rounds: int) -> dict[str, dict[str, float]]:
    results: dict[str, list[tuple[float, float]]] = {"pickle": [], "frames": []}
    for _ in range(rounds):
        for kind in results:
            results[kind].append(round_trips(kind, count))
    table = {}
    for kind, runs in results.items():
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        table[kind] = {"us_per_round_trip": wall, "cpu_us_per_round_trip": cpu}
        console.print(f"round trip, {kind:6}: {wall:6.1f} us, CPU {cpu:6.1f} us (both processes)")
    return table


# name: (model file, input, item shape, concurrency, scheduler mode), as bench_workloads
WORKLOADS = {
    "w1": (models.mlp, "x", (256,), 64, "adaptive"),
    "w2": (models.cnn, "image", (3, 64, 64), 16, "auto"),
}


def config(directory: Path, workload: str, threads: int | None, spinning: bool) -> Path:
    model, _, _, _, mode = WORKLOADS[workload]
    path = directory / "runtime_config.yaml"
    path.write_text(
        "scheduler:\n"
        f"  mode: {mode}\n"
        "  strategies:\n"
        "    - {name: dynamic_batching, max_batch: 32, timeout_ms: 10}\n"
        "models:\n"
        f"  - name: {workload}\n"
        f"    path: {model()}\n"
        "    max_batch_size: 32\n"
        + (f"    intra_op_threads: {threads}\n" if threads else "")
        + ("    thread_spinning: true\n" if spinning else "")
    )
    return path


def serve(checkout: Path, label: str, args: argparse.Namespace, out: dict[str, list[Any]]) -> None:
    _, input_name, item_shape, in_flight, _ = WORKLOADS[args.workload]
    rng = np.random.default_rng(0)
    arrays = [rng.random((1, *item_shape), dtype=np.float32) for _ in range(64)]
    n = max(args.requests, args.single)
    if args.workload == "w1":  # JSON, as issue 16's figures
        bodies = [json_request(input_name, arrays[i % len(arrays)]) for i in range(n)]
        headers = {"Content-Type": "application/json"}
    else:  # binary: a 48 KiB image in JSON would measure the JSON
        framed = [binary_request(input_name, arrays[i % len(arrays)]) for i in range(n)]
        bodies = [body for body, _ in framed]
        headers = {"Inference-Header-Content-Length": framed[0][1]}
    env = {"PYTHONPATH": f"{checkout / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    with tempfile.TemporaryDirectory() as scratch:
        cfg = config(Path(scratch), args.workload, args.threads, spinning=label == "this+spin")
        with sordino_server(["--no-builtin", "--config", str(cfg)], env=env) as ends:
            infer = f"{ends.http}/v2/models/{args.workload}/infer"
            asyncio.run(closed_loop(infer, bodies[:200], 8, headers))
            for concurrency, count in ((in_flight, args.requests), (1, args.single)):
                before, cpu0 = batch_metrics(ends.http, args.workload), ends.cpu_seconds()
                latencies, seconds = asyncio.run(
                    closed_loop(infer, bodies[:count], concurrency, headers)
                )
                cpu1, after = ends.cpu_seconds(), batch_metrics(ends.http, args.workload)
                mean = (after[1] - before[1]) / max(after[0] - before[0], 1)
                m = summarize(label, concurrency, latencies, seconds, mean)
                cpu = {k: (cpu1[k] - cpu0[k]) * 1000 / count for k in cpu1}
                out[f"{label} c{concurrency}"].append({**m.as_dict(), "cpu_ms": cpu})


def compare(args: argparse.Namespace) -> dict[str, Any]:
    here = Path(__file__).resolve().parent.parent
    checkouts = {"this": here, "compare": Path(args.compare).resolve()}
    if args.spinning_row:
        checkouts["this+spin"] = here
    in_flight = WORKLOADS[args.workload][3]
    out: dict[str, list[Any]] = {f"{label} c{c}": [] for label in checkouts for c in (in_flight, 1)}
    for _ in range(args.rounds):
        for label, checkout in checkouts.items():
            serve(checkout, label, args, out)
    console.print(f"{args.workload.upper()} HTTP, medians of {args.rounds} interleaved rounds:")
    console.print(
        f"{'row':14} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'batch':>6} "
        f"{'server':>7} {'workers':>7} {'total':>7}  (CPU ms per request)"
    )
    table = {}
    for row, runs in out.items():

        def med(key: str, runs: list[Any] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        server = statistics.median(r["cpu_ms"]["server"] for r in runs)
        workers = statistics.median(r["cpu_ms"]["workers"] for r in runs)
        total = statistics.median(r["cpu_ms"]["server"] + r["cpu_ms"]["workers"] for r in runs)
        table[row] = {
            "rate": med("rate"), "p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"),
            "mean_batch": med("mean_batch"), "cpu_ms_server": server,
            "cpu_ms_workers": workers, "cpu_ms_total": total, "runs": runs,
        }  # fmt: skip
        console.print(
            f"{row:14} {med('rate'):8.0f} {med('p50_ms'):7.2f} {med('p99_ms'):7.1f} "
            f"{med('mean_batch'):6.1f} {server:7.3f} {workers:7.3f} {total:7.3f}"
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-trips", type=int, default=5000)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="w1")
    parser.add_argument("--compare", help="another checkout (e.g. a git worktree of main)")
    parser.add_argument("--rounds", type=int, default=2, help="A/B rounds (and hop repeats)")
    parser.add_argument("--requests", type=int, default=3000, help="requests at 64 in flight")
    parser.add_argument("--single", type=int, default=400, help="requests one at a time")
    parser.add_argument("--threads", type=int, help="intra_op_threads for both (default: unset)")
    parser.add_argument(
        "--spinning-row", action="store_true", help="also this checkout with thread_spinning"
    )
    args = parser.parse_args()
    report: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "hop": hop(args.round_trips, max(args.rounds, 3)),
    }
    if args.compare:
        report[args.workload] = compare(args)
    console.print(f"wrote {save('hop', report)}")


if __name__ == "__main__":
    main()
