"""Overload that keeps goodput: an open-loop client offering 3× the server's capacity.

    python -m bench.bench_overload                 # capacity, unloaded, then 3× for 20 s
    python -m bench.bench_overload --seconds 60 --factor 3

The server (``sordino start`` on the built-in digits classifier) is pinned to one core
and this client to the other, as in the drill that found the problem. The client is a
lean raw-socket HTTP/1.1 generator (``asyncio`` protocols, prebuilt request bytes, one
request at a time per keep-alive connection, connections opened as needed): it sends
on a fixed schedule whatever the answers do (open loop), and measures each latency
from the request's *intended* send time, so a stalled server shows in the percentiles.

Three phases, each reported:

1. **capacity** — the highest served rate: a closed loop at 64 connections;
2. **unloaded** — open loop at 30 % of capacity, 20 % high / 80 % low priority: the
   high-priority p99 the overload is judged against;
3. **overload** — open loop at ``--factor`` × capacity, same mix, every request with a
   deadline (``parameters.timeout``, ``--deadline-ms``).

Goodput is the rate of 200s that arrived within their deadline. The targets (issue
20): goodput ≥ 90 % of capacity, high-priority p99 ≤ 2× its unloaded p99 with ≥ 99 %
of high-priority requests served, every refusal explicit and fast (p99 ≤ 5 ms), no
connection errors. Loopback only; every phase is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import resource
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import orjson

from bench.common import console, save, sordino_server

MODEL = "digits-classifier"


def _body(priority: str, deadline_us: int | None) -> bytes:
    parameters: dict[str, Any] = {"priority": priority}
    if deadline_us is not None:
        parameters["timeout"] = deadline_us
    document = {
        "inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [3.0] * 64}],
        "parameters": parameters,
    }
    return orjson.dumps(document)


def _request(host: str, body: bytes) -> bytes:
    head = (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass(eq=False, slots=True)
class Outcome:
    """What happened to one request: its status (0: connection error) and latency."""

    high: bool
    status: int
    latency_s: float


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request in flight, the response parsed minimally."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses
        self.buffer = bytearray()
        self.waiter: Callable[[int], object] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def request(self, data: bytes) -> asyncio.Future[int]:
        """Send one request; the future gets the response's status (0: connection lost)."""
        assert self.transport is not None
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.waiter = lambda status: done.done() or done.set_result(status)
        self.transport.write(data)
        return done

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(self.buffer) < end + 4 + length:
                return
            status = int(head[9:12])
            close = b"connection: close" in head
            del self.buffer[: end + 4 + length]
            waiter, self.waiter = self.waiter, None
            if close and self.transport is not None:
                self.closed = True
                self.transport.close()
            if waiter is not None:
                waiter(status)
            self.pool.release(self)

    def connection_lost(self, exc: Exception | None) -> None:
        was_closed, self.closed = self.closed, True
        waiter, self.waiter = self.waiter, None
        if waiter is not None:
            waiter(0)
        if not was_closed:
            self.pool.release(self)


@dataclass
class _Pool:
    """Keep-alive connections, at most ``limit`` open; past it a request waits for one."""

    host: str
    port: int
    limit: int = 512
    idle: deque[_Connection] = field(default_factory=deque)
    waiting: deque[asyncio.Future[None]] = field(default_factory=deque)
    opened: int = 0
    open_now: int = 0

    def release(self, conn: _Connection) -> None:
        if conn.closed:
            self.open_now -= 1
        else:
            self.idle.append(conn)
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    async def connection(self) -> _Connection:
        while True:
            while self.idle:
                conn = self.idle.popleft()
                if not conn.closed:
                    return conn
                self.open_now -= 1
            if self.open_now < self.limit:
                break
            waiter = asyncio.get_running_loop().create_future()
            self.waiting.append(waiter)
            await waiter
        self.open_now += 1
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: _Connection(self), self.host, self.port)
        except OSError:
            self.open_now -= 1
            raise
        self.opened += 1
        return conn


async def open_loop(
    url: str,
    rate: float,
    seconds: float,
    high_share: float,
    deadline_us: int | None,
    seed: int = 0,
    connections: int = 2048,
) -> tuple[list[Outcome], float]:
    """Send at ``rate`` per second for ``seconds``, whatever the answers; return outcomes."""
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    pool = _Pool(host, port, limit=connections)
    bodies = {
        True: _request(f"{host}:{port}", _body("high", deadline_us)),
        False: _request(f"{host}:{port}", _body("low", deadline_us)),
    }
    rng = random.Random(seed)
    outcomes: list[Outcome] = []
    pending: set[asyncio.Future[None]] = set()
    loop = asyncio.get_running_loop()
    start = loop.time()
    total = int(rate * seconds)

    async def one(intended: float, high: bool) -> None:
        try:
            conn = await pool.connection()
        except OSError:
            outcomes.append(Outcome(high, 0, loop.time() - intended))
            return
        status = await conn.request(bodies[high])
        outcomes.append(Outcome(high, status, loop.time() - intended))

    for i in range(total):
        intended = start + i / rate
        delay = intended - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.ensure_future(one(intended, rng.random() < high_share))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.wait(pending, timeout=30)
    achieved = total / max(loop.time() - start, 1e-9)
    return outcomes, achieved


async def closed_loop_capacity(url: str, seconds: float, concurrency: int = 64) -> float:
    """Served requests per second with ``concurrency`` connections each waiting for its answer."""
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    pool = _Pool(host, port)
    body = _request(f"{host}:{port}", _body("low", None))
    loop = asyncio.get_running_loop()
    stop = loop.time() + seconds
    served = 0

    async def client() -> None:
        nonlocal served
        conn = await pool.connection()
        while loop.time() < stop:
            if await conn.request(body) == 200:
                served += 1
            conn = await pool.connection()

    began = loop.time()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return served / (loop.time() - began)


def _p99_ms(values: list[float]) -> float | None:
    return float(np.percentile(np.asarray(values) * 1000, 99)) if values else None


def report(outcomes: list[Outcome], seconds: float, deadline_s: float) -> dict[str, Any]:
    ok = [o for o in outcomes if o.status == 200]
    good = [o for o in ok if o.latency_s <= deadline_s]
    refused = [o for o in outcomes if o.status in (429, 503)]
    high = [o for o in outcomes if o.high]
    high_ok = [o for o in high if o.status == 200]
    return {
        "sent": len(outcomes),
        "ok": len(ok),
        "goodput_per_s": len(good) / seconds,
        "refused": len(refused),
        "errors_5xx_other": sum(1 for o in outcomes if o.status >= 500 and o.status != 503),
        "connection_errors": sum(1 for o in outcomes if o.status == 0),
        "high_sent": len(high),
        "high_served_share": len(high_ok) / len(high) if high else None,
        "high_p99_ms": _p99_ms([o.latency_s for o in high_ok]),
        "low_p99_ms": _p99_ms([o.latency_s for o in ok if not o.high]),
        "refusal_p99_ms": _p99_ms([o.latency_s for o in refused]),
        "statuses": {
            str(s): sum(1 for o in outcomes if o.status == s)
            for s in sorted({o.status for o in outcomes})
        },
    }


async def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    console.print("capacity: closed loop, 64 connections …")
    await closed_loop_capacity(url, 2.0)  # warm-up (and the adaptive controller settles)
    capacity = await closed_loop_capacity(url, args.capacity_seconds)
    console.print(f"  {capacity:,.0f} req/s")
    deadline_s = args.deadline_ms / 1000
    console.print("unloaded: open loop at 30 % of capacity …")
    outcomes, _ = await open_loop(
        url, 0.3 * capacity, args.unloaded_seconds, 0.2, None, connections=args.connections
    )
    unloaded = report(outcomes, args.unloaded_seconds, float("inf"))
    console.print(f"  high-priority p99 {unloaded['high_p99_ms']:.2f} ms")
    rate = args.factor * capacity
    console.print(f"overload: open loop at {args.factor:g}× = {rate:,.0f} req/s …")
    outcomes, achieved = await open_loop(
        url, rate, args.seconds, 0.2, int(args.deadline_ms * 1000), 1, args.connections
    )
    overload = report(outcomes, args.seconds, deadline_s)
    overload["offered_per_s"] = rate
    overload["achieved_send_per_s"] = achieved
    checks = {
        "goodput / capacity >= 0.90": overload["goodput_per_s"] / capacity,
        "high p99 / unloaded high p99 <= 2": (overload["high_p99_ms"] or float("inf"))
        / unloaded["high_p99_ms"],
        "high served share >= 0.99": overload["high_served_share"],
        "refusal p99 ms <= 5": overload["refusal_p99_ms"],
        "connection errors == 0": overload["connection_errors"],
    }
    return {"capacity_per_s": capacity, "unloaded": unloaded, "overload": overload,
            "checks": checks}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="overload phase length")
    parser.add_argument("--factor", type=float, default=3.0, help="offered load / capacity")
    parser.add_argument("--deadline-ms", type=float, default=500.0)
    parser.add_argument("--capacity-seconds", type=float, default=5.0)
    parser.add_argument("--unloaded-seconds", type=float, default=5.0)
    parser.add_argument("--server-cpu", type=int, default=1, help="core for the server")
    parser.add_argument("--client-cpu", type=int, default=0, help="core for this client")
    parser.add_argument("--mode", default="adaptive")
    parser.add_argument("--connections", type=int, default=2048, help="client connection cap")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    cores = os.sched_getaffinity(0)
    pinned = {args.server_cpu, args.client_cpu} <= cores and len(cores) > 1
    prefix = ["taskset", "-c", str(args.server_cpu)] if pinned else []
    # Every client connection comes from 127.0.0.1: lift the per-address limit above ours.
    config = Path(tempfile.mkdtemp(prefix="sordino-overload-")) / "runtime_config.yaml"
    config.write_text(f"server:\n  max_connections_per_client: {args.connections + 64}\n")
    server_args = ["--mode", args.mode, "--config", str(config)]
    with sordino_server(server_args, prefix=prefix) as endpoints:
        if pinned:
            os.sched_setaffinity(0, {args.client_cpu})
        try:
            import uvloop

            result = uvloop.run(run(args, endpoints.http))
        except ImportError:
            result = asyncio.run(run(args, endpoints.http))
    result["pinned"] = pinned
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    result["when"] = datetime.now(UTC).isoformat(timespec="seconds")
    for name, value in result["checks"].items():
        console.print(f"{name}: {value if value is None else round(value, 3)}")
    console.print(orjson.dumps(result["overload"], option=orjson.OPT_INDENT_2).decode())
    console.print(f"wrote {save('overload', result)}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        raise SystemExit(130) from None
