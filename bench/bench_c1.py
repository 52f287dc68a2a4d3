"""One request in flight, A against B: p50 and CPU per request, interleaved (issue 30).

    python -m bench.bench_c1                                   # this checkout alone
    python -m bench.bench_c1 --compare /work/main --pairs 5    # A = other checkout, B = this
    python -m bench.bench_c1 --compare . --b-python /tmp/py313/bin/python  # B on another Python

Each side is ``sordino start`` with bench_triton's "sordino" settings on W1 (max batch
32, 10 ms wait, adaptive, 2 intra-op threads), its ``src/`` put first on ``PYTHONPATH``
(the workers inherit it). Both servers are up at once; cells alternate A, B, A, B … so
the machine's state falls on both alike. Per cell: p50 / p99 over HTTP KServe binary at
``--concurrency`` (1 by default; "1,64" adds the c64 row), and CPU ms per request of the
front end and the model process (psutil over the tree). Medians over the pairs.
``--a-python``/``--b-python`` run a side on another interpreter (a virtual environment
with sordino's dependencies installed: ``python3.13 -m venv /tmp/py313 &&
/tmp/py313/bin/pip install .``); its ``src/`` still comes first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from bench import bench_triton
from bench.bench_workloads import server_config, workload
from bench.common import sordino_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--compare", type=Path, help="checkout run as A (its src/ first)")
    parser.add_argument("--against", type=Path, help="checkout run as B (default: this one)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--concurrency", default="1")
    parser.add_argument("--b-threads", type=int, default=2, help="B's intra-op threads")
    parser.add_argument("--env", action="append", default=[], help="B only: NAME=VALUE")
    parser.add_argument("--a-python", help="A's interpreter (default: this one)")
    parser.add_argument("--b-python", help="B's interpreter (default: this one)")
    args = parser.parse_args()
    import onnxruntime as ort

    w1 = workload("w1", None, None)
    inputs = np.random.default_rng(0).random((bench_triton.ROWS, 256), dtype=np.float32)
    session = ort.InferenceSession(str(w1.model_file), providers=["CPUExecutionProvider"])
    expected = np.stack([session.run(None, {"x": row[None]})[0][0] for row in inputs])
    here = Path(__file__).resolve().parent.parent
    sides = [("B", (args.against or here).resolve(), dict(e.split("=", 1) for e in args.env))]
    if args.compare is not None:
        sides.insert(0, ("A", args.compare.resolve(), {}))
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as scratch:
        configs = {"A": server_config(w1, Path(scratch), 2, "adaptive", 100.0)}
        (Path(scratch) / "b").mkdir()
        configs["B"] = server_config(w1, Path(scratch) / "b", args.b_threads, "adaptive", 100.0)
        targets = {}
        for label, root, extra in sides:
            config = configs[label]
            env = {"PYTHONPATH": f"{root / 'src'}{os.pathsep}{here}", **extra}
            s = stack.enter_context(
                sordino_server(
                    ["--no-builtin", "--config", str(config)], env=env,
                    python=args.a_python if label == "A" else args.b_python,
                )
            )  # fmt: skip
            targets[label] = bench_triton.Target(
                label, s.http, s.grpc, "w1", s.pid, bench_triton._root_is_front,
                lambda u=s.http: bench_triton.sordino_batches(u, "w1"),
            )  # fmt: skip
        for _ in range(args.pairs):
            for c in (int(c) for c in args.concurrency.split(",")):
                for label, _root, _extra in sides:
                    cell = bench_triton.run_cell(
                        targets[label], "http", c, args.seconds, inputs, expected, args.warmup
                    )
                    results.setdefault((label, c), []).append(cell)
                    print(
                        f"{label} c{c}: p50 {cell['p50_ms']:.3f} ms p99 {cell['p99_ms']:.2f} ms "
                        f"{cell['rate']:,.0f} req/s CPU front {cell['cpu_ms']['front']:.3f} "
                        f"model {cell['cpu_ms']['model']:.3f} batch {cell['mean_batch']:.1f} "
                        f"failed {cell['failed']}",
                        flush=True,
                    )
                    if cell["failed"]:
                        print(f"  first failure: {cell['first_error']}", flush=True)
    print("medians:")
    for (label, c), cells in results.items():

        def med(get: Any, cells: list[dict[str, Any]] = cells) -> float:
            return statistics.median(get(cell) for cell in cells)

        print(
            f"{label} c{c}: p50 {med(lambda x: x['p50_ms']):.3f} ms, "
            f"p99 {med(lambda x: x['p99_ms']):.2f} ms, {med(lambda x: x['rate']):,.0f} req/s, "
            f"CPU front {med(lambda x: x['cpu_ms']['front']):.3f} "
            f"model {med(lambda x: x['cpu_ms']['model']):.3f} "
            f"total {med(lambda x: x['cpu_ms']['total']):.3f} ms/request"
        )


if __name__ == "__main__":
    main()
