"""What a refusal costs: decided in the engine's process, or from its load board in another.

    python -m bench.bench_refusal                      # 5,000 refusals/s, 3 s, 2 rounds
    python -m bench.bench_refusal --rate 8000 --seconds 5 --rounds 3

Side by side in one run, interleaved (A, B, C, A, B, C, …), the digits model, every request
low priority with a 1 µs deadline in its headers, so each one is refused:

- **A, in the engine** — today's path: the engine's own HTTP server
  (``server/http_protocol.py``) refuses it from its headers with
  :class:`~sordino.server.early_shed.EarlyShed`; the CPU is the engine process's;
- **B, from the board** — a front-end process (``bench_refusal frontend``: uvloop, one
  ``httptools`` parser per connection and the engine's parser-free read of whole
  requests, ``connection_guard.plain_head``; nothing else) refuses it with
  :class:`~sordino.server.board_shed.BoardShed`, reading the engine's load board
  (``server/load_board.py``, published by
  :class:`~sordino.server.load_publisher.LoadBoardPublisher`); the CPU is the front
  end's, and the engine's meanwhile is reported too (the refusals never reach it);
- **C, the floor** — ``bench/refuser.c`` (``bench_overload``'s floor): a C server that
  only reads each request and writes a 503, the least any server spends here.

The engine is ``sordino.testing.serve_in_thread`` on uvloop in its own process (so that
its publisher can be started; ``sordino start`` has no switch for it yet). The load is
``bench/openloop.c`` (open loop, 64 keep-alive connections, pinned to core 0; the
measured process to core 1, as in ``bench_overload``). Also the decision alone, in each
process, on its own loop: µs of the loop thread's CPU per call, when each request is in
an event-loop iteration of its own (the board read each time) and when many share one;
and what one publish costs the engine's loop; and the Python of a refusal alone: a
refused request read by each process's protocol from a transport that makes no system
call (µs of the loop thread's CPU a request, one request a read, many reads an
iteration).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from bench.bench_overload import WORKLOADS, Generator, Refuser, floor_cost
from bench.common import console, save

TARGET = b"/v2/models/digits-classifier/infer"
HEADERS = [(b"x-sordino-priority", b"low"), (b"x-sordino-timeout", b"1")]
NOT_FORWARDED = (
    b"HTTP/1.1 502 Bad Gateway\r\ncontent-type: text/plain\r\ncontent-length: 13\r\n\r\n"
    b"not forwarded"
)


def decision_cost(shed: Callable[[bytes, Sequence[tuple[bytes, bytes]]], bytes | None],
                  n: int, reset: Callable[[], None] | None) -> float:  # fmt: skip
    """µs of this thread's CPU per decision; ``reset`` (if given) before each makes it
    the first of its loop iteration (nothing cached)."""
    began = time.thread_time()
    for _ in range(n):
        if reset is not None:
            reset()
        if shed(TARGET, HEADERS) is None:
            raise RuntimeError("the benchmark's request was not refused")
    return (time.thread_time() - began) / n * 1e6


async def _micro(shed: Any, n: int, protocol: Callable[[], Any] | None = None) -> dict[str, float]:
    def reset() -> None:
        # A new iteration: decide (and read) again.
        shed._decided_at = shed._now = float("nan")

    result = {
        "decision_us_alone": decision_cost(shed, n, reset),
        "decision_us_shared": decision_cost(shed, n, None),
    }
    if protocol is not None:
        result["protocol_us"] = _protocol_cost(protocol, n)
    return result


class _Transport:
    """A transport that takes the writes and makes no system call."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += 1

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 9) if name in ("peername", "sockname") else default

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def close(self) -> None: ...


class _ServerState:
    """What the engine's protocol keeps in uvicorn's server state."""

    def __init__(self) -> None:
        self.total_requests = 0
        self.connections: set[Any] = set()
        self.tasks: set[Any] = set()
        self.default_headers: list[tuple[bytes, bytes]] = []


def _protocol_cost(make: Callable[[], Any], n: int) -> float:
    """µs of this thread's CPU per refused request read by a connection's protocol
    (``make`` returns one, connected to a :class:`_Transport`) from a read of its own,
    all in one loop iteration: the Python of a refusal without its system calls."""
    from bench.bench_overload import request_bytes

    request = request_bytes(WORKLOADS["digits"], "127.0.0.1:9", "low", 1, "headers")
    protocol = make()
    transport = protocol.transport
    for _ in range(100):  # the first is read by the parser; then it is refusing
        protocol.data_received(request)
    written = transport.written
    began = time.thread_time()
    for _ in range(n):
        protocol.data_received(request)
    spent = time.thread_time() - began
    if transport.written - written != n:
        raise RuntimeError("the benchmark's requests were not all refused")
    return spent / n * 1e6


async def _publish_cost(publisher: Any, n: int) -> float:
    """µs of the engine loop's CPU per publish (every route, then the header)."""
    began = time.thread_time()
    for _ in range(n):
        publisher.publish()
    return (time.thread_time() - began) / n * 1e6


# -- the engine process ------------------------------------------------------------


def engine(data_dir: str) -> None:
    import uvloop

    from sordino.config import RuntimeConfig
    from sordino.models.repository import builtin_sources
    from sordino.server.load_publisher import LoadBoardPublisher
    from sordino.testing import serve_in_thread

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    config = RuntimeConfig.model_validate({"server": {"shed_loop_lag": 0, "data_dir": data_dir}})
    sources = [s for s in builtin_sources() if s.name == "digits-classifier"]
    with serve_in_thread(config, sources) as server:
        import httpx

        body = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                            "data": [0.5] * 64}]}  # fmt: skip
        httpx.post(f"{server.url}{TARGET.decode()}", json=body, timeout=30)  # cost known
        publisher = LoadBoardPublisher(server.runtime)
        server.loop.call_soon_threadsafe(publisher.start)
        while publisher.published == 0:
            time.sleep(0.01)
        print(json.dumps({"url": server.url, "board": publisher.name}), flush=True)

        def protocol() -> Any:
            from sordino.server.connection_guard import ConnectionGuard
            from sordino.server.http_protocol import http_protocol

            guard = ConnectionGuard(max_connections=1024, max_per_client=1024,
                                    header_timeout=30.0, body_timeout=30.0)  # fmt: skip
            guard.early_shed = server.early_shed
            made = http_protocol(guard, None, server.runtime, 5.0)(  # type: ignore[arg-type]
                server_state=_ServerState(), _loop=asyncio.get_running_loop()
            )
            made.connection_made(_Transport())
            return made

        for line in sys.stdin:
            if line.strip() == "micro":
                result = server.call(_micro(server.early_shed, 20_000, protocol))
                result["publish_us"] = server.call(_publish_cost(publisher, 2_000))
                print(json.dumps(result), flush=True)
        server.loop.call_soon_threadsafe(publisher.close)


# -- the front-end process ---------------------------------------------------------


class _Front(asyncio.Protocol):
    """One connection: parse, ask the board, answer (a refusal, or 502: not forwarded)."""

    def __init__(self, shed: Any) -> None:
        import httptools

        from sordino.server.connection_guard import plain_head

        self.plain_head = plain_head
        self.shed = shed
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.response: bytes | None = None
        self.in_message = False
        self.asked = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        # As the engine's own protocol does while refusing (``guarded_reads.py``): whole
        # requests at a request boundary are read without the parser's callbacks.
        while not self.in_message and data[:5] == b"POST ":
            end = data.find(b"\r\n\r\n")
            head = self.plain_head(data, end) if end > 0 else None
            if head is None or end + 4 + head[2] > len(data):
                break
            response = self.shed(head[0], head[1])
            if response is None:
                self.asked = True  # the parser reads it next, and must not ask again
                break
            assert self.transport is not None
            self.transport.write(response)
            data = data[end + 4 + head[2] :]
        if data:
            self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.in_message = True

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        asked, self.asked = self.asked, False
        self.response = None if asked else self.shed(self.url, self.headers)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        self.in_message = False
        self.transport.write(self.response or NOT_FORWARDED)


def frontend(board_name: str) -> None:
    import uvloop

    from sordino.server.board_shed import attach_board_shed

    async def main() -> None:
        shed = attach_board_shed(board_name, {})

        def protocol() -> _Front:
            made = _Front(shed)
            made.connection_made(_Transport())  # type: ignore[arg-type]
            return made

        micro = await _micro(shed, 20_000, protocol)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Front(shed), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        print(json.dumps({"port": port, **micro}), flush=True)
        await loop.run_in_executor(None, sys.stdin.read)  # until the bench closes it
        server.close()
        shed.board.close()

    uvloop.run(main())


# -- the run -----------------------------------------------------------------------


def _spawn(args: list[str], cpu: int | None) -> subprocess.Popen[str]:
    prefix = ["taskset", "-c", str(cpu)] if cpu is not None else []
    return subprocess.Popen(
        [*prefix, sys.executable, "-m", "bench.bench_refusal", *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


def _line(process: subprocess.Popen[str]) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        raise RuntimeError("a benchmark process ended early")
    result: dict[str, Any] = json.loads(line)
    return result


def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def measure(
    generator: Generator, pid: int, engine_pid: int, rate: float, seconds: float
) -> dict[str, Any]:
    """CPU per refusal of process ``pid`` (and of the engine meanwhile) at ``rate``."""
    before, engine_before = _cpu(pid), _cpu(engine_pid)
    outcomes = generator.open(rate, seconds, deadline_us=1, where="headers", connections=64,
                              high_share=0.0)  # fmt: skip
    spent, engine_spent = _cpu(pid) - before, _cpu(engine_pid) - engine_before
    refused = int((outcomes.status == 503).sum())
    return {
        "refused": refused,
        "other": int(outcomes.status.size) - refused,
        "cpu_us_per_refusal": spent / max(refused, 1) * 1e6,
        "engine_cpu_us_per_refusal": engine_spent / max(refused, 1) * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", nargs="?", default="run", choices=["run", "engine", "frontend"])
    parser.add_argument("arg", nargs="?")
    parser.add_argument("--rate", type=float, default=5000.0)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cpu", type=int, default=1, help="core of the measured processes")
    parser.add_argument("--client-cpu", type=int, default=0)
    args = parser.parse_args()
    if args.mode == "engine":
        return engine(args.arg)
    if args.mode == "frontend":
        return frontend(args.arg)
    cpus = os.cpu_count() or 1
    cpu = args.cpu if cpus > 1 else None
    client_cpu = args.client_cpu if cpus > 1 else None
    with tempfile.TemporaryDirectory(prefix="sordino-refusal-") as scratch:
        engine_process = _spawn(["engine", scratch], cpu)
        front = None
        try:
            started = _line(engine_process)
            front = _spawn(["frontend", started["board"]], cpu)
            front_started = _line(front)
            assert engine_process.stdin is not None
            engine_process.stdin.write("micro\n")
            engine_process.stdin.flush()
            engine_micro = _line(engine_process)
            engine_gen = Generator(started["url"], client_cpu, WORKLOADS["digits"])
            front_gen = Generator(f"http://127.0.0.1:{front_started['port']}", client_cpu,
                                  WORKLOADS["digits"])  # fmt: skip
            refuser = Refuser(Path(scratch), cpu)
            rounds: list[dict[str, Any]] = []
            for round_ in range(args.rounds):
                in_engine = measure(engine_gen, engine_process.pid, engine_process.pid,
                                    args.rate, args.seconds)  # fmt: skip
                board = measure(front_gen, front.pid, engine_process.pid, args.rate, args.seconds)
                floor = floor_cost(refuser, WORKLOADS["digits"], client_cpu, args.rate,
                                   args.seconds)  # fmt: skip
                rounds.append({"engine": in_engine, "board": board, "floor": floor})
                console.print(
                    f"round {round_ + 1}: in the engine {in_engine['cpu_us_per_refusal']:.1f} "
                    f"µs/refusal ({in_engine['refused']} refused); from the board "
                    f"{board['cpu_us_per_refusal']:.1f} µs in the front end + "
                    f"{board['engine_cpu_us_per_refusal']:.1f} µs in the engine "
                    f"({board['refused']} refused, {board['other']} other); the C floor "
                    f"{floor['cpu_us_per_refusal']:.1f} µs"
                )
            refuser.close()
            engine_gen.close()
            front_gen.close()
        finally:
            for process in (front, engine_process):
                if process is not None and process.stdin is not None:
                    process.stdin.close()
                    try:
                        process.wait(30)
                    except subprocess.TimeoutExpired:
                        process.kill()
    micro = {"engine": engine_micro,
             "board": {k: v for k, v in front_started.items() if k != "port"}}  # fmt: skip
    console.print(
        "decision alone, µs (a request alone in its loop iteration / many sharing one): "
        f"in the engine {micro['engine']['decision_us_alone']:.2f} / "
        f"{micro['engine']['decision_us_shared']:.2f}; from the board "
        f"{micro['board']['decision_us_alone']:.2f} / {micro['board']['decision_us_shared']:.2f}"
        f"; a publish (one route) {micro['engine']['publish_us']:.1f} µs of the engine's loop"
    )
    console.print(
        "a refused request read by the protocol, without system calls, µs: in the engine "
        f"{micro['engine']['protocol_us']:.2f}; the front end {micro['board']['protocol_us']:.2f}"
    )
    path = save("refusal", {"rate": args.rate, "seconds": args.seconds, "rounds": rounds,
                            "decision": micro, "load_average": os.getloadavg()})  # fmt: skip
    console.print(f"saved {path}")


if __name__ == "__main__":
    main()
