"""CPU per request of the scheduling core, optionally next to another checkout's.

    python -m bench.bench_scheduler                          # this checkout
    python -m bench.bench_scheduler --compare /tmp/before    # and another, same run

The model is ``sordino.testing.ScriptedExecutor`` (no worker, no HTTP): 64 clients
each send one-row requests through ``ModelScheduler.infer`` (manual mode, batches of
up to 32, no wait) and release what they get. What is measured is the process CPU
time per request of submitting, batching, running the scripted batch and handing each
request its rows — the per-request cost of the engine itself. ``--compare`` runs the
same measurement with another checkout's ``src`` first on the path (say, a
``git worktree`` of an earlier commit), in a subprocess, alternating with this one,
and prints both and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CLIENTS = 64


def measure(requests: int) -> float:
    """Microseconds of CPU per request through the scheduler (this interpreter's sordino)."""
    from sordino.clock import MonotonicClock
    from sordino.inference import ModelKey
    from sordino.scheduling.batcher import BatchPolicy
    from sordino.scheduling.modes import build_controller
    from sordino.scheduling.scheduler import ModelScheduler
    from sordino.testing import ScriptedExecutor

    try:
        from sordino.records import QueueSettings
    except ImportError:  # checkouts before the records moved to the bottom layer
        from sordino.scheduling.scheduler import QueueSettings  # type: ignore[attr-defined]

    async def run() -> float:
        clock = MonotonicClock()
        controller = build_controller("manual", BatchPolicy(max_batch=32), slo_s=0.1)
        scheduler = ModelScheduler(
            ModelKey("m", "1"),
            batched=True,
            executor=ScriptedExecutor(clock),
            controller=controller,
            settings=QueueSettings(),
            clock=clock,
        )
        scheduler.start()
        x = {"x": np.zeros((1, 256), np.float32)}

        async def client(n: int) -> None:
            for _ in range(n):
                out = await scheduler.infer(x, priority=2)
                release = getattr(out, "release", None)
                if release is not None:
                    release()

        per_client = max(1, requests // CLIENTS)
        await asyncio.gather(*(client(per_client // 4) for _ in range(CLIENTS)))  # warm-up
        started = time.process_time()
        await asyncio.gather(*(client(per_client) for _ in range(CLIENTS)))
        spent = time.process_time() - started
        await scheduler.close()
        return spent / (per_client * CLIENTS) * 1e6

    return asyncio.run(run())


def _other(checkout: Path, requests: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    code = f"from bench.bench_scheduler import measure; print(measure({requests}))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"the other checkout failed:\n{out.stderr.strip()}")
    return float(out.stdout.strip().splitlines()[-1])


def _this(requests: int) -> float:
    code = f"from bench.bench_scheduler import measure; print(measure({requests}))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=32_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--compare", type=Path, help="another checkout to measure beside")
    args = parser.parse_args()
    if args.compare is not None and not (args.compare / "src" / "sordino").is_dir():
        raise SystemExit(f"--compare {args.compare}: no src/sordino there")
    ours: list[float] = []
    theirs: list[float] = []
    for i in range(args.repeat):
        ours.append(_this(args.requests))
        if args.compare is not None:
            theirs.append(_other(args.compare, args.requests))
        print(f"run {i + 1}/{args.repeat}: this {ours[-1]:.1f} µs/request", end="")
        print(f", other {theirs[-1]:.1f} µs/request" if theirs else "", flush=True)
    mine = statistics.median(ours)
    print(f"this checkout: {mine:.1f} µs of CPU per request (median of {args.repeat})")
    if theirs:
        other = statistics.median(theirs)
        print(f"{args.compare}: {other:.1f} µs of CPU per request")
        print(f"ratio this/other: {mine / other:.2f}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        raise SystemExit(130) from None
