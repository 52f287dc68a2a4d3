"""The repeated-kill drill: SIGKILL a worker every 10 s under a fixed open-loop load.

Starts ``sordino start`` with the built-in digits classifier at 2 instances (worker
processes), sends it KServe v2 JSON requests over HTTP on loopback at a fixed rate
(open loop: each request leaves at its scheduled time whatever the answers), and
every ``--every`` seconds SIGKILLs one of the model's worker processes (picked at
random, seeded; ``--pick oldest`` takes the one up longest). Each request is OK
(200), failed (any other status, or a connection error) or timed out (no answer
within ``--timeout``). Prints the counts per kill window and in total, with the
restarts the server reports, and writes them to ``bench/results/drill_kills.json``.

    python -m bench.drill_kills [--minutes 3] [--rate 300] [--every 10]

The load is bounded: ``rate x minutes x 60`` requests at most, and the run ends at
most ``--timeout`` seconds after the last one is sent.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
import yaml

from bench.common import console, save, sordino_server
from sordino.models.repository import builtin_sources

MODEL = "digits-classifier"
BODY = orjson.dumps(
    {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [3.0] * 64}]}
)


@dataclass
class Window:
    """The requests scheduled in one kill window, by how they ended."""

    ok: int = 0
    failed: int = 0
    timed_out: int = 0
    kills: list[int] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return self.ok + self.failed + self.timed_out


def workers(server_pid: int) -> list[psutil.Process]:
    """The server's worker processes: the children of its forkserver (or its
    ``spawn_main`` children without one); not the forkserver, not the resource tracker."""
    found = []
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            command = " ".join(child.cmdline())
            forked = "multiprocessing.forkserver" in command and child.ppid() != server_pid
            if forked or "spawn_main" in command:
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


async def kill_every(
    server_pid: int, every: float, until: float, pick: str, rng: random.Random,
    windows: list[Window], began: float,
) -> None:  # fmt: skip
    """SIGKILL one worker every ``every`` seconds until ``until`` (perf_counter time)."""
    next_kill = began + every
    while next_kill < until:
        await asyncio.sleep(max(0.0, next_kill - time.perf_counter()))
        alive = workers(server_pid)
        if alive:
            if pick == "oldest":
                victim = min(alive, key=lambda p: p.create_time())
            else:
                victim = rng.choice(sorted(alive, key=lambda p: p.pid))
            try:
                victim.kill()
                index = min(int((time.perf_counter() - began) // every), len(windows) - 1)
                windows[index].kills.append(victim.pid)
            except psutil.NoSuchProcess:
                pass
        next_kill += every


async def load(
    url: str, rate: float, seconds: float, client_timeout_s: float, every: float,
    windows: list[Window], failures: Counter[str], latencies: list[float], began: float,
) -> None:  # fmt: skip
    """Send ``rate`` requests per second for ``seconds``; sort each into its window."""
    total = int(rate * seconds)
    connector = aiohttp.TCPConnector(limit=1024)
    timeouts = aiohttp.ClientTimeout(total=client_timeout_s)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeouts) as session:

        async def one(intended: float) -> None:
            window = windows[min(int((intended - began) // every), len(windows) - 1)]
            try:
                async with session.post(url, data=BODY, headers=headers) as response:
                    await response.read()
                    if response.status == 200:
                        window.ok += 1
                        latencies.append(time.perf_counter() - intended)
                    else:
                        window.failed += 1
                        failures[f"HTTP {response.status}"] += 1
            except TimeoutError:
                window.timed_out += 1
            except aiohttp.ClientError as exc:
                window.failed += 1
                failures[type(exc).__name__] += 1

        tasks: set[asyncio.Task[None]] = set()
        for i in range(total):
            intended = began + i / rate
            delay = intended - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.ensure_future(one(intended))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks, timeout=client_timeout_s + 5)


def server_figures(url: str, token: str) -> dict[str, Any]:
    """Restarts and failures per instance, as the server reports them."""
    import urllib.request

    request = urllib.request.Request(
        f"{url}/v2/sordino/telemetry", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        document = orjson.loads(urllib.request.urlopen(request, timeout=10).read())
    except OSError as exc:
        return {"error": str(exc)}
    return {
        str(w["index"]): {"restarts": w["restarts"], "state": w["state"]}
        for w in document.get("workers", {}).get("workers", [])
        if w["model"] == MODEL
    }


async def drill(args: argparse.Namespace) -> dict[str, Any]:
    source = next(s for s in builtin_sources() if s.name == MODEL)
    config = {
        "models": [
            {"name": MODEL, "path": str(source.path), "max_batch_size": 64, "instance_count": 2}
        ]
    }
    token = "drill-admin-token"
    with tempfile.TemporaryDirectory(prefix="sordino-drill-") as scratch:
        path = Path(scratch) / "sordino.yaml"
        path.write_text(yaml.safe_dump(config))
        with sordino_server(
            ["--config", str(path), "--no-builtin"], env={"SORDINO_ADMIN_TOKEN": token}
        ) as server:
            seconds = args.minutes * 60
            windows = [Window() for _ in range(max(1, round(seconds / args.every)))]
            failures: Counter[str] = Counter()
            latencies: list[float] = []
            began = time.perf_counter() + 0.5
            rng = random.Random(args.seed)
            url = f"{server.http}/v2/models/{MODEL}/infer"
            await asyncio.gather(
                load(url, args.rate, seconds, args.timeout, args.every, windows, failures,
                     latencies, began),
                kill_every(server.pid, args.every, began + seconds, args.pick, rng, windows,
                           began),
            )  # fmt: skip
            figures = server_figures(server.http, token)
    latencies.sort()

    def quantile(q: float) -> float:
        return 1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))]

    totals = Window(
        ok=sum(w.ok for w in windows),
        failed=sum(w.failed for w in windows),
        timed_out=sum(w.timed_out for w in windows),
        kills=[pid for w in windows for pid in w.kills],
    )
    return {
        "rate": args.rate,
        "minutes": args.minutes,
        "every_s": args.every,
        "timeout_s": args.timeout,
        "pick": args.pick,
        "windows": [_window_row(i * args.every, w) for i, w in enumerate(windows)],
        "total": {
            "sent": totals.sent,
            "ok": totals.ok,
            "failed": totals.failed,
            "timed_out": totals.timed_out,
            "kills": len(totals.kills),
        },
        "failures": dict(failures),
        "p50_ms": quantile(0.5) if latencies else None,
        "p99_ms": quantile(0.99) if latencies else None,
        "max_ms": 1000 * latencies[-1] if latencies else None,
        "instances": figures,
    }


def _window_row(start_s: float, w: Window) -> dict[str, Any]:
    return {
        "from_s": start_s,
        "sent": w.sent,
        "ok": w.ok,
        "failed": w.failed,
        "timed_out": w.timed_out,
        "kills": len(w.kills),
    }


def show(result: dict[str, Any]) -> None:
    console.print(
        f"{MODEL}, 2 instances, {result['rate']:g} req/s for {result['minutes']:g} min, "
        f"SIGKILL one worker every {result['every_s']:g} s ({result['pick']}), client "
        f"timeout {result['timeout_s']:g} s"
    )
    console.print("| window | sent | OK | failed | timed out | kills |")
    console.print("|---|---|---|---|---|---|")
    for w in result["windows"]:
        console.print(
            f"| {w['from_s']:g}–{w['from_s'] + result['every_s']:g} s | {w['sent']:,} | "
            f"{w['ok']:,} | {w['failed']} | {w['timed_out']} | {w['kills']} |"
        )
    t = result["total"]
    console.print(
        f"| **total** | {t['sent']:,} | {t['ok']:,} | {t['failed']} | {t['timed_out']} | "
        f"{t['kills']} |"
    )
    if result["p50_ms"] is not None:
        console.print(
            f"latency of OK requests (from the scheduled send): p50 {result['p50_ms']:.1f} ms, "
            f"p99 {result['p99_ms']:.1f} ms, max {result['max_ms']:.0f} ms"
        )
    if result["failures"]:
        console.print(f"failures: {result['failures']}")
    console.print(f"instances at the end: {result['instances']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="length of the drill")
    parser.add_argument("--rate", type=float, default=300.0, help="requests per second")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between kills")
    parser.add_argument("--timeout", type=float, default=5.0, help="client timeout, seconds")
    parser.add_argument("--pick", choices=["random", "oldest"], default="random")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random pick")
    args = parser.parse_args()
    result = asyncio.run(drill(args))
    show(result)
    path = save("drill_kills", result)
    console.print(f"written to {path}")
    if result["total"]["failed"] or result["total"]["timed_out"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
