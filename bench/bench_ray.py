"""Process workers versus Ray actors: the cost of the Ray hop per batch, and W2 throughput.

Builds the executor the runtime uses for each ``executor.kind`` (``process``: worker
processes fed through the shared-memory arena; ``ray``: Ray actors fed through the
object store, each batch placed in its node's pool as by default, on a private
local Ray cluster started here) and drives its one call,
``await executor.run(model, parts)``, in closed loops, so that only the hop from the
server to the instance and back differs:

- the hop: the built-in digits classifier (a few microseconds of compute), one row,
  one batch at a time: the p50 per batch is almost all transport;
- W2 (bench/models.py, a small CNN, 64×64 RGB) at batch 1 and batch 8, as many batches
  in flight as instances (2): rows per second and the latency per batch;
- the node pool (``executor.node_pool``, ``execution/ray_pool.py``): in one Ray session,
  two Ray executors side by side, one placing each batch in its node's pool and one
  not, measured in alternation (``--rounds``) on the hop and on a model without
  compute whose batch is 4 MiB in and 4 MiB out (the pool's two copies); the medians
  of the rounds are compared.

    python -m bench.bench_ray [--seconds 3] [--instances 2] [--only all|executors|pool]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from bench.common import console, save
from bench.models import cnn, identity
from sordino.clock import MonotonicClock
from sordino.config import ModelConfig, RayModelOptions, RuntimeConfig
from sordino.events import EventSink
from sordino.execution.chain import ChainExecutor
from sordino.execution.ray_executor import RayExecutor
from sordino.inference import ModelKey
from sordino.models.repository import builtin_sources


async def closed_loop(
    executor: ChainExecutor, key: ModelKey, part: dict[str, np.ndarray], flows: int, seconds: float
) -> dict[str, float]:
    """``flows`` loops of ``executor.run`` for ``seconds``; rows/s and batch latency."""
    latencies: list[float] = []
    rows = next(iter(part.values())).shape[0]
    stop = time.perf_counter() + seconds

    async def flow() -> None:
        while time.perf_counter() < stop:
            began = time.perf_counter()
            outputs = await executor.run(key, [part])
            outputs.release()
            latencies.append(time.perf_counter() - began)

    for _ in range(3):  # warm the path (first object-store puts, first arena blocks)
        (await executor.run(key, [part])).release()
    began = time.perf_counter()
    await asyncio.gather(*(flow() for _ in range(flows)))
    elapsed = time.perf_counter() - began
    ms = np.asarray(latencies) * 1000
    return {
        "batches": len(latencies),
        "rows_per_s": len(latencies) * rows / elapsed,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
    }


def ray_options(options: dict[str, Any]) -> RayModelOptions:
    return RayModelOptions.model_validate(options)


async def measure(kind: str, seconds: float, instances: int, data_dir: Path) -> dict[str, Any]:
    config = RuntimeConfig.model_validate(
        {"executor": {"kind": kind}, "server": {"data_dir": str(data_dir / kind)}}
    )
    executor_type = RayExecutor if kind == "ray" else ChainExecutor
    executor = executor_type(config, clock=MonotonicClock(), events=EventSink())
    digits = next(s for s in builtin_sources() if s.name == "digits-classifier")
    # Half a CPU per actor, so that the three actors fit a 2-CPU machine's local
    # cluster; one ONNX Runtime thread per instance in both executors.
    ray = {"num_cpus": 0.5} if kind == "ray" else None
    models = {
        "digits": (
            digits.path,
            digits.config.model_copy(update={"instance_count": 1, "ray": ray and ray_options(ray)}),
        ),
        "w2": (
            cnn(),
            ModelConfig.model_validate(
                {"name": "w2", "instance_count": instances, "intra_op_threads": 1, "ray": ray}
            ),
        ),
    }
    results: dict[str, Any] = {}
    try:
        began = time.perf_counter()
        for name, (path, model) in models.items():
            await executor.load(ModelKey(name, "1"), path, model)
        results["load_s"] = time.perf_counter() - began
        rng = np.random.default_rng(0)
        pixels = {"pixels": rng.random((1, 64), dtype=np.float32)}
        results["hop"] = await closed_loop(executor, ModelKey("digits", "1"), pixels, 1, seconds)
        for batch in (1, 8):
            image = {"image": rng.random((batch, 3, 64, 64), dtype=np.float32)}
            results[f"w2_b{batch}"] = await closed_loop(
                executor, ModelKey("w2", "1"), image, instances, seconds
            )
    finally:
        await executor.aclose()
    return results


WIDE = 131072
"""The identity model's row: 512 KiB, so a batch of 8 is 4 MiB in and 4 MiB out."""


async def measure_pool(seconds: float, rounds: int, data_dir: Path) -> dict[str, Any]:
    """The same Ray cluster, with and without node pools, measured in alternation."""
    executors: dict[str, RayExecutor] = {}
    digits = next(s for s in builtin_sources() if s.name == "digits-classifier")
    # A quarter CPU per actor: both executors' actors fit a 2-CPU local cluster.
    ray = ray_options({"num_cpus": 0.25})
    figures: dict[str, dict[str, list[dict[str, float]]]] = {}
    try:
        for label, pooled in (("pool", True), ("no pool", False)):
            config = RuntimeConfig.model_validate(
                {
                    "executor": {"kind": "ray", "node_pool": pooled},
                    "server": {"data_dir": str(data_dir / label.replace(" ", "_"))},
                    "memory": {"pool_size": "64MB"},
                }
            )
            executor = RayExecutor(config, clock=MonotonicClock(), events=EventSink())
            executors[label] = executor
            await executor.load(
                ModelKey("digits", "1"),
                digits.path,
                digits.config.model_copy(update={"instance_count": 1, "ray": ray}),
            )
            await executor.load(
                ModelKey("copy", "1"),
                identity(WIDE),
                ModelConfig(name="copy", instance_count=1, intra_op_threads=1, ray=ray),
            )
            figures[label] = {"hop": [], "copy": []}
        rng = np.random.default_rng(0)
        pixels = {"pixels": rng.random((1, 64), dtype=np.float32)}
        wide = {"x": rng.random((8, WIDE), dtype=np.float32)}
        for _ in range(rounds):
            for label, executor in executors.items():
                figures[label]["hop"].append(
                    await closed_loop(executor, ModelKey("digits", "1"), pixels, 1, seconds)
                )
                figures[label]["copy"].append(
                    await closed_loop(executor, ModelKey("copy", "1"), wide, 1, seconds)
                )
        pool = executors["pool"].node_memory()
    finally:
        for executor in reversed(executors.values()):  # the first one shuts Ray down
            await executor.aclose()
    medians = {
        label: {
            what: {
                key: float(np.median([run[key] for run in runs]))
                for key in ("rows_per_s", "p50_ms", "p99_ms")
            }
            for what, runs in by_what.items()
        }
        for label, by_what in figures.items()
    }
    return {
        "rounds": rounds,
        "medians": medians,
        "runs": figures,
        "pools": [
            {
                "node": n.node,
                "peak_bytes": n.arena.peak_bytes,
                "batches": n.batches,
                "fragmentation": n.arena.fragmentation,
            }
            for n in pool
        ],
    }


def print_pool(result: dict[str, Any], seconds: float) -> dict[str, float]:
    table = Table(
        title=f"Ray actors with and without node pools ({platform.node()}, "
        f"median of {result['rounds']} alternating rounds of {seconds:g} s)"
    )
    for column in ("what", "node pool", "rows/s", "p50 ms/batch", "p99 ms/batch"):
        table.add_column(column, justify="left" if column in ("what", "node pool") else "right")
    labels = {
        "hop": "hop: digits, batch 1",
        "copy": "identity, batch 8, 4 MiB in + 4 MiB out",
    }
    cost: dict[str, float] = {}
    for what, label in labels.items():
        for kind in ("no pool", "pool"):
            row = result["medians"][kind][what]
            table.add_row(
                label, kind, f"{row['rows_per_s']:,.0f}", f"{row['p50_ms']:.2f}",
                f"{row['p99_ms']:.2f}",
            )  # fmt: skip
        medians = result["medians"]
        cost[what] = medians["pool"][what]["p50_ms"] - medians["no pool"][what]["p50_ms"]
    console.print(table)
    for what, label in labels.items():
        console.print(f"the node pool adds {cost[what]:.2f} ms per batch (p50, {label})")
    for node in result["pools"]:
        console.print(
            f"node {node['node'][:12]}: {node['batches']} batches in its pool, peak "
            f"{node['peak_bytes']} bytes, fragmentation {node['fragmentation']:.1%}"
        )
    return cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--instances", type=int, default=2, help="W2 instances (and flows)")
    parser.add_argument("--rounds", type=int, default=3, help="node pool: alternating rounds")
    parser.add_argument("--only", choices=("all", "executors", "pool"), default="all")
    args = parser.parse_args()
    # Ray gives each actor OMP_NUM_THREADS=num_cpus (1 here); give the worker processes
    # the same, so that only the hop differs (unset, W2 at batch 8 ran 2.5x slower in
    # the worker processes on the 2-core machine: oversubscribed threads).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    saved: dict[str, Any] = {"seconds": args.seconds}
    if args.only in ("all", "executors"):
        saved.update(executors(args))
    if args.only in ("all", "pool"):
        with tempfile.TemporaryDirectory() as tmp:
            result = asyncio.run(measure_pool(args.seconds, args.rounds, Path(tmp)))
        saved["node_pool"] = result
        saved["node_pool_ms"] = print_pool(result, args.seconds)
    path = save("bench_ray", saved)
    console.print(f"saved {path}")


def executors(args: argparse.Namespace) -> dict[str, Any]:
    """Process workers vs Ray actors (the section of the first version)."""
    with tempfile.TemporaryDirectory() as tmp:
        figures = {
            kind: asyncio.run(measure(kind, args.seconds, args.instances, Path(tmp)))
            for kind in ("process", "ray")
        }
    table = Table(
        title=f"process workers vs Ray actors ({platform.node()}, {args.seconds:g} s each)"
    )
    for column in ("what", "executor", "rows/s", "p50 ms/batch", "p99 ms/batch"):
        table.add_column(column, justify="left" if column in ("what", "executor") else "right")
    labels = {
        "hop": "hop: digits, batch 1, 1 in flight",
        "w2_b1": f"W2 batch 1, {args.instances} in flight",
        "w2_b8": f"W2 batch 8, {args.instances} in flight",
    }
    for what, label in labels.items():
        for kind in ("process", "ray"):
            row = figures[kind][what]
            table.add_row(
                label, kind, f"{row['rows_per_s']:,.0f}", f"{row['p50_ms']:.2f}",
                f"{row['p99_ms']:.2f}",
            )  # fmt: skip
    console.print(table)
    hop = figures["ray"]["hop"]["p50_ms"] - figures["process"]["hop"]["p50_ms"]
    console.print(f"the Ray hop adds {hop:.2f} ms per batch (p50, digits classifier)")
    for kind in ("process", "ray"):
        console.print(f"{kind}: models loaded in {figures[kind]['load_s']:.1f} s")
    return {"figures": figures, "hop_ms": hop}


if __name__ == "__main__":
    main()
