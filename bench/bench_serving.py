"""Serving overhead: ``sordino start`` over HTTP versus ONNX Runtime called in-process.

Runs the built-in digits classifier both ways in one run on this machine:

- sordino, real ``sordino start`` process, KServe v2 JSON over HTTP, closed loop at
  concurrency 1 and 64 (aiohttp client in this process);
- ONNX Runtime in-process at batch 1 and at the mean batch size sordino formed
  under 64 clients (the work the server actually did).

Every sordino answer is checked against in-process ONNX Runtime.

    python bench/bench_serving.py            # writes bench/results/serving.json
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import time
from datetime import UTC, datetime
from importlib import resources

import numpy as np
import onnxruntime as ort
import orjson

from bench.common import (
    Measurement,
    batch_metrics,
    closed_loop,
    console,
    progress,
    save,
    show,
    sordino_server,
    summarize,
)  # fmt: skip

MODEL = "digits-classifier"


def direct(session: ort.InferenceSession, pixels: np.ndarray, batch: int, n: int) -> Measurement:
    """Time ``n`` rows through the session ``batch`` rows per call."""
    calls = max(1, n // batch)
    latencies = []
    start = time.perf_counter()
    for i in range(calls):
        rows = pixels[(i * batch) % (len(pixels) - batch + 1) :][:batch]
        t = time.perf_counter()
        session.run(None, {"pixels": rows})
        latencies.append(time.perf_counter() - t)
    seconds = time.perf_counter() - start
    m = summarize(f"onnxruntime in-process, batch {batch}", 1, latencies, seconds)
    # Report inferences (rows) per second, comparable with requests per second.
    return Measurement(m.label, 1, calls * batch, seconds, m.p50_ms, m.p99_ms, float(batch))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="requests at concurrency 64")
    parser.add_argument("--single", type=int, default=500, help="requests one at a time")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row; the median is kept")
    args = parser.parse_args()

    path = str(resources.files("sordino.models.builtin").joinpath(f"{MODEL}.onnx"))
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 17, size=(4096, 64)).astype(np.float32)
    expected = session.run(None, {"pixels": pixels})[0]
    payloads = [
        orjson.dumps(
            {
                "inputs": [
                    {
                        "name": "pixels",
                        "shape": [1, 64],
                        "datatype": "FP32",
                        "data": pixels[i % len(pixels)].tolist(),
                    }
                ]
            }
        )
        for i in range(max(args.requests, args.single))
    ]

    def check(i: int, body: bytes, header_length: str | None) -> None:
        got = np.asarray(orjson.loads(body)["outputs"][0]["data"], dtype=np.float32)
        if not np.allclose(got, expected[i % len(pixels)], rtol=1e-4, atol=1e-6):
            raise AssertionError(f"answer {i} differs from in-process onnxruntime")

    rows: list[Measurement] = []
    headers = {"Content-Type": "application/json"}
    with sordino_server(["--no-builtin", "--model", f"{MODEL}={path}"]) as ends, progress() as bar:
        url = ends.http
        infer = f"{url}/v2/models/{MODEL}/infer"
        warm = bar.add_task("warm-up", total=200)
        asyncio.run(
            closed_loop(infer, payloads[:200], 8, headers, on_done=lambda: bar.advance(warm))
        )
        for concurrency, n in ((1, args.single), (64, args.requests)):
            runs = []
            for attempt in range(args.repeat):
                task = bar.add_task(
                    f"sordino HTTP JSON, {concurrency} concurrent, run {attempt + 1}", total=n
                )
                before = batch_metrics(url, MODEL)
                latencies, seconds = asyncio.run(
                    closed_loop(
                        infer, payloads[:n], concurrency, headers, check,
                        lambda t=task: bar.advance(t),
                    )
                )  # fmt: skip
                after = batch_metrics(url, MODEL)
                mean_batch = (after[1] - before[1]) / max(after[0] - before[0], 1)
                runs.append(
                    summarize("sordino HTTP JSON", concurrency, latencies, seconds, mean_batch)
                )
            rows.append(sorted(runs, key=lambda m: m.rate)[len(runs) // 2])
    batch64 = max(1, round(rows[1].mean_batch or 1))
    rows.append(direct(session, pixels, 1, args.single * 4))
    rows.append(direct(session, pixels, batch64, args.requests * 4))
    show("Serving overhead: digits-classifier", rows, unit="req/s (rows/s)")
    report = {
        "benchmark": "serving",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": __import__("os").cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "onnxruntime": ort.__version__},
        "rows": [r.as_dict() for r in rows],
        "ratios": {
            "sordino_c1_p50_over_direct_b1_p50": rows[0].p50_ms / rows[2].p50_ms,
            "sordino_c64_rate_over_direct_same_batch": rows[1].rate / rows[3].rate,
        },
    }  # fmt: skip
    console.print(f"wrote {save('serving', report)}")


if __name__ == "__main__":
    main()
