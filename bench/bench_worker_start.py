"""How fast worker processes start and restart: this checkout against another, side by side.

Each side runs in a fresh interpreter with its checkout's ``src/`` first on
``PYTHONPATH`` and serves the built-in models (one worker process each) with
``serve_in_thread``. Measured per run:

- **start**: the wall time until the server is ready, and the CPU its worker side used
  to get there (every process it started: workers, and the forkserver where there is
  one);
- **restart**: the digits classifier's worker is SIGKILLed ``--kills`` times, each time
  after it ran 12 batches (so it is healthy and restarts at once, without the crash-loop
  backoff); the wall time until the server reports that instance restarted and ready
  again (``/v2/sordino/telemetry``, polled every 5 ms).

Runs alternate between the sides (A = ``--compare``, B = this checkout); medians are
printed and written to ``bench/results/bench_worker_start.json``.

    python -m bench.bench_worker_start --compare /path/to/other/checkout [--runs 3] [--kills 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.common import console, save

HERE = Path(__file__).resolve().parent.parent

PROBE = r"""
import json, os, signal, sys, time
import httpx, psutil
from sordino.config import RuntimeConfig
from sordino.testing import serve_in_thread

TOKEN = "bench-token"
KILLS = int(sys.argv[1])
HEALTHY = 12  # batches: over workers.restart_backoff_reset_batches (10)
me = psutil.Process()
config = RuntimeConfig.model_validate({"server": {"admin_token": TOKEN}})


def worker_side():
    found = []
    for child in me.children(recursive=True):
        try:
            command = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "resource_tracker" not in command:
            found.append(child)
    return found


def digits(url):
    document = httpx.get(f"{url}/v2/sordino/telemetry", timeout=10,
                         headers={"Authorization": f"Bearer {TOKEN}"}).json()
    for worker in document["workers"]["workers"]:
        if worker["model"] == "digits-classifier":
            return worker
    raise SystemExit("no digits-classifier worker in the telemetry")


began = time.perf_counter()
with serve_in_thread(config) as server:
    start_s = time.perf_counter() - began
    start_cpu = 0.0
    for process in worker_side():
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        start_cpu += times.user + times.system
    restarts = []
    pixels = {"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}
    body = {"inputs": [pixels]}
    for _ in range(KILLS):
        for _ in range(HEALTHY):  # a healthy worker restarts at once (no crash-loop backoff)
            httpx.post(f"{server.url}/v2/models/digits-classifier/infer", json=body,
                       timeout=30).raise_for_status()
        before = digits(server.url)
        pid = before["pid"]
        killed = time.perf_counter()
        os.kill(pid, signal.SIGKILL)
        while True:
            now = digits(server.url)
            if now["restarts"] > before["restarts"] and now["state"] == "ready":
                break
            if time.perf_counter() - killed > 60:
                raise SystemExit("the worker did not restart within 60 s")
            time.sleep(0.005)
        restarts.append(time.perf_counter() - killed)
        time.sleep(0.5)
print(json.dumps({"start_s": start_s, "start_cpu_s": start_cpu, "restart_s": restarts}))
"""


def run_side(root: Path, kills: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{root / 'src'}{os.pathsep}{HERE}"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(kills)],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the probe failed on {root}:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", type=Path, required=True, help="checkout run as A")
    parser.add_argument("--runs", type=int, default=3, help="runs per side, alternating")
    parser.add_argument("--kills", type=int, default=5, help="worker kills per run")
    args = parser.parse_args()
    sides = {"A": args.compare.resolve(), "B": HERE}
    found: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    with console.status("") as status:
        for run in range(args.runs):
            for side, root in sides.items():
                status.update(f"run {run + 1}/{args.runs}, side {side} ({root})")
                found[side].append(run_side(root, args.kills))
    rows = {}
    for side, runs in found.items():
        rows[side] = {
            "checkout": str(sides[side]),
            "start_s": statistics.median(r["start_s"] for r in runs),
            "start_cpu_s": statistics.median(r["start_cpu_s"] for r in runs),
            "restart_s": statistics.median(s for r in runs for s in r["restart_s"]),
            "restart_max_s": max(s for r in runs for s in r["restart_s"]),
            "runs": runs,
        }
    console.print(
        "| side | ready after start | worker-side CPU to start | restart (median) | restart (max) |"
    )
    console.print("|---|---|---|---|---|")
    for side, row in rows.items():
        console.print(
            f"| {side} | {row['start_s']:.2f} s | {row['start_cpu_s']:.2f} s "
            f"| {row['restart_s'] * 1000:.0f} ms | {row['restart_max_s'] * 1000:.0f} ms |"
        )
    a, b = rows["A"], rows["B"]
    start, cpu = b["start_s"] / a["start_s"], b["start_cpu_s"] / a["start_cpu_s"]
    restart = b["restart_s"] / a["restart_s"]
    console.print(f"B/A: start {start:.2f}x, worker CPU {cpu:.2f}x, restart {restart:.2f}x")
    save("bench_worker_start", {"kills": args.kills, "runs": args.runs, "sides": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
