"""Overload that keeps goodput: an open-loop client offering 3× the server's capacity.

    python -m bench.bench_overload                 # the digits MLP: capacity … 3× for 20 s
    python -m bench.bench_overload --workload w2 --mode auto --max-batch 1 --chart w2.png
    python -m bench.bench_overload --seconds 60 --factor 3

The server (``sordino start``, on the built-in digits classifier or on W2, a CNN of a
few ms a request) is pinned to one core and the client to the other, as in the drill
that found the problem. The client is ``bench/openloop.c`` (compiled with gcc at run
time; why it is hand-written is in its header): one thread on epoll, prebuilt request
bytes, keep-alive connections opened before the schedule starts, one request in flight
on each. It sends on a fixed schedule whatever the answers do (open loop) and measures
each latency from the request's *intended* send time, so a stalled server shows in the
percentiles.

Phases, each reported:

1. **capacity** — the highest served rate: a closed loop at 64 connections;
2. **unloaded** — open loop at 30 % of capacity, 20 % high / 80 % low priority: the
   high-priority p99 the overload is judged against;
3. **high priority alone** — the overload's own schedule (same rate, same draw of
   which requests are high) with only its high-priority requests sent: the best any
   scheduler can give them, since even one that refused every low-priority request for
   free would leave them exactly this load (``--factor`` × 20 % of capacity, arriving
   at random);
4. **refusal cost** — every request refused (a 1 µs deadline): the server's CPU per
   refusal, with the priority and deadline in headers (refused before the body is
   read, ``server/early_shed.py``) and in the body's ``parameters`` (refused after
   decoding, by the scheduler);
5. **floor** (unless ``--no-floor``) — ``bench/refuser.c``, a C server that only
   refuses, on the server's core at the overload's rate: the least CPU any server
   spends on a refusal here, and so the most goodput any server could keep;
6. **overload** — open loop at ``--factor`` × capacity, same mix, every request with a
   deadline (``--deadline-ms``), once per ``--variants`` (``headers``, ``body``).

Goodput is the rate of 200s that arrived within their deadline. The targets (issue
20): goodput ≥ 90 % of capacity (issue 30: ≥ 70 % on digits, ≥ 90 % on W2),
high-priority p99 ≤ 2× its unloaded p99 with ≥ 99 % of high-priority requests served,
every refusal explicit and fast (p99 ≤ 5 ms), no connection errors. Loopback only;
every phase is bounded in time.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import orjson

from bench.common import Endpoints, console, core_busy_s, others_share, save, sordino_server

GENERATOR = Path(__file__).with_name("openloop.c")
REFUSER = Path(__file__).with_name("refuser.c")
HIGH_SHARE = 0.2
"""The share of high-priority requests in the open loops."""
UNLOADED_HIGH = 400
"""High-priority requests the unloaded phase sends at least (within 5 to 60 s)."""
NOT_SENT = -2
"""``openloop.c``'s status for a low-priority request it skipped (``LOW_REQ`` "-")."""


@dataclass(frozen=True)
class Workload:
    """The model under overload and the one request every client sends it."""

    name: str
    model: str
    input_name: str
    shape: tuple[int, ...]
    binary: bool  # the binary tensor extension (a large input) instead of JSON

    def body(self, priority: str | None, deadline_us: int | None) -> tuple[bytes, str]:
        """The request body and its extra headers."""
        parameters: dict[str, Any] = {}
        if priority is not None:
            parameters["priority"] = priority
        if deadline_us is not None:
            parameters["timeout"] = deadline_us
        array = np.full(self.shape, 0.5, dtype=np.float32)
        tensor: dict[str, Any] = {"name": self.input_name, "shape": list(self.shape),
                                  "datatype": "FP32"}  # fmt: skip
        if self.binary:
            tensor["parameters"] = {"binary_data_size": array.nbytes}
            parameters["binary_data_output"] = True
        else:
            tensor["data"] = array.ravel().tolist()
        document: dict[str, Any] = {"inputs": [tensor]}
        if parameters:
            document["parameters"] = parameters
        header = orjson.dumps(document)
        if not self.binary:
            return header, ""
        return header + array.tobytes(), f"Inference-Header-Content-Length: {len(header)}\r\n"


WORKLOADS = {
    # The built-in 64→64→10 MLP: a served request is almost all front end (~0.2 ms).
    "digits": Workload("digits", "digits-classifier", "pixels", (1, 64), binary=False),
    # W2, a CNN on 64×64 images (bench/models.py): a few ms of compute per request, as
    # an image model's request is.
    "w2": Workload("w2", "w2", "image", (1, 3, 64, 64), binary=True),
}


def request_bytes(
    workload: Workload, host: str, priority: str, deadline_us: int | None, where: str
) -> bytes:
    """One whole request; ``where`` the priority and deadline go: ``headers`` or ``body``."""
    extra = ""
    if where == "headers":
        body, extra = workload.body(None, None)
        extra += f"X-Sordino-Priority: {priority}\r\n"
        if deadline_us is not None:
            extra += f"X-Sordino-Timeout: {deadline_us}\r\n"
    else:
        body, extra = workload.body(priority, deadline_us)
    head = (
        f"POST /v2/models/{workload.model}/infer HTTP/1.1\r\nHost: {host}\r\n{extra}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass(frozen=True)
class Outcomes:
    """What happened to each request: its class, status (0: connection error, -1: no
    answer) and latency from its intended send time."""

    high: np.ndarray  # bool
    status: np.ndarray  # int
    latency_s: np.ndarray  # float; NaN where there was no answer
    sent_per_s: float


class Generator:
    """``openloop.c``, compiled once into a scratch directory, run pinned to a core."""

    def __init__(self, url: str, cpu: int | None, workload: Workload) -> None:
        self.workload = workload
        self.dir = Path(tempfile.mkdtemp(prefix="sordino-openloop-"))
        self.exe = self.dir / "openloop"
        subprocess.run([_compiler(), "-O2", "-o", str(self.exe), str(GENERATOR)], check=True)
        parsed = urlparse(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.prefix = ["taskset", "-c", str(cpu)] if cpu is not None else []

    def _file(self, name: str, data: bytes) -> str:
        path = self.dir / name
        path.write_bytes(data)
        return str(path)

    def _run(self, args: list[str], out: Path) -> Outcomes:
        done = subprocess.run(
            [*self.prefix, str(self.exe), *args], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"openloop failed: {done.stderr.strip()}")
        last = done.stderr.strip().splitlines()[-1].split()  # "sent N in S s"
        table = np.loadtxt(out, dtype=np.int64, ndmin=2)
        table = table[table[:, 1] != NOT_SENT]
        latency = np.where(table[:, 2] >= 0, table[:, 2] / 1e6, np.nan)
        return Outcomes(
            table[:, 0] == 1, table[:, 1], latency, int(last[1]) / max(float(last[3]), 1e-9)
        )

    def open(
        self, rate: float, seconds: float, *, deadline_us: int | None, where: str,
        connections: int, high_share: float = HIGH_SHARE, seed: int = 1, lows: bool = True,
    ) -> Outcomes:  # fmt: skip
        """Send at ``rate`` per second for ``seconds``, whatever the answers; each request
        is high priority with probability ``high_share`` (drawn from ``seed``). Without
        ``lows``, only the same schedule's high-priority requests are sent."""
        host = f"{self.host}:{self.port}"
        high = self._file(
            "high.http", request_bytes(self.workload, host, "high", deadline_us, where)
        )
        low = "-"
        if lows:
            low = self._file(
                "low.http", request_bytes(self.workload, host, "low", deadline_us, where)
            )
        out = self.dir / "open.txt"
        args = ["open", self.host, str(self.port), f"{rate:.1f}", f"{seconds:g}",
                str(connections), str(high_share), str(seed), high, low, str(out)]  # fmt: skip
        return self._run(args, out)

    def closed(self, concurrency: int, seconds: float) -> float:
        """Served requests per second, ``concurrency`` connections each awaiting its answer."""
        host = f"{self.host}:{self.port}"
        request = self._file(
            "capacity.http", request_bytes(self.workload, host, "low", None, "body")
        )
        out = self.dir / "closed.txt"
        args = ["closed", self.host, str(self.port), str(concurrency), f"{seconds:g}",
                request, str(out)]  # fmt: skip
        began = time.perf_counter()
        outcomes = self._run(args, out)
        return int(np.sum(outcomes.status == 200)) / (time.perf_counter() - began)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class Refuser:
    """``refuser.c`` pinned to the server's core: the floor under any server's refusal."""

    def __init__(self, scratch: Path, cpu: int | None) -> None:
        exe = scratch / "refuser"
        subprocess.run([_compiler(), "-O2", "-o", str(exe), str(REFUSER)], check=True)
        prefix = ["taskset", "-c", str(cpu)] if cpu is not None else []
        self.proc = subprocess.Popen([*prefix, str(exe), "0"], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if len(line) != 2 or line[0] != "ready":
            self.proc.kill()
            raise RuntimeError("bench/refuser.c did not start")
        self.url = f"http://127.0.0.1:{line[1]}"

    def cpu_seconds(self) -> float:
        import psutil

        times = psutil.Process(self.proc.pid).cpu_times()
        return times.user + times.system

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def floor_cost(
    refuser: Refuser, workload: Workload, client_cpu: int | None, rate: float, seconds: float
) -> dict[str, Any]:
    """CPU per refusal of ``refuser.c`` at ``rate``: the least any server spends on one."""
    generator = Generator(refuser.url, client_cpu, workload)
    try:
        before = refuser.cpu_seconds()
        outcomes = generator.open(rate, seconds, deadline_us=1, where="headers", connections=64)
        spent = refuser.cpu_seconds() - before
    finally:
        generator.close()
    refused = int((outcomes.status == 503).sum())
    return {
        "rate": rate,
        "refused": refused,
        "cpu_us_per_refusal": spent / max(refused, 1) * 1e6,
        "refusal_p99_ms": _p99_ms(outcomes.latency_s[outcomes.status == 503]),
    }


def _compiler() -> str:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise SystemExit("bench_overload needs a C compiler (gcc) for bench/openloop.c")
    return gcc


def _p99_ms(values: np.ndarray) -> float | None:
    return float(np.percentile(values * 1000, 99)) if values.size else None


FAST_REFUSAL_S = 0.005
"""A refusal answered within this of its intended send time is fast (the target's p99)."""


def timeline(outcomes: Outcomes, rate: float, deadline_s: float) -> dict[str, list[float]]:
    """Per second of the send schedule (request ``i`` is due at ``i / rate``): goodput,
    refusals, refusals slower than :data:`FAST_REFUSAL_S`, and the high-priority p99."""
    status, high, latency = outcomes.status, outcomes.high, outcomes.latency_s
    second = (np.arange(status.size) / rate).astype(int)
    refused = (status == 429) | (status == 503)
    series: dict[str, list[float]] = {"goodput": [], "refused": [], "refused_slow": [],
                                      "high_p99_ms": []}  # fmt: skip
    for t in range(int(second.max()) + 1 if status.size else 0):
        now = second == t
        good = now & (status == 200) & (latency <= deadline_s)
        series["goodput"].append(int(good.sum()))
        series["refused"].append(int((now & refused).sum()))
        series["refused_slow"].append(int((now & refused & (latency > FAST_REFUSAL_S)).sum()))
        high_ok = latency[now & high & (status == 200)]
        series["high_p99_ms"].append(_p99_ms(high_ok) or float("nan"))
    return series


def report(outcomes: Outcomes, seconds: float, deadline_s: float) -> dict[str, Any]:
    status, high, latency = outcomes.status, outcomes.high, outcomes.latency_s
    ok = status == 200
    good = ok & (latency <= deadline_s)
    refused = (status == 429) | (status == 503)
    high_ok = high & ok
    return {
        "late_200": int((ok & ~good).sum()),
        "refused_slow": int((refused & (latency > FAST_REFUSAL_S)).sum()),
        # Of those, the ones answered after 100 ms: accepted, then refused in the queue.
        "refused_after_100ms": int((refused & (latency > 0.1)).sum()),
        "sent": int(status.size),
        "sent_per_s": outcomes.sent_per_s,
        "ok": int(ok.sum()),
        "goodput_per_s": float(good.sum()) / seconds,
        "refused": int(refused.sum()),
        "errors_5xx_other": int(((status >= 500) & (status != 503)).sum()),
        "connection_errors": int((status == 0).sum()),
        "unanswered": int((status == -1).sum()),
        "high_sent": int(high.sum()),
        "high_served_share": float(high_ok.sum() / high.sum()) if high.any() else None,
        "high_p99_ms": _p99_ms(latency[high_ok]),
        "low_p99_ms": _p99_ms(latency[ok & ~high]),
        "refusal_p99_ms": _p99_ms(latency[refused]),
        "statuses": {str(s): int((status == s).sum()) for s in np.unique(status)},
    }


def refusal_cost(
    generator: Generator, endpoints: Endpoints, where: str, rate: float, seconds: float
) -> dict[str, Any]:
    """Server CPU per refusal: every request carries a 1 µs deadline, so each is shed."""
    before = endpoints.cpu_seconds()
    outcomes = generator.open(rate, seconds, deadline_us=1, where=where, connections=64)
    after = endpoints.cpu_seconds()
    refused = int(((outcomes.status == 503) | (outcomes.status == 429)).sum())
    server = after["server"] - before["server"]
    workers = after["workers"] - before["workers"]
    return {
        "rate": rate,
        "refused": refused,
        "answered_other": int(outcomes.status.size) - refused,
        # The server process only: a refusal never reaches a worker.
        "server_cpu_us_per_refusal": server / max(refused, 1) * 1e6,
        "workers_cpu_s_meanwhile": workers,
        "refusal_p99_ms": _p99_ms(outcomes.latency_s[(outcomes.status == 503)]),
    }


def run(args: argparse.Namespace, endpoints: Endpoints, generator: Generator) -> dict[str, Any]:
    core = args.server_cpu if args.pinned else None
    console.print("capacity: closed loop, 64 connections …")
    generator.closed(64, 2.0)  # warm-up (and the adaptive controller settles)
    before, busy, began = endpoints.cpu_seconds(), core_busy_s(core), time.monotonic()
    capacity = generator.closed(64, args.capacity_seconds)
    after = endpoints.cpu_seconds()
    capacity_others = others_share(core, busy, before, after, time.monotonic() - began)
    served_cpu_s = (
        after["server"] - before["server"] + after["workers"] - before["workers"]
    ) / max(capacity * args.capacity_seconds, 1.0)
    console.print(
        f"  {capacity:,.0f} req/s, {served_cpu_s * 1e6:.0f} µs of CPU each "
        f"(other processes took {capacity_others:.2f} of the server's core)"
    )
    # Long enough for UNLOADED_HIGH high-priority requests (the p99 the overload is
    # judged against: of 44, as 5 s of W2 gave, it is the largest one).
    unloaded_s = args.unloaded_seconds or min(
        60.0, max(5.0, UNLOADED_HIGH / (0.3 * capacity * HIGH_SHARE))
    )
    console.print(f"unloaded: open loop at 30 % of capacity for {unloaded_s:.0f} s …")
    before, busy, began = endpoints.cpu_seconds(), core_busy_s(core), time.monotonic()
    outcomes = generator.open(
        0.3 * capacity, unloaded_s, deadline_us=None, where="headers",
        connections=args.connections,
    )  # fmt: skip
    unloaded = report(outcomes, unloaded_s, float("inf"))
    unloaded["others_cpu_share"] = others_share(
        core, busy, before, endpoints.cpu_seconds(), time.monotonic() - began
    )
    console.print(
        f"  high-priority p99 {unloaded['high_p99_ms']:.2f} ms "
        f"(other processes took {unloaded['others_cpu_share']:.2f} of the server's core)"
    )
    # The overload's high-priority requests alone: its schedule, its draw of which are
    # high, the low ones not sent. Their p99 is set by their own load (at 3× with 20 %
    # high, 0.6 of capacity, arriving at random), which no scheduler can take from them:
    # the overload's high p99 cannot beat it. (Evenly spaced, as this phase once sent
    # them, they never queue behind each other, and the comparison flattered the target.)
    rate = args.factor * capacity
    console.print(
        f"high priority alone: the overload's schedule, its "
        f"{HIGH_SHARE * rate:,.0f} high-priority req/s only, for {args.seconds:g} s …"
    )
    before, busy, began = endpoints.cpu_seconds(), core_busy_s(core), time.monotonic()
    outcomes = generator.open(
        rate, args.seconds, deadline_us=None, where="headers",
        connections=args.connections, lows=False,
    )  # fmt: skip
    after = endpoints.cpu_seconds()
    alone = report(outcomes, args.seconds, float("inf"))
    alone["others_cpu_share"] = others_share(core, busy, before, after, time.monotonic() - began)
    alone["server_cpu_share"] = (after["server"] - before["server"]) / args.seconds
    console.print(
        f"  high-priority p99 {alone['high_p99_ms']:.2f} ms, "
        f"{alone['high_served_share']:.1%} served "
        f"(other processes took {alone['others_cpu_share']:.2f} of the server's core)"
    )
    costs = {}
    for where in args.variants:
        # At the overload's rate: a loop that never sleeps shares each wake-up among
        # many requests (at 0.5× capacity a refusal measured 3× as much, mostly wake-ups).
        costs[where] = refusal_cost(generator, endpoints, where, args.factor * capacity, 3.0)
        console.print(
            f"refusal cost, deadline in {where}: "
            f"{costs[where]['server_cpu_us_per_refusal']:.0f} µs of server CPU each"
        )
    floor = None
    if args.floor:
        console.print("floor: bench/refuser.c on the server's core refusing everything …")
        refuser = Refuser(generator.dir, args.server_cpu if args.pinned else None)
        try:
            client_cpu = args.client_cpu if args.pinned else None
            floor = floor_cost(refuser, generator.workload, client_cpu, rate, 3.0)
        finally:
            refuser.close()
        console.print(f"  {floor['cpu_us_per_refusal']:.0f} µs of CPU each")
    # What one core can give at best with these costs: x served and the rest refused
    # within one CPU-second, x·s + (rate − x)·r ≤ 1.
    refusal_us = {where: cost["server_cpu_us_per_refusal"] for where, cost in costs.items()}
    if floor is not None:
        refusal_us["floor"] = floor["cpu_us_per_refusal"]
    bounds = {}
    for where, microseconds in refusal_us.items():
        refusal_s = microseconds / 1e6
        best = (1 - rate * refusal_s) / max(served_cpu_s - refusal_s, 1e-9)
        bounds[where] = max(0.0, min(best / capacity, 1.0))
        console.print(f"goodput bound from CPU costs, {where}: {bounds[where]:.2f} of capacity")
    deadline_s = args.deadline_ms / 1000
    # Issue 30's goodput targets: 0.7 where a request is almost all front end (digits),
    # 0.9 where its compute dominates (W2).
    goal = 0.9 if generator.workload.name == "w2" else 0.7
    overloads: dict[str, Any] = {}
    checks: dict[str, Any] = {}
    for where in args.variants:
        console.print(f"overload ({where}): open loop at {args.factor:g}× = {rate:,.0f} req/s …")
        before, busy, began = endpoints.cpu_seconds(), core_busy_s(core), time.monotonic()
        outcomes = generator.open(
            rate, args.seconds, deadline_us=int(args.deadline_ms * 1000), where=where,
            connections=args.connections,
        )  # fmt: skip
        after = endpoints.cpu_seconds()
        overload_others = others_share(core, busy, before, after, time.monotonic() - began)
        console.print(f"  other processes took {overload_others:.2f} of the server's core")
        overload = report(outcomes, args.seconds, deadline_s)
        overload["offered_per_s"] = rate
        overload["timeline"] = timeline(outcomes, rate, deadline_s)
        # Where the server's core went: the share of each second the server process and
        # the workers used (the send schedule is args.seconds long; answers trail it).
        overload["server_cpu_share"] = (after["server"] - before["server"]) / args.seconds
        overload["workers_cpu_share"] = (after["workers"] - before["workers"]) / args.seconds
        overload["others_cpu_share"] = overload_others
        overloads[where] = overload
        checks[where] = {
            f"goodput / capacity >= {goal:.2f}": overload["goodput_per_s"] / capacity,
            "high p99 / unloaded high p99 <= 2": (overload["high_p99_ms"] or float("inf"))
            / unloaded["high_p99_ms"],
            "(context) high p99 / high p99 alone": (overload["high_p99_ms"] or float("inf"))
            / alone["high_p99_ms"],
            "high served share >= 0.99": overload["high_served_share"],
            "refusal p99 ms <= 5": overload["refusal_p99_ms"],
            "connection errors == 0": overload["connection_errors"],
        }
    return {"capacity_per_s": capacity, "served_cpu_us": served_cpu_s * 1e6,
            "capacity_others_cpu_share": capacity_others,
            "unloaded": unloaded, "high_alone": alone, "refusal_cost": costs, "floor": floor,
            "goodput_bound": bounds,
            "overload": overloads, "checks": checks}  # fmt: skip


def chart(result: dict[str, Any], path: Path) -> None:
    """Each overload variant second by second: goodput and refusals against capacity
    (top), the high-priority p99 against its unloaded p99 and the 2× target (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    capacity = result["capacity_per_s"]
    unloaded = result["unloaded"]["high_p99_ms"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), dpi=110, sharex=True)
    for where, overload in result["overload"].items():
        series = overload["timeline"]
        seconds = np.arange(len(series["goodput"])) + 0.5
        top.plot(seconds, series["goodput"], marker=".", label=f"goodput ({where})")
        top.plot(seconds, series["refused"], linestyle="--", label=f"refused ({where})")
        top.plot(seconds, series["refused_slow"], linestyle=":",
                 label=f"refused after > 5 ms ({where})")  # fmt: skip
        bottom.plot(seconds, series["high_p99_ms"], marker=".", label=f"high p99 ({where})")
    top.axhline(capacity, color="grey", linewidth=1, label="capacity")
    top.axhline(0.9 * capacity, color="grey", linewidth=1, linestyle=":", label="0.9 × capacity")
    top.set_ylabel("requests / s")
    top.set_title(
        f"{result['workload']}: open loop at {result['factor']:g}× capacity "
        f"({result['capacity_per_s']:,.0f} req/s)"
    )
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    top.grid(alpha=0.3)
    bottom.axhline(unloaded, color="grey", linewidth=1, label="unloaded high p99")
    alone = result["high_alone"]["high_p99_ms"]
    bottom.axhline(alone, color="tab:red", linewidth=1, linestyle="--",
                   label="high p99, the same high-priority arrivals alone")  # fmt: skip
    bottom.axhline(2 * unloaded, color="grey", linewidth=1, linestyle=":", label="2× (target)")
    bottom.set_yscale("log")
    bottom.set_ylabel("high-priority p99, ms")
    bottom.set_xlabel("second of the overload")
    bottom.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="overload phase length")
    parser.add_argument("--factor", type=float, default=3.0, help="offered load / capacity")
    parser.add_argument("--deadline-ms", type=float, default=500.0)
    parser.add_argument("--capacity-seconds", type=float, default=5.0)
    parser.add_argument(
        "--unloaded-seconds", type=float,
        help=f"default: long enough for {UNLOADED_HIGH} high-priority requests (5-60 s)",
    )  # fmt: skip
    parser.add_argument("--server-cpu", type=int, default=1, help="core for the server")
    parser.add_argument("--client-cpu", type=int, default=0, help="core for this client")
    parser.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="digits",
        help="digits: the built-in MLP (front-end bound); w2: a CNN",
    )
    parser.add_argument("--mode", default="adaptive")
    parser.add_argument("--max-batch", type=int, help="w2's max_batch_size (default 32)")
    parser.add_argument("--connections", type=int, default=2048, help="client connection cap")
    parser.add_argument(
        "--variants", default="headers,body",
        help="where requests carry their priority and deadline, one overload run each",
    )  # fmt: skip
    parser.add_argument(
        "--no-floor", dest="floor", action="store_false",
        help="skip the floor: bench/refuser.c's CPU per refusal on the server's core",
    )  # fmt: skip
    parser.add_argument("--chart", type=Path, help="a PNG of the overload, second by second")
    parser.add_argument(
        "--engine-loop", choices=("shared", "thread"), default="shared",
        help="server.engine_loop (thread: run with PYTHONPATH on a checkout of "
        "8f0cd24 with bench/patches/engine_thread.diff; results NAME_thread)",
    )  # fmt: skip
    args = parser.parse_args()
    args.variants = [v for v in args.variants.split(",") if v]
    if not args.variants or set(args.variants) - {"headers", "body"}:
        parser.error("--variants takes headers, body or both, comma-separated")
    if args.max_batch is not None and (args.workload != "w2" or args.max_batch < 1):
        parser.error("--max-batch sets W2's max_batch_size: use it with --workload w2, ≥ 1")
    if args.chart is not None and not args.chart.parent.is_dir():
        parser.error(f"--chart: the folder {args.chart.parent} does not exist")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    cores = os.sched_getaffinity(0)
    pinned = {args.server_cpu, args.client_cpu} <= cores and len(cores) > 1
    args.pinned = pinned
    prefix = ["taskset", "-c", str(args.server_cpu)] if pinned else []
    # Every client connection comes from 127.0.0.1: lift the per-address limit above ours.
    config = Path(tempfile.mkdtemp(prefix="sordino-overload-")) / "runtime_config.yaml"
    text = f"server:\n  max_connections_per_client: {args.connections + 64}\n"
    if args.engine_loop != "shared":  # the key is left out where it is the default
        text += f"  engine_loop: {args.engine_loop}\n"
    workload = WORKLOADS[args.workload]
    if workload.name == "w2":
        from bench import models

        text += (
            f"models:\n  - name: w2\n    path: {models.cnn()}\n"
            f"    max_batch_size: {args.max_batch or 32}\n"
            f"    intra_op_threads: {1 if pinned else 2}\n"
        )
    config.write_text(text)
    server_args = ["--mode", args.mode, "--config", str(config)]
    with sordino_server(server_args, prefix=prefix) as endpoints:
        generator = Generator(endpoints.http, args.client_cpu if pinned else None, workload)
        try:
            result = run(args, endpoints, generator)
        finally:
            generator.close()
    result["workload"] = workload.name
    result["factor"] = args.factor
    if args.chart is not None:
        chart(result, args.chart)
        console.print(f"chart: {args.chart}")
    result["pinned"] = pinned
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    result["when"] = datetime.now(UTC).isoformat(timespec="seconds")
    for where, checks in result["checks"].items():
        for name, value in checks.items():
            console.print(f"{where}: {name}: {value if value is None else round(value, 3)}")
    brief = {
        w: {k: v for k, v in o.items() if k != "timeline"} for w, o in result["overload"].items()
    }
    console.print(orjson.dumps(brief, option=orjson.OPT_INDENT_2).decode())
    console.print(f"load average while it ran: {os.getloadavg()[0]:.1f}")
    result["load_average"] = os.getloadavg()
    name = "overload" if workload.name == "digits" else f"overload_{workload.name}"
    name += "" if args.engine_loop == "shared" else f"_{args.engine_loop}"
    result["engine_loop"] = args.engine_loop
    console.print(f"wrote {save(name, result)}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        raise SystemExit(130) from None
