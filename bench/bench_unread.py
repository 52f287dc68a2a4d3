"""Clients that send without reading: what one takes of the server's memory.

    python -m bench.bench_unread                          # this checkout
    python -m bench.bench_unread --compare /tmp/before    # A = another checkout's src/, B = this

One client per scenario, each against its own ``sordino start`` on the digits
classifier, for ``--seconds`` or until it has sent ``--cap-mb``:

- ``pipeline``: HTTP requests of 32 rows (14 KB) pipelined on one connection (receive
  buffer 4 KB), none of the answers read;
- ``stream``: gRPC ``ModelStreamInfer`` messages of 32 rows on one stream, no answer read
  (``stream 2fe``: the same through ``--frontends 2``);
- ``headers``: header lines without end on one connection;
- ``bodies``: connection after connection, each sending a 60 MB body but its last byte
  (what it got in counts the bodies on connections the server still holds open).

Per scenario: what the client got in (MB the server took, up to the cap), whether it
stopped taking them (under 1 % more over the run's last 2 s), and the peak RSS of the
server's process tree (engine, workers, front ends; psutil every 50 ms) above its idle
figure.
Writes ``bench/results/unread.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.resources
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.common import RESULTS, sordino_server

ROWS = 32


def _body() -> bytes:
    tensor = {
        "name": "pixels",
        "shape": [ROWS, 64],
        "datatype": "FP32",
        "data": [0.5] * (ROWS * 64),
    }
    return json.dumps({"inputs": [tensor]}).encode()


def _pipeline(http: str, sent: list[int], stop: threading.Event) -> None:
    host, port = http.removeprefix("http://").rsplit(":", 1)
    body = _body()
    request = (
        b"POST /v2/models/digits-classifier/infer HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    ) + body
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        sock.settimeout(0.5)
        while not stop.is_set():
            try:
                sock.sendall(request)
            except TimeoutError:
                continue  # not taken now: the buffers are full
            sent[0] += len(request)


def _headers(http: str, sent: list[int], stop: threading.Event) -> None:
    host, port = http.removeprefix("http://").rsplit(":", 1)
    lines = (b"x-filler: " + b"a" * 90 + b"\r\n") * 100
    with socket.create_connection((host, int(port)), timeout=0.5) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\n")
        while not stop.is_set():
            try:
                sock.sendall(lines)
            except TimeoutError:
                continue
            sent[0] += len(lines)


BODY_MB = 60
"""A ``bodies`` body: under the default ``server.max_request_size`` (64 MB)."""


def _bodies(http: str, sent: list[int], stop: threading.Event) -> None:
    host, port = http.removeprefix("http://").rsplit(":", 1)
    size = BODY_MB << 20
    head = (
        b"POST /v2/models/digits-classifier/infer HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % size
    )
    chunk = b" " * (1 << 20)
    held: list[tuple[socket.socket, int]] = []
    try:
        while not stop.is_set():
            sock = socket.create_connection((host, int(port)), timeout=5)
            done = 0
            with contextlib.suppress(OSError):  # closed under it: it holds nothing
                sock.sendall(head)
                while done < size - 1 and not stop.is_set():
                    part = chunk[: min(len(chunk), size - 1 - done)]
                    sock.sendall(part)
                    done += len(part)
            held.append((sock, done))
            held = [(s, n) for s, n in held if _still_open(s)]
            sent[0] = sum(n for _, n in held)
    finally:
        for sock, _ in held:
            sock.close()


def _still_open(sock: socket.socket) -> bool:
    """Whether the server has neither answered (a 408) nor closed the connection."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)
    return False


def _stream(grpc_address: str, sent: list[int], stop: threading.Event) -> None:
    import grpc

    from sordino.protocol.pb import kserve_v2_pb2 as pb

    message = pb.ModelInferRequest(model_name="digits-classifier")
    message.inputs.add(name="pixels", datatype="FP32", shape=[ROWS, 64])
    message.raw_input_contents.append(np.full((ROWS, 64), 0.5, np.float32).tobytes())
    raw = message.SerializeToString()

    def messages() -> Iterator[bytes]:  # gRPC pulls the next one as it takes it
        while not stop.is_set():
            sent[0] += len(raw)
            yield raw

    with grpc.insecure_channel(grpc_address) as channel:
        call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        answers = call(messages())
        stop.wait()
        answers.cancel()


def _run(
    name: str, args: list[str], env: dict[str, str], seconds: float, cap: int
) -> dict[str, Any]:
    with sordino_server(args, env=env) as server:
        root = psutil.Process(server.pid)

        def tree_rss() -> int:
            total = 0
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += proc.memory_info().rss
            return total

        time.sleep(1.0)
        idle = peak = tree_rss()
        sent, stop = [0], threading.Event()
        target = {"headers": _headers, "pipeline": _pipeline, "bodies": _bodies}.get(name, _stream)
        address = server.grpc if target is _stream else server.http

        def client() -> None:
            # Closed by the server (a 431, a reset): it takes no more.
            with contextlib.suppress(OSError):
                target(address, sent, stop)

        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        started = time.monotonic()
        taken: list[tuple[float, int]] = []  # (time, bytes taken so far)
        while time.monotonic() - started < seconds and sent[0] < cap:
            peak = max(peak, tree_rss())
            taken.append((time.monotonic(), sent[0]))
            time.sleep(0.05)
        peak = max(peak, tree_rss())
        stop.set()
        thread.join(10)
        # Taking no more: under 1 % more went in over the run's last 2 s.
        end = taken[-1][0] if taken else started
        before = max((n for t, n in taken if t <= end - 2.0), default=None)
        stopped = before is not None and sent[0] <= before * 1.01
        return {
            "scenario": name,
            "sent_mb": round(sent[0] / 2**20, 1),
            "stopped_taking": stopped,
            "peak_rss_mb_over_idle": round((peak - idle) / 2**20),
            "idle_rss_mb": round(idle / 2**20),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", help="another checkout: its src/ is side A")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--cap-mb", type=int, default=1024, help="stop a client past this")
    parser.add_argument("--scenarios", default="pipeline,stream,stream 2fe,headers,bodies")
    options = parser.parse_args()
    digits = importlib.resources.files("sordino.models.builtin") / "digits-classifier.onnx"
    model = ["--model", str(digits)]
    sides: list[tuple[str, dict[str, str]]] = [("B", {})]
    if options.compare:
        sides.insert(0, ("A", {"PYTHONPATH": str(Path(options.compare).resolve() / "src")}))
    rows = []
    for scenario in options.scenarios.split(","):
        args = [*model, "--frontends", "2"] if scenario == "stream 2fe" else model
        for side, env in sides:
            row = _run(scenario, args, env, options.seconds, options.cap_mb * 2**20)
            row["side"] = side
            rows.append(row)
            print(
                f"{side} {scenario:11s} sent {row['sent_mb']:8.1f} MB  "
                f"{'stopped taking it' if row['stopped_taking'] else 'took all of it':18s} "
                f"server tree +{row['peak_rss_mb_over_idle']} MB over {row['idle_rss_mb']} MB idle",
                flush=True,
            )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "unread.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
