"""The HTTP server alone: uvicorn + httptools, a bare protocol and granian, issue 16.

    python -m bench.bench_http_server                      # uvicorn only if granian is absent
    python -m bench.bench_http_server --python /path/to/venv/bin/python  # one with granian

Each server runs one process on one worker thread serving the same tiny app: read the
KServe binary request body, answer a fixed KServe binary response of W1's size (a
JSON header and 10 FP32 values) with ``Content-Length`` and ``Inference-Header-Content-
Length``. No model, no scheduler: what is measured is the server's own cost per request.
The same load generator as ``bench_triton`` (``bench/peer_load.py``) drives each at 64
and 1 in flight, servers interleaved; per cell req/s, p50 and the server process's CPU
ms per request (psutil). granian is not a dependency of sordino: pass ``--python`` of an
environment where ``pip install granian`` ran.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench import peer_load
from bench.common import console, save

HEADER = b'{"model_name":"w1","model_version":"1","outputs":[{"name":"y","datatype":"FP32","shape":[1,10],"parameters":{"binary_data_size":40}}]}'  # noqa: E501
BODY = HEADER + bytes(40)
HEADERS = [
    (b"content-type", b"application/octet-stream"),
    (b"inference-header-content-length", str(len(HEADER)).encode()),
    (b"content-length", str(len(BODY)).encode()),
]

# The servers' module: imported by each server process (``--app`` below).
APP = """
BODY = {body!r}
HEADERS = {headers!r}

async def asgi(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({{"type": "http.response.start", "status": 200, "headers": HEADERS}})
    await send({{"type": "http.response.body", "body": BODY}})

class rsgi:
    async def __rsgi__(self, scope, protocol):
        await protocol()
        protocol.response_bytes(200, [(k.decode(), v.decode()) for k, v in HEADERS], BODY)

rsgi = rsgi()

# A bare asyncio.Protocol over httptools (no ASGI): the floor under uvicorn, answering
# with the head and the body in one write or in two (as uvicorn does).
import asyncio, sys


HEAD = (b"HTTP/1.1 200 OK\\r\\n" + b"".join(k + b": " + v + b"\\r\\n" for k, v in HEADERS)
        + b"\\r\\n")

class Bare(asyncio.Protocol):
    def __init__(self, writes):
        import httptools  # the servers' environment may lack it: imported on use

        self.parser = httptools.HttpRequestParser(self)
        self.writes = writes

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.parser.feed_data(data)

    def on_message_complete(self):
        if self.writes == 1:
            self.transport.write(HEAD + BODY)
        else:
            self.transport.write(HEAD)
            self.transport.write(BODY)

def bare(port, writes):
    import uvloop

    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Bare(writes), "127.0.0.1", port)
        await server.serve_forever()
    uvloop.run(main())

if __name__ == "__main__":
    bare(int(sys.argv[1]), int(sys.argv[2]))
"""

SERVERS = {
    "uvicorn+httptools": lambda port: ["-m", "uvicorn", "app:asgi", "--port", str(port),
                                       "--http", "httptools", "--loop", "uvloop",
                                       "--log-level", "warning", "--no-access-log"],
    "bare protocol, 2 writes": lambda port: ["app.py", str(port), "2"],
    "bare protocol, 1 write": lambda port: ["app.py", str(port), "1"],
    "granian asgi": lambda port: ["-m", "granian", "--interface", "asgi", "--port", str(port),
                                  "--workers", "1", "--runtime-threads", "1",
                                  "--log-level", "warning", "--no-ws", "app:asgi"],
    "granian rsgi": lambda port: ["-m", "granian", "--interface", "rsgi", "--port", str(port),
                                  "--workers", "1", "--runtime-threads", "1",
                                  "--log-level", "warning", "--no-ws", "app:rsgi"],
}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the server did not come up in 20 s")


def _tree_cpu(pid: int) -> float:
    root = psutil.Process(pid)
    total = sum(root.cpu_times()[:2])
    for child in root.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            continue
    return total


def run(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    (scratch / "app.py").write_text(APP.format(body=BODY, headers=HEADERS))
    python = args.python or sys.executable  # granian's; uvicorn runs under this one
    has_granian = subprocess.run([python, "-c", "import granian"], capture_output=True)
    names = [n for n in SERVERS if has_granian.returncode == 0 or not n.startswith("granian")]
    if len(names) < len(SERVERS):
        console.print(f"granian is not importable by {python}: measuring uvicorn only")
    row = np.zeros(256, dtype=np.float32)
    procs: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    cells: list[dict[str, Any]] = []
    try:
        for name in names:
            port = _free_port()
            proc = subprocess.Popen(
                [python if name.startswith("granian") else sys.executable, *SERVERS[name](port)],
                cwd=scratch,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            procs[name] = (proc, f"http://127.0.0.1:{port}")
            _wait_listening(port, proc)
        for r in range(args.repeat):
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                for name in names:
                    proc, url = procs[name]
                    host = url.split("//", 1)[1]
                    requests = [peer_load.kserve_http_request(host, "w1", "x", row)]
                    asyncio.run(peer_load.http_closed_loop(url, requests, concurrency, 0.5))
                    before = _tree_cpu(proc.pid)
                    answers = asyncio.run(
                        peer_load.http_closed_loop(url, requests, concurrency, args.seconds)
                    )
                    cpu = _tree_cpu(proc.pid) - before
                    if any(s != 200 for s in answers.statuses):
                        raise SystemExit(f"{name}: an answer was not 200")
                    n = len(answers.latencies)
                    cell = {
                        "server": name, "concurrency": concurrency, "repeat": r,
                        "rate": n / answers.seconds,
                        "p50_ms": float(np.percentile(answers.latencies, 50) * 1000),
                        "cpu_ms": cpu * 1000 / n,
                    }  # fmt: skip
                    cells.append(cell)
                    console.print(
                        f"{name:18} c{concurrency:<3} {cell['rate']:7.0f} req/s  p50 "
                        f"{cell['p50_ms']:.3f} ms  server CPU {cell['cpu_ms']:.3f} ms/req"
                    )
    finally:
        for proc, _ in procs.values():
            proc.terminate()
            proc.wait(timeout=10)
    medians = {}
    console.print("\nmedians:")
    for name in names:
        for concurrency in args.concurrency.split(","):
            chosen = [
                c for c in cells if c["server"] == name and c["concurrency"] == int(concurrency)
            ]
            m = {k: statistics.median(c[k] for c in chosen) for k in ("rate", "p50_ms", "cpu_ms")}
            medians[f"{name} c{concurrency}"] = m
            console.print(
                f"  {name:18} c{concurrency:<3} {m['rate']:7.0f} req/s  p50 {m['p50_ms']:.3f} ms"
                f"  CPU {m['cpu_ms']:.3f} ms/req"
            )
    return {"cells": cells, "medians": medians}


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", help="the interpreter the servers run (one with granian)")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds a cell")
    parser.add_argument("--repeat", type=int, default=3, help="rounds over every cell")
    parser.add_argument("--concurrency", default="64,1", help="requests in flight")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        result = run(args, Path(scratch))
    save("http_server", {"args": vars(args), **result})


if __name__ == "__main__":
    main()
