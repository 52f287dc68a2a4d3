"""``sordino tune`` on the W1 (MLP) and W2 (CNN) models: the recommendation vs the default.

    python -m bench.bench_tune w1 [--seconds 1] [--objective "max throughput with p99<15ms"]
    python -m bench.bench_tune w2 [--seconds 1]

Starts ``sordino start --model w1=mlp.onnx`` (or ``w2=cnn.onnx``) with the default
configuration, runs the tuning advisor (``loadtest/tune.py``: the stress-test engine,
constant-rate open loop, a rate ladder per candidate) for "max throughput with
p99<50ms" (W2: p99<200ms) or ``--objective``, then bisects the highest rate within
the objective for the live default and the recommendation side by side (``refine``,
``--refine`` steps, the two alternating) and prints both. The advisor restores the
live settings at the end.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench import models
from bench.common import save, sordino_server
from sordino.control.client import request_json
from sordino.loadtest.tune import (
    Point,
    candidates,
    live_settings,
    pareto,
    parse_objective,
    recommend,
    refine,
    sweep,
)

WORKLOADS: dict[str, dict[str, Any]] = {
    "w1": {"model": models.mlp, "objective": "max throughput with p99<50ms",
           "rates": [500, 1000, 2000, 4000], "max_batch": [1, 16, 64],
           "delays": [0, 2000], "modes": ["manual", "adaptive"]},
    "w2": {"model": models.cnn, "objective": "max throughput with p99<200ms",
           "rates": [100, 200, 400, 800], "max_batch": [1, 8],
           "delays": [0, 5000], "modes": ["manual", "adaptive"]},
}  # fmt: skip


def _label(point: Point) -> str:
    return point.candidate.label() if point.candidate else "default (live)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--objective", help="instead of the workload's own")
    parser.add_argument("--refine", type=int, default=4, help="bisection steps side by side")
    args = parser.parse_args()
    spec = WORKLOADS[args.workload]
    name = args.workload
    objective = parse_objective(args.objective or spec["objective"])
    path = spec["model"]()
    started = time.perf_counter()
    with sordino_server(["--model", f"{name}={path}"]) as server:
        url = server.http

        def apply(settings: dict[str, Any]) -> None:
            body = {"set": settings, "verify_window": 0, "source": "bench_tune"}
            request_json("POST", f"{url}/v2/sordino/config", body, timeout=60)

        live = request_json("GET", f"{url}/v2/sordino/config", timeout=10)["models"][name]
        restore = live_settings(name, live)
        grid = candidates(spec["max_batch"], spec["delays"], spec["modes"])
        baseline, points = sweep(
            url, name, grid, rates=spec["rates"], seconds=args.seconds, objective=objective,
            apply=apply, restore=restore,
            progress=lambda p: print(f"  {_label(p):<44} {p.throughput:>8.1f} req/s  p99 "
                                     f"{p.p99_ms if p.p99_ms is None else round(p.p99_ms, 1)} ms"),
        )  # fmt: skip
        best = recommend(points, objective)
        ladder = (baseline, best)
        refined: list[Point] = []
        same = (
            best is not None
            and best.candidate is not None
            and (best.candidate.settings(name) == restore)
        )
        if same:
            print("the recommendation is the default's own settings: nothing to refine")
        elif best is not None and best.candidate is not None and args.refine:
            refined = refine(
                url, name, [(restore, baseline), (best.candidate.settings(name), best)],
                steps=args.refine, seconds=args.seconds, objective=objective, apply=apply,
                restore=restore,
            )  # fmt: skip
    print(f"{name}: '{objective}', {time.perf_counter() - started:.0f} s")
    print("Pareto front:")
    for point in pareto(points):
        print(f"  {_label(point):<44} {point.throughput:>8.1f} req/s  p99 {point.p99_ms:.1f} ms")
    if best is not None:
        for what, (live, chosen) in (("ladder", ladder), ("side by side", refined or ladder)):
            assert chosen is not None
            gain = chosen.throughput / live.throughput if live.throughput else float("inf")
            print(f"{what}: recommended {_label(chosen)}: {chosen.throughput:.1f} req/s "
                  f"(p99 {chosen.p99_ms} ms) vs the default's {live.throughput:.1f} "
                  f"(p99 {live.p99_ms} ms): ×{gain:.2f}")  # fmt: skip
    save(
        f"tune_{name}",
        {
            "objective": str(objective),
            "baseline": baseline.to_json(),
            "points": [p.to_json() for p in points],
            "recommended": best.to_json() if best else None,
            "refined": [p.to_json() for p in refined],
        },
    )


if __name__ == "__main__":
    main()
