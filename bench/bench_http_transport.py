"""What the HTTP transport alone costs a request: CPU per request, no engine (issue 30).

    python -m bench.bench_http_transport                    # c1 and c64, 5 rounds
    python -m bench.bench_http_transport --profile 20000    # the per-function table, c1
    python -m bench.bench_http_transport --compare /work/main/src --rounds 7
    python -m bench.bench_http_transport --compare STEP1/src --against STEP2/src

The engine's HTTP protocol (``server/http_protocol.py``), bound as ``sordino start``
binds it — a :class:`~sordino.server.connection_guard.ConnectionGuard` with the
default limits and a header-refusal rule (:class:`~sordino.server.early_shed.HeaderShed`
with the engine's lag rule, on a route that never refuses) — is fed a W1-sized KServe
binary request (a 1 KiB body) per connection on a uvloop loop, through an in-process
transport that only keeps what is written. The inference cycle is
:class:`~sordino.server.http_cycle.InferCycle` with ``_answer`` replaced by "read the
body, answer a fixed 1 KiB payload": what is measured is the transport — bytes in,
the parser's callbacks, the guard's deadlines, the refusal check, the cycle and its
task, the response head and the write — and nothing of ``answer_infer``.

- **c1**: one connection, a request fed only once the previous answer is written
  (each request has loop iterations of its own, and the header rule decides each in an
  epoch of its own, as at 1 in flight);
- **c64**: 64 connections, a request fed to each in one iteration, then the loop runs
  until all 64 are answered (as a busy server reads them).

The figure is the thread's CPU time over the requests (``time.thread_time``), medians
of ``--rounds``. ``--compare DIR`` runs this file under ``DIR`` too (``PYTHONPATH``),
rounds alternating, and prints both.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import statistics
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import uvloop

from sordino.records.scheduling import QueueSettings
from sordino.server.connection_guard import ConnectionGuard
from sordino.server.early_shed import HeaderShed, ShedRoute
from sordino.server.http_cycle import InferCycle
from sordino.server.http_protocol import http_protocol
from sordino.server.loop_lag import LoopLag

BODY = bytes(1024)
HEAD = (
    b"POST /v2/models/w1/infer HTTP/1.1\r\nhost: 127.0.0.1:8000\r\n"
    b"content-type: application/octet-stream\r\ninference-header-content-length: 120\r\n"
    b"content-length: %d\r\n\r\n" % len(BODY)
)
REQUEST = HEAD + BODY
PAYLOAD = bytes(1100)
ANSWER_HEADERS = {
    "Content-Type": "application/octet-stream",
    "Inference-Header-Content-Length": "96",
}


SETTINGS = QueueSettings()
"""The route's queue policy: one object while the model is loaded, as a scheduler's."""


class _Shed(HeaderShed):
    """The header rule on a route that never refuses (a model with room to spare).

    With ``fresh``, each request is decided in an epoch of its own, as at 1 in flight on
    a server (a request every ~0.85 ms; uvloop's clock counts milliseconds)."""

    fresh = False
    _epochs = 0

    def _epoch(self, now: float) -> object:
        if not self.fresh:
            return now
        self._epochs += 1
        return self._epochs

    def _skip(self) -> bool:
        return False

    def _route(self, model: str, version: str | None) -> ShedRoute | None:
        return ShedRoute(settings=SETTINGS, eligible=True, late=_never, note=None)

    def _flush(self, refused: Any) -> None:
        pass


def _never(priority: int, timeout: float | None) -> None:
    return None


class _Cycle(InferCycle):
    async def _answer(self) -> None:
        await self.read_body()
        self.respond(200, PAYLOAD, ANSWER_HEADERS)


class _Transport:
    def __init__(self, answered: list[int]) -> None:
        self.answered = answered
        self.closing = False

    def write(self, data: bytes) -> None:
        self.answered[0] += 1

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _protocol_class(fresh: bool) -> Any:
    guard = ConnectionGuard(
        max_connections=1024, max_per_client=1024, header_timeout=30.0, body_timeout=30.0
    )
    guard.early_shed = shed = _Shed({}, LoopLag(0.05))
    shed.fresh = fresh
    server = SimpleNamespace(max_request_size=1 << 26)
    runtime = SimpleNamespace(config=SimpleNamespace(server=server))
    cls = http_protocol(guard, _app, runtime, 5.0)  # type: ignore[arg-type]
    cls.infer_cycle = _Cycle
    return cls


async def _app(scope: object, receive: object, send: object) -> None:
    raise AssertionError("only inference is sent")


async def _run(connections: int, requests: int) -> float:
    """CPU seconds a request, ``requests`` in all over ``connections``."""
    loop = asyncio.get_running_loop()
    cls = _protocol_class(connections == 1)
    state = SimpleNamespace(total_requests=0, connections=set(), tasks=set(), default_headers=[
        (b"date", b"Sat, 05 Dec 2026 06:00:00 GMT"), (b"server", b"uvicorn")])  # fmt: skip
    answered = [0]
    protocols = []
    for _ in range(connections):
        protocol = cls(server_state=state, _loop=loop)
        protocol.connection_made(_Transport(answered))
        protocols.append(protocol)
    rounds = max(1, requests // connections)
    for warm in (True, False):
        count = 50 if warm else rounds
        answered[0] = 0
        start = time.thread_time()
        for _ in range(count):
            target = answered[0] + connections
            for protocol in protocols:
                protocol.data_received(REQUEST)
            while answered[0] < target:  # noqa: ASYNC110 (the loop's own steps are measured)
                await asyncio.sleep(0)
        spent = time.thread_time() - start
    for protocol in protocols:
        protocol.transport.close()
        protocol.connection_lost(None)
    return spent / (rounds * connections)


def _measure(rounds: int, requests: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"c1": [], "c64": []}
    for _ in range(rounds):
        out["c1"].append(uvloop.run(_run(1, requests // 4)) * 1e6)
        out["c64"].append(uvloop.run(_run(64, requests)) * 1e6)
    return out


def _profile(requests: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    uvloop.run(_run(1, requests))
    profiler.disable()
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=64_000)
    parser.add_argument("--profile", type=int, default=0, help="profile N requests at c1")
    parser.add_argument("--compare", help="another src/ to run alternately (A), this one B")
    parser.add_argument("--against", help="the src/ of B (default: this checkout's)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profile:
        _profile(args.profile)
        return
    if args.one:
        result = _measure(1, args.requests)
        print(result["c1"][0], result["c64"][0])
        return
    if not args.compare:
        result = _measure(args.rounds, args.requests)
        for key, values in result.items():
            runs = [round(v, 2) for v in values]
            print(f"{key}: {statistics.median(values):.2f} µs CPU a request  {runs}")
        return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    srcs = {"A": args.compare, "B": args.against or os.path.join(here, "src")}
    figures: dict[str, dict[str, list[float]]] = {k: {"c1": [], "c64": []} for k in srcs}
    for _ in range(args.rounds):
        for label, src in srcs.items():
            env = dict(os.environ, PYTHONPATH=f"{src}:{here}")
            out = subprocess.run(
                [sys.executable, "-m", "bench.bench_http_transport", "--one", "--requests",
                 str(args.requests)], env=env, cwd=here, capture_output=True, text=True, check=True,
            ).stdout.split()  # fmt: skip
            figures[label]["c1"].append(float(out[0]))
            figures[label]["c64"].append(float(out[1]))
    for key in ("c1", "c64"):
        a, b = (statistics.median(figures[x][key]) for x in srcs)
        runs = {x: [round(v, 1) for v in figures[x][key]] for x in srcs}
        print(f"{key}: A {a:.2f} µs  B {b:.2f} µs  ({(b - a) / a:+.1%})  {runs}")


if __name__ == "__main__":
    main()
