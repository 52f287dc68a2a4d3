"""A three-node pipeline: tensors between nodes by reference, and what it costs per request.

    python -m bench.bench_pipeline [--requests 2000] [--rows 64]

Starts ``sordino start`` serving the built-in ``simple`` model and a pipeline of three
``simple`` nodes (a -> b -> c, each node's two outputs feeding the next node's two
inputs), then sends binary requests of ``--rows`` rows (two INT32 [rows, 16] inputs)
in closed loops of 1 client (the single-request path) and 16 clients (node batches
merge), each row of the table once against the pipeline and once against ``simple``
alone (one node's cost, for scale). After each run it reads ``/metrics``: the node
inputs handed over by reference, entered into the arena by the pipeline, or re-copied
by a node model's staging, per pipeline request, and the arena's peak bytes.

Run it against another checkout with ``PYTHONPATH=OTHER/src:.`` (the server is
started from ``PYTHONPATH``); its counters read ``n/a`` where that code has none.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
from pathlib import Path

import httpx
import numpy as np
import orjson
import yaml

from bench.common import Measurement, closed_loop, save, show, sordino_server, summarize

PIPELINE = {
    "name": "thrice",
    "nodes": [
        {"name": "a", "model": "simple"},
        {"name": "b", "model": "simple", "inputs": {"INPUT0": "a.OUTPUT0", "INPUT1": "a.OUTPUT1"}},
        {"name": "c", "model": "simple", "inputs": {"INPUT0": "b.OUTPUT0", "INPUT1": "b.OUTPUT1"}},
    ],
}  # fmt: skip


def _body(rows: int, seed: int) -> tuple[bytes, str]:
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(-1000, 1000, (rows, 16), dtype=np.int32) for _ in range(2)]
    header = orjson.dumps(
        {
            "inputs": [
                {"name": f"INPUT{i}", "shape": [rows, 16], "datatype": "INT32",
                 "parameters": {"binary_data_size": a.nbytes}}
                for i, a in enumerate(arrays)
            ],
            "parameters": {"binary_data_output": True},
        }
    )  # fmt: skip
    return b"".join([header, *(a.tobytes() for a in arrays)]), str(len(header))


def _counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found: dict[str, float] = {}
    for how in ("handed_over", "entered", "recopied"):
        pattern = rf'sordino_pipeline_node_inputs_total\{{how="{how}",pipeline="thrice"\}} (\S+)'
        if match := re.search(pattern, text):
            found[how] = float(match.group(1))
    if match := re.search(r"^sordino_shm_peak_bytes (\S+)", text, re.MULTILINE):
        found["arena_peak"] = float(match.group(1))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=64)
    args = parser.parse_args()
    payloads = []
    header_length = ""
    for seed in range(64):
        body, header_length = _body(args.rows, seed)
        payloads.append(body)
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": header_length,
    }
    rows: list[Measurement] = []
    counts: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "pipeline.yaml"
        config.write_text(yaml.safe_dump({"pipelines": [PIPELINE]}))
        with sordino_server(["--config", str(config)]) as server:
            for concurrency in (1, 16):
                for model in ("thrice", "simple"):
                    url = f"{server.http}/v2/models/{model}/infer"
                    warm = [payloads[i % 64] for i in range(100)]
                    asyncio.run(closed_loop(url, warm, concurrency, headers))
                    before = _counters(server.http)
                    sent = [payloads[i % 64] for i in range(args.requests)]
                    latencies, seconds = asyncio.run(closed_loop(url, sent, concurrency, headers))
                    after = _counters(server.http)
                    label = f"{model}, {concurrency} client{'s' if concurrency > 1 else ''}"
                    rows.append(summarize(label, concurrency, latencies, seconds))
                    if model == "thrice":
                        counts[label] = {
                            how: (after[how] - before.get(how, 0.0)) / args.requests
                            for how in ("handed_over", "entered", "recopied")
                            if how in after
                        }
                        counts[label]["arena_peak"] = after.get("arena_peak", float("nan"))
    show(f"three-node pipeline vs one node, {args.rows} rows, {args.requests} requests", rows)
    for label, figures in counts.items():
        per = ", ".join(
            f"{how} {figures[how]:.2f}" if how in figures else f"{how} n/a"
            for how in ("handed_over", "entered", "recopied")
        )
        print(f"{label}: per request {per}; arena peak {figures['arena_peak']:.0f} bytes")
    save("pipeline", {"rows": [vars(r) for r in rows], "copies": counts})


if __name__ == "__main__":
    main()
