"""The engine on its own loop in a thread against today's one loop, on W1 (issue 30).

    git worktree add /tmp/enginethread 8f0cd24   # the thread mode is not in main:
    git -C /tmp/enginethread apply "$PWD/bench/patches/engine_thread.diff"
    python -m bench.bench_engine_loop --thread-src /tmp/enginethread/src   # ~4 min
    python -m bench.bench_engine_loop --thread-src … --seconds 4 --repeat 5

``server.engine_loop: thread`` was measured and not kept (docs/benchmarks.md, "The
engine on its own loop in a thread"); its implementation and tests are the patch
``bench/patches/engine_thread.diff`` (on commit ``8f0cd24``), which ``--thread-src``
runs the thread server from (without it the thread server runs from this checkout,
which must then have the option).

Two ``sordino start`` servers, up at once on free loopback ports, with bench_triton's
"sordino" settings (W1 MLP, max batch 32, 10 ms batching delay, 2 intra-op threads):
**shared** (``server.engine_loop`` left at its default, one event loop) and **thread**
(``server.engine_loop: thread``: the engine on a loop of its own in a thread, the
transports on the server's).

bench_triton's lean closed-loop generator (``bench/peer_load.py``) drives both, cells
interleaved server by server and the order rotated every repeat: HTTP (KServe binary)
and gRPC at 1 and 64 in flight, every answer checked against ONNX Runtime. Per cell:
req/s, p50, p99, mean batch, CPU ms a request of the front process (the one that runs
both loops) and of the workers. Medians over the repeats; everything is saved to
``bench/results/engine_loop.json``. On a shared machine read CPU a request first: a
rate moves with whatever else runs.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_triton import (
    ROWS,
    Target,
    _root_is_front,
    aggregate,
    cells_plan,
    console,
    run_cell,
    sordino_batches,
)
from bench.common import cell_arguments, report_head, run_plan, save, sordino_server

SHARED, THREAD = "shared", "thread"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cell_arguments(parser, seconds=4.0, repeat=3)
    parser.add_argument("--concurrency", default="1,64", help="requests in flight")
    parser.add_argument("--thread-src", default=None, help="PYTHONPATH of the thread server")
    parser.add_argument(
        "--switch-interval", type=float, default=None,
        help="sys.setswitchinterval in both servers (seconds; Python's default 0.005)",
    )  # fmt: skip
    args = parser.parse_args()

    import onnxruntime as ort

    from bench.bench_workloads import server_config, workload

    w1 = workload("w1", None, None)
    inputs = np.random.default_rng(0).random((ROWS, 256), dtype=np.float32)
    session = ort.InferenceSession(str(w1.model_file), providers=["CPUExecutionProvider"])
    expected = np.stack([session.run(None, {"x": row[None]})[0][0] for row in inputs])
    targets: dict[str, Target] = {}
    cells: list[dict[str, Any]] = []
    with ExitStack() as stack, tempfile.TemporaryDirectory() as scratch:
        for label in (SHARED, THREAD):
            folder = Path(scratch) / label
            folder.mkdir()
            config = server_config(w1, folder, 2, "adaptive", 100.0)
            if label == THREAD:
                config.write_text(config.read_text() + "server:\n  engine_loop: thread\n")
            paths = [args.thread_src or ""] if label == THREAD and args.thread_src else []
            if args.switch_interval is not None:  # through a sitecustomize, as no flag sets it
                site = Path(scratch) / "site"
                site.mkdir(exist_ok=True)
                (site / "sitecustomize.py").write_text(
                    f"import sys\nsys.setswitchinterval({args.switch_interval})\n"
                )
                paths.insert(0, str(site))
            if paths:
                paths.append(os.environ.get("PYTHONPATH", ""))
            env = {"PYTHONPATH": os.pathsep.join(p for p in paths if p)} if paths else None
            try:
                s = stack.enter_context(
                    sordino_server(["--no-builtin", "--config", str(config)], env=env)
                )
            except RuntimeError as error:
                hint = " (give --thread-src: see the docstring)" if label == THREAD else ""
                raise SystemExit(f"the {label} server did not start: {error}{hint}") from None
            targets[label] = Target(label, s.http, s.grpc, "w1", s.pid, _root_is_front,
                                    lambda u=s.http: sordino_batches(u, "w1"))  # fmt: skip
        concurrencies = tuple(int(c) for c in args.concurrency.split(","))
        plan = cells_plan([SHARED, THREAD], args.repeat, concurrencies)
        cells = run_plan(
            plan,
            lambda step: run_cell(targets[step[3]], step[2], step[1], args.seconds, inputs,
                                  expected, args.warmup),
            lambda step, cell: (
                f"{step[3]} {step[2]} c{step[1]}: {cell['rate']:,.0f} req/s, p50 "
                f"{cell['p50_ms']:.2f} ms, p99 {cell['p99_ms']:.1f} ms, front "
                f"{cell['cpu_ms'].get('front', 0):.3f} ms CPU"
            ),
            console,
            clock=False,
        )  # fmt: skip
    rows = aggregate(cells)
    console.print("\nmedians over the repeats:")
    for row in sorted(rows, key=lambda r: (r["transport"], r["concurrency"], r["server"])):
        cpu = " ".join(f"{k} {v:.3f}" for k, v in row["cpu_ms"].items() if v is not None)
        console.print(
            f"  {row['transport']:4} c{row['concurrency']:<3} {row['server']:6} "
            f"{row['rate']:8,.0f} req/s  p50 {row['p50_ms']:6.2f} ms  p99 {row['p99_ms']:6.1f} ms"
            f"  batch {row['mean_batch'] or 0:5.1f}  CPU ms/request: {cpu}"
            + (f"  {row['failed']} FAILED" if row["failed"] else ""),
            markup=False, highlight=False,
        )  # fmt: skip
    report = {**report_head("engine_loop"), "settings": vars(args), "rows": rows, "cells": cells}
    console.print(f"wrote {save('engine_loop', report)}")


if __name__ == "__main__":
    main()
