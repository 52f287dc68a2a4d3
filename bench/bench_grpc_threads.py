"""Where a gRPC ModelInfer's server CPU goes at 64 in flight: per thread, and on the loop.

    python -m bench.bench_grpc_threads                        # per-thread CPU, rows a batch
    python -m bench.bench_grpc_threads --ahead 1 --ahead 32   # grpc_accept_ahead, alternated
    python -m bench.bench_grpc_threads --profile              # + cProfile of the loop thread

A real server in this process (``sordino.testing.serve_in_thread``, built-in digits
classifier, the loop-lag rule on as ``sordino start`` has it; asyncio's own loop, not
uvloop) and the lean gRPC closed loop of ``bench/peer_load.py`` at 64 in flight in a
child process, so the client's CPU and GIL are not the server's. Over the measured
window: this process's CPU per request split by thread (``/proc/self/task``: the
event-loop thread, grpc.aio's poller thread, gRPC core's ``event_engine`` threads),
the mean rows a batch (``sordino_batch_size``), and with ``--profile`` the loop
thread's own time by area (``cProfile``: grpc.aio's Cython shows only as the
callbacks' ``Context.run``; the profiler inflates Python's share).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.bench_request_path import _batches, _on_loop
from bench.common import console, save

HERE = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")

CLIENT = """
import asyncio, sys
from bench import peer_load
from bench.bench_request_path import _grpc_message, _rows
bodies = [_grpc_message(row) for row in _rows(256)]
asyncio.run(peer_load.grpc_closed_loop(sys.argv[1], bodies, 64, 1.0))  # warm
answers = asyncio.run(peer_load.grpc_closed_loop(sys.argv[1], bodies, 64, float(sys.argv[2])))
print(len(answers.latencies), sum(1 for s in answers.statuses if s != 200), answers.seconds)
"""


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process, keyed by thread id."""
    seconds: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds[tid] = (int(fields[11]) + int(fields[12])) / TICK
    return seconds


def _thread_names() -> dict[str, str]:
    names = {str(t.native_id): t.name for t in threading.enumerate()}
    for tid in os.listdir("/proc/self/task"):
        if tid not in names:
            try:
                with open(f"/proc/self/task/{tid}/comm") as comm:
                    names[tid] = comm.read().strip() + " (native)"
            except OSError:
                continue
    return names


def _area(filename: str, function: str) -> str:
    if "/sordino/" in filename:
        return "sordino." + filename.split("/sordino/", 1)[1].split("/")[0].removesuffix(".py")
    if "asyncio" in filename or "selectors" in filename or "select.epoll" in function:
        return "asyncio (loop, futures, tasks)"
    if "Context" in function:
        return "callbacks' own time (grpc.aio Cython, gRPC core)"
    if "prometheus" in filename:
        return "prometheus_client"
    if filename == "~":
        return "C functions called from Python (pipe I/O, dict, protobuf, numpy)"
    return "other Python (stdlib, numpy)"


def one_cell(seconds: float, ahead: int | None, profile: bool) -> dict[str, Any]:
    """Serve ``seconds`` of gRPC c64 and measure the server's CPU (see the module doc)."""
    from sordino.config import RuntimeConfig
    from sordino.config.server import ServerConfig
    from sordino.testing import serve_in_thread

    extra = {} if ahead is None else {"grpc_accept_ahead": ahead}
    config = RuntimeConfig(server=ServerConfig(shed_loop_lag=0.01, **extra))
    with serve_in_thread(config) as server:
        http = f"http://127.0.0.1:{server.port}"
        client = subprocess.Popen(
            [sys.executable, "-c", CLIENT, f"127.0.0.1:{server.grpc_port}", str(seconds + 1)],
            stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                filter(None, [os.environ.get("PYTHONPATH"), str(HERE)]))},
        )  # fmt: skip
        time.sleep(2.0)  # the client's start and warm second
        rows_before, batches_before = _batches(http)
        cpu_before, started = _thread_cpu(), time.perf_counter()
        profiler = cProfile.Profile() if profile else None
        if profiler is not None:
            _on_loop(server.loop, profiler.enable)
        time.sleep(seconds - 0.5)
        if profiler is not None:
            _on_loop(server.loop, profiler.disable)
        cpu_after, window = _thread_cpu(), time.perf_counter() - started
        rows_after, batches_after = _batches(http)
        served, failed, length = client.communicate()[0].split()
        rate = int(served) / float(length)
        requests = rate * window
        names = _thread_names()
        per_thread: dict[str, float] = collections.Counter()
        for tid, used in cpu_after.items():
            per_thread[names.get(tid, tid)] += (used - cpu_before.get(tid, 0.0)) * 1000 / requests
        cell: dict[str, Any] = {
            "ahead": ahead, "rate": rate, "failed": int(failed),
            "mean_batch": (rows_after - rows_before) / max(batches_after - batches_before, 1),
            "cpu_ms": sum(per_thread.values()), "threads_ms": dict(per_thread),
        }  # fmt: skip
        if profiler is not None:
            stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
            own = sum(entry[2] for entry in stats.values())
            areas: dict[str, float] = collections.Counter()
            callbacks = futures = 0
            for (filename, _line, function), (_cc, calls, tottime, *_rest) in stats.items():
                areas[_area(filename, function)] += tottime / own
                if function == "<method 'run' of '_contextvars.Context' objects>":
                    callbacks = calls
                elif function == "create_future":
                    futures += calls
            cell["loop_areas"] = dict(areas)
            profiled = rate * (seconds - 0.5)
            cell["callbacks_per_request"] = callbacks / profiled
            cell["futures_per_request"] = futures / profiled
        return cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="measured seconds a cell")
    parser.add_argument("--ahead", type=int, action="append", help="grpc_accept_ahead (repeat)")
    parser.add_argument("--rounds", type=int, default=1, help="times over the --ahead values")
    parser.add_argument("--profile", action="store_true", help="cProfile the loop thread")
    args = parser.parse_args()
    cells = []
    for _ in range(args.rounds):
        for ahead in args.ahead or [None]:
            cell = one_cell(args.seconds, ahead, args.profile)
            cells.append(cell)
            label = "default" if ahead is None else f"ahead {ahead}"
            console.print(
                f"{label}: {cell['rate']:,.0f} req/s, {cell['failed']} failed, mean batch "
                f"{cell['mean_batch']:.1f}, process CPU {cell['cpu_ms']:.3f} ms/request"
            )
            for name, used in sorted(cell["threads_ms"].items(), key=lambda item: -item[1]):
                if used > 0.0005:
                    console.print(f"    {name:28} {used:.3f} ms/request")
            if "loop_areas" in cell:
                console.print(
                    f"  loop thread, {cell['callbacks_per_request']:.1f} callbacks and "
                    f"{cell['futures_per_request']:.1f} futures a request; own time by area:"
                )
                for area, share in sorted(cell["loop_areas"].items(), key=lambda item: -item[1]):
                    console.print(f"    {share * 100:5.1f} %  {area}")
    console.print(f"wrote {save('grpc_threads', {'cells': cells})}")


if __name__ == "__main__":
    main()
