"""A Stable Diffusion export served by sordino and by diffusers, side by side, under users.

(a) diffusers: optimum's ``ORTStableDiffusionPipeline`` on the export behind a minimal
HTTP server, one request at a time, as a user would write it (run by the side virtual
environment's python, ``--side-python``: torch, diffusers, optimum; see
tools/make_tiny_sd_export.py); (b) sordino: ``sordino start --model sd=EXPORT``. For
each number of concurrent users, every user sends text-to-image requests back to back
(distinct seeds, so no result is reused) for ``--seconds``; the table gives images/s
and latency percentiles of both::

    python bench/bench_sd_export.py --side-python /work/side/venv/bin/python \\
        --export tests/fixtures/sd/tiny-sd --users 1 8 --seconds 20 --steps 10

Load goes to 127.0.0.1 only, bounded in time; both servers are stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

DIFFUSERS_SERVER = r"""
import io, json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
import torch
from optimum.onnxruntime import ORTStableDiffusionPipeline

pipe = ORTStableDiffusionPipeline.from_pretrained(sys.argv[1])
pipe.set_progress_bar_config(disable=True)

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        generator = torch.Generator().manual_seed(body.get("seed", 0))
        image = pipe(body["prompt"], num_inference_steps=body["steps"],
                     guidance_scale=body["guidance"], generator=generator).images[0]
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        data = buffer.getvalue()
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", int(sys.argv[2])), Handler).serve_forever()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str, process: subprocess.Popen[bytes], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server for {url} ended at start-up (exit {process.returncode})")
        try:
            httpx.get(url, timeout=2.0)
            return
        except httpx.HTTPError:
            time.sleep(0.5)
    raise SystemExit(f"{url} did not come up in {timeout:.0f} s")


def load(url: str, body_for: object, users: int, seconds: float) -> tuple[float, list[float]]:
    """``users`` threads sending back to back for ``seconds``: images/s and latencies."""
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    counter = iter(range(10**9))

    def user() -> None:
        with httpx.Client(timeout=300.0) as client:
            while time.monotonic() < stop:
                with lock:
                    n = next(counter)
                started = time.perf_counter()
                answer = client.post(url, json=body_for(n))  # type: ignore[operator]
                answer.raise_for_status()
                with lock:
                    latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=user) for _ in range(users)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(latencies) / (time.monotonic() - began), latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side-python", required=True, help="python with optimum + diffusers")
    parser.add_argument("--export", default="tests/fixtures/sd/tiny-sd")
    parser.add_argument("--users", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    export = str(Path(args.export).resolve())
    ours, theirs = free_port(), free_port()
    script = Path(tempfile.mkdtemp()) / "diffusers_server.py"
    script.write_text(DIFFUSERS_SERVER, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    servers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sordino",
                "start",
                "--no-builtin",
                "--model",
                f"sd={export}",
                "--http-port",
                str(ours),
                "--grpc-port",
                str(free_port()),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [args.side_python, str(script), export, str(theirs)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]
    try:
        wait_up(f"http://127.0.0.1:{ours}/v2/health/ready", servers[0])
        wait_up(f"http://127.0.0.1:{theirs}/", servers[1])

        def body(n: int) -> dict[str, object]:
            return {
                "prompt": "a red house at night",
                "steps": args.steps,
                "guidance": 7.5,
                "seed": 1000 + n,
            }

        targets = {
            "diffusers (ORT pipeline, one at a time)": f"http://127.0.0.1:{theirs}/generate",
            "sordino": f"http://127.0.0.1:{ours}/v2/models/sd/generate",
        }
        print(f"export {export}, {args.steps} steps, guidance 7.5, {args.seconds:.0f} s per row")
        print(f"{'server':42} {'users':>5} {'images/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
        for users in args.users:
            for name, url in targets.items():
                load(url, body, users, min(3.0, args.seconds))  # warm
                rate, latencies = load(url, body, users, args.seconds)
                ms = np.percentile(np.array(latencies) * 1000, [50, 99])
                print(f"{name:42} {users:>5} {rate:>9.1f} {ms[0]:>8.0f} {ms[1]:>8.0f}")
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
