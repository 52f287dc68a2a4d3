"""A Stable Diffusion export served by sordino and by diffusers, side by side, under users.

(a) diffusers: optimum's ``ORTStableDiffusionPipeline`` on the export behind a minimal
HTTP server, one request at a time, as a user would write it (run by the side virtual
environment's python, ``--side-python``: torch, diffusers, optimum; see
tools/make_tiny_sd_export.py); (b) sordino: ``sordino start`` serving the export as
``sd`` (and, with ``--step-cache THRESHOLD``, a second time as ``sd-cached`` with
``iterative.step_cache`` on). For each number of concurrent users, every user sends
text-to-image requests back to back for ``--seconds``, the servers taking turns for
``--rounds`` rounds (so a change in the machine's load falls on all of them). Request
``n`` of a server has seed ``1000 + n`` and initial latents numpy's
``default_rng(seed).standard_normal``, sent to both sides (diffusers' ``latents=``,
sordino's ``latents`` input): every seed is new (nothing is reused), and request ``n``
must give the same image on every server. The table gives images/s, latency
percentiles and the largest pixel difference from diffusers' image of the same request::

    SIDE=/work/wt/sd28-side/venv/bin/python
    python bench/bench_sd_export.py --side-python $SIDE --mid --users 1 8 --seconds 20 \\
        --steps 10 --rounds 2 [--step-cache 0.1] [--diffusers-threads 1]

``--mid`` serves the mid-size random export of ``tools/make_tiny_sd_export.py --mid``
(built with ``--side-python`` into ``--cache``, default ``~/.cache/sordino-bench``, the
first time; never committed); ``--export DIR`` serves another (default: the tiny test
fixture). Load goes to 127.0.0.1 only, bounded in time; the servers are stopped at the
end.
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent

DIFFUSERS_SERVER = r"""
import io, json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
import numpy as np
import torch
import onnxruntime
from optimum.onnxruntime import ORTStableDiffusionPipeline

options = None
if int(sys.argv[3]):  # else ONNX Runtime's defaults, as a user gets them
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = int(sys.argv[3])
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
pipe = ORTStableDiffusionPipeline.from_pretrained(sys.argv[1], session_options=options)
pipe.set_progress_bar_config(disable=True)

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        height, width = body["height"], body["width"]
        latents = np.asarray(body["latents"], dtype=np.float32)
        latents = latents.reshape(1, -1, height // 8, width // 8)
        image = pipe(body["prompt"], num_inference_steps=body["steps"], height=height,
                     width=width, guidance_scale=body["guidance"],
                     latents=torch.from_numpy(latents)).images[0]
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


@dataclass
class Target:
    """One server under test and what its requests gave."""

    name: str
    url: str
    sordino: bool
    seeds: threading.Lock = field(default_factory=threading.Lock)
    next_n: int = 0
    images: dict[int, np.ndarray] = field(default_factory=dict)
    calls: list[int] = field(default_factory=list)
    """Steps the denoiser ran per image (``steps_used`` less ``cached_steps``)."""

    def take(self) -> int:
        with self.seeds:
            n = self.next_n
            self.next_n += 1
            return n


@dataclass
class Row:
    images: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(
    url: str,
    process: subprocess.Popen[bytes],
    ready: bool,
    log: Path | None = None,
    timeout: float = 300.0,
) -> None:
    """Until ``url`` answers (with ``ready``: answers 200); a server that ends is reported
    with the end of its ``log``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            said = log.read_text(errors="replace").strip().splitlines()[-5:] if log else []
            raise SystemExit(
                f"the server for {url} ended at start-up (exit {process.returncode})"
                + "".join(f"\n  {line}" for line in said)
            )
        try:
            if httpx.get(url, timeout=2.0).status_code == 200 or not ready:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} did not come up in {timeout:.0f} s")


def latents_for(seed: int, side: int) -> np.ndarray:
    return (
        np.random.default_rng(seed).standard_normal((1, 4, side // 8, side // 8)).astype(np.float32)
    )


def load(
    target: Target, body_for: Callable[[int], dict[str, object]], users: int, seconds: float
) -> Row:
    """``users`` threads sending back to back for ``seconds``; keeps each request's image."""
    row = Row()
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    failures: list[str] = []

    def user() -> None:
        with httpx.Client(timeout=600.0) as client:
            while time.monotonic() < stop and not failures:
                n = target.take()
                started = time.perf_counter()
                answer = client.post(target.url, json=body_for(n))
                elapsed = time.perf_counter() - started
                if answer.status_code != 200:
                    failures.append(f"{target.name}: {answer.status_code} {answer.text[:300]}")
                    return
                if target.sordino:
                    document = answer.json()
                    png = base64.b64decode(document["png"])
                    cached = int(document.get("parameters", {}).get("cached_steps", 0))
                    steps = int(document.get("parameters", {}).get("steps_used", 0))
                else:
                    png, cached, steps = answer.content, 0, 0
                image = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
                with lock:
                    row.latencies.append(elapsed)
                    target.images[n] = image
                    if target.sordino:
                        target.calls.append(steps - cached)

    threads = [threading.Thread(target=user) for _ in range(users)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit(failures[0])
    row.images = len(row.latencies)
    row.seconds = time.monotonic() - began
    return row


def difference(target: Target, reference: Target) -> tuple[float, float, int]:
    """Max and mean |pixel difference| in [0, 1] over the requests both answered."""
    common = sorted(set(target.images) & set(reference.images))
    if not common:
        return float("nan"), float("nan"), 0
    diffs = [
        np.abs(target.images[n].astype(np.int16) - reference.images[n].astype(np.int16))
        for n in common
    ]
    return (
        max(float(d.max()) for d in diffs) / 255.0,
        float(np.mean([d.mean() for d in diffs])) / 255.0,
        len(common),
    )


def mid_export(side_python: str, cache: Path) -> Path:
    """The mid-size export of tools/make_tiny_sd_export.py --mid, built once into ``cache``."""
    out = cache / "mid-sd"
    if not (out / "unet" / "model.onnx").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        print(f"building the mid-size export into {out} (a few minutes, once)", flush=True)
        subprocess.run(
            [side_python, str(ROOT / "tools" / "make_tiny_sd_export.py"), "--mid", str(out)],
            check=True,
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
            stdout=subprocess.DEVNULL,
        )
    return out


def sordino_config(export: str, step_cache: float | None, max_skips: int, folder: Path) -> Path:
    """runtime_config.yaml serving the export as ``sd`` (and ``sd-cached``)."""
    lines = ["models:", "  - name: sd", f"    path: {export}"]
    if step_cache is not None:
        lines += [
            "  - name: sd-cached",
            f"    path: {export}",
            "    iterative:",
            f"      step_cache: {{enabled: true, threshold: {step_cache}, max_skips: {max_skips}}}",
        ]
    path = folder / "runtime_config.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def batch_counts(metrics_url: str) -> dict[str, tuple[float, float]]:
    """Rows and calls per sordino model so far (``sordino_batch_size``'s sum and count)."""
    try:
        text = httpx.get(metrics_url, timeout=10.0).text
    except httpx.HTTPError:
        return {}
    counts: dict[str, tuple[float, float]] = {}
    pattern = r'sordino_batch_size_(sum|count)\{[^}]*model="(sd[^"]*)"[^}]*\} (\S+)'
    for line in text.splitlines():
        match = re.match(pattern, line)
        if match:
            kind, model, value = match.groups()
            rows, calls = counts.get(model, (0.0, 0.0))
            if kind == "sum":
                rows += float(value)
            else:
                calls += float(value)
            counts[model] = (rows, calls)
    return counts


def batching(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> str:
    """Mean rows per call of each model between two :func:`batch_counts`."""
    parts = []
    for model, (rows, calls) in sorted(after.items()):
        rows -= before.get(model, (0.0, 0.0))[0]
        calls -= before.get(model, (0.0, 0.0))[1]
        if calls:
            parts.append(f"{model} {rows / calls:.1f} rows/call ({calls:.0f} calls)")
    return ", ".join(parts) or "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side-python", required=True, help="python with optimum + diffusers")
    parser.add_argument("--export", default=str(ROOT / "tests/fixtures/sd/tiny-sd"))
    parser.add_argument("--mid", action="store_true", help="the mid-size export (built once)")
    parser.add_argument(
        "--cache", type=Path, default=Path.home() / ".cache" / "sordino-bench", help="for --mid"
    )
    parser.add_argument("--users", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=1, help="servers take turns this often")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--side", type=int, default=64, help="image width and height, px")
    parser.add_argument(
        "--step-cache",
        type=float,
        default=None,
        metavar="THRESHOLD",
        help="also serve the export with iterative.step_cache at this threshold",
    )
    parser.add_argument("--max-skips", type=int, default=2)
    parser.add_argument(
        "--sordino-mode", default=None, help="sordino's scheduler mode (default: its own)"
    )
    parser.add_argument(
        "--diffusers-threads",
        type=int,
        default=0,
        help="diffusers' ONNX Runtime intra-op threads, spinning off (default 0: its defaults)",
    )
    args = parser.parse_args()
    export = str(
        mid_export(args.side_python, args.cache) if args.mid else Path(args.export).resolve()
    )
    ours, theirs = free_port(), free_port()
    folder = Path(tempfile.mkdtemp(prefix="bench-sd-"))
    script = folder / "diffusers_server.py"
    script.write_text(DIFFUSERS_SERVER, encoding="utf-8")
    config = sordino_config(export, args.step_cache, args.max_skips, folder)
    side_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    log = (folder / "sordino.log").open("wb")
    servers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sordino",
                "start",
                "--config",
                str(config),
                "--no-builtin",
                "--data-dir",
                str(folder / "state"),
                "--http-port",
                str(ours),
                "--grpc-port",
                str(free_port()),
                *(["--mode", args.sordino_mode] if args.sordino_mode else []),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [args.side_python, str(script), export, str(theirs), str(args.diffusers_threads)],
            env=side_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]
    try:
        wait_up(
            f"http://127.0.0.1:{ours}/v2/health/ready", servers[0], True, folder / "sordino.log"
        )
        wait_up(f"http://127.0.0.1:{theirs}/", servers[1], False)
        diffusers = Target(
            "diffusers (ORT pipeline, one at a time)", f"http://127.0.0.1:{theirs}/", False
        )
        sordino = Target("sordino", f"http://127.0.0.1:{ours}/v2/models/sd/generate", True)
        targets = [diffusers, sordino]
        if args.step_cache is not None:
            targets.append(
                Target(
                    f"sordino, step cache {args.step_cache:g} / {args.max_skips}",
                    f"http://127.0.0.1:{ours}/v2/models/sd-cached/generate",
                    True,
                )
            )

        def body(n: int) -> dict[str, object]:
            seed = 1000 + n
            return {
                "prompt": "a red house at night",
                "steps": args.steps,
                "guidance": 7.5,
                "width": args.side,
                "height": args.side,
                "seed": seed,
                "latents": latents_for(seed, args.side).ravel().tolist(),
            }

        load_1 = os.getloadavg()[0]
        threads = args.diffusers_threads
        print(
            "diffusers' ONNX Runtime sessions: "
            + (f"{threads} intra-op threads, no spinning" if threads else "its defaults")
        )
        print(
            f"export {export}, {args.side}x{args.side} px, {args.steps} steps, guidance 7.5, "
            f"{args.rounds} x {args.seconds:.0f} s per row (servers in turn), load {load_1:.2f}"
        )
        header = (
            f"{'server':42} {'users':>5} {'images/s':>9} {'x diff.':>7} {'p50 ms':>8} "
            f"{'p99 ms':>8} {'max|d|':>7} {'mean|d|':>8} {'steps':>5}"
        )
        print(header)
        for users in args.users:
            rows = {t.name: Row() for t in targets}
            metrics = f"http://127.0.0.1:{ours}/metrics"
            calls_before = {t.name: len(t.calls) for t in targets}
            for target in targets:
                load(target, body, users, min(5.0, args.seconds))  # warm
            counted = batch_counts(metrics)
            for _ in range(args.rounds):
                for target in targets:
                    got = load(target, body, users, args.seconds)
                    row = rows[target.name]
                    row.images += got.images
                    row.seconds += got.seconds
                    row.latencies += got.latencies
            base = rows[diffusers.name].images / rows[diffusers.name].seconds
            for target in targets:
                row = rows[target.name]
                rate = row.images / row.seconds
                ms = np.percentile(np.array(row.latencies) * 1000, [50, 99])
                if target is diffusers:
                    most, mean, calls = "-", "-", "-"
                else:
                    top, avg, _ = difference(target, diffusers)
                    most, mean = f"{top:.4f}", f"{avg:.5f}"
                    calls = f"{np.mean(target.calls[calls_before[target.name] :]):.1f}"
                print(
                    f"{target.name:42} {users:>5} {rate:>9.2f} {rate / base:>6.2f}x "
                    f"{ms[0]:>8.0f} {ms[1]:>8.0f} {most:>7} {mean:>8} {calls:>5}",
                    flush=True,
                )
            print(
                f"  sordino batching at {users} users: {batching(counted, batch_counts(metrics))}"
            )
        for target in targets[1:]:
            top, avg, compared = difference(target, diffusers)
            print(
                f"{target.name}: {compared} requests compared with diffusers' image of the same "
                f"seed and latents: max |d| {top:.4f}, mean |d| {avg:.5f} (pixels in [0, 1])"
            )
        if len(targets) == 3:
            top, avg, compared = difference(targets[2], sordino)
            print(
                f"step cache vs sordino uncached: {compared} requests, max |d| {top:.4f}, "
                f"mean |d| {avg:.5f}"
            )
        print(f"load average now {os.getloadavg()[0]:.2f} (1 min)")
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(timeout=30)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
