"""System shared memory against binary HTTP (and gRPC) for a 4 MB input.

``sordino start`` serves two ONNX models built here, both taking one FP32 row of
1,048,576 values (4 MiB): ``sum4m`` answers its sum (4 bytes out), ``double4m`` the row
doubled (4 MiB out). One client (tritonclient, what users run) sends the same requests
one at a time four ways: binary HTTP, HTTP with the input (and output) in a registered
system shared-memory region, gRPC, gRPC with shared memory. For each: mean and p50/p99
latency, requests per second, and CPU milliseconds per request of the server (with its
workers) and of the client. The answers are checked.

    python -m bench.bench_shm [--requests 150]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto, helper
from rich.table import Table

from bench.common import console, save, sordino_server

WIDTH = 1 << 20  # FP32 values per row: 4 MiB
NBYTES = WIDTH * 4


def build_models(folder: Path) -> dict[str, Path]:
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", WIDTH])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graphs = {
        "sum4m": helper.make_graph(
            [helper.make_node("ReduceSum", ["X", "axes"], ["Y"], keepdims=1)],
            "sum4m", [x], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 1])],
            initializer=[axes],
        ),
        "double4m": helper.make_graph(
            [helper.make_node("Mul", ["X", "two"], ["Y"])],
            "double4m", [x], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", WIDTH])],
            initializer=[two],
        ),
    }  # fmt: skip
    paths = {}
    for name, graph in graphs.items():
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        paths[name] = folder / f"{name}.onnx"
        onnx.save(model, paths[name])
    return paths


def measure(call: Callable[[], None], requests: int) -> dict[str, float]:
    for _ in range(5):
        call()  # warm-up
    latencies = []
    started = time.perf_counter()
    for _ in range(requests):
        t0 = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - t0)
    seconds = time.perf_counter() - started
    ms = np.asarray(latencies) * 1000
    return {
        "mean_ms": float(ms.mean()),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "rate": requests / seconds,
    }


def run(requests: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    row = rng.random((1, WIDTH), dtype=np.float32)
    want_sum = float(row.sum(dtype=np.float64))
    results: dict[str, Any] = {}
    tag = os.getpid()
    with tempfile.TemporaryDirectory() as scratch:
        paths = build_models(Path(scratch))
        args = ["--no-builtin", *[f"--model={n}={p}" for n, p in paths.items()]]
        with sordino_server(args) as ends:
            http = httpclient.InferenceServerClient(ends.http.removeprefix("http://"))
            grpc = grpcclient.InferenceServerClient(
                ends.grpc, channel_args=[("grpc.max_receive_message_length", 64 << 20)]
            )
            region_in = shm.create_shared_memory_region("in", f"/bench_shm_in_{tag}", NBYTES)
            region_out = shm.create_shared_memory_region("out", f"/bench_shm_out_{tag}", NBYTES)
            try:
                shm.set_shared_memory_region(region_in, [row])
                # One registry serves both protocols: register once.
                http.register_system_shared_memory("in", f"/bench_shm_in_{tag}", NBYTES)
                http.register_system_shared_memory("out", f"/bench_shm_out_{tag}", NBYTES)
                for model in ("sum4m", "double4m"):
                    for label, client, mod, shared in (
                        ("binary HTTP", http, httpclient, False),
                        ("HTTP + shared memory", http, httpclient, True),
                        ("gRPC", grpc, grpcclient, False),
                        ("gRPC + shared memory", grpc, grpcclient, True),
                    ):
                        call = _call(client, mod, model, row, shared, region_out, want_sum)
                        cpu0 = ends.cpu_seconds()
                        figures = measure(call, requests)
                        cpu1 = ends.cpu_seconds()
                        count = requests + 5
                        figures["server_cpu_ms"] = (
                            (cpu1["server"] + cpu1["workers"] - cpu0["server"] - cpu0["workers"])
                            / count * 1000
                        )  # fmt: skip
                        figures["client_cpu_ms"] = (cpu1["client"] - cpu0["client"]) / count * 1000
                        results[f"{model} / {label}"] = figures
                        console.print(f"{model} / {label}: {figures['mean_ms']:.2f} ms mean")
                http.unregister_system_shared_memory()
            finally:
                shm.destroy_shared_memory_region(region_in)
                shm.destroy_shared_memory_region(region_out)
                http.close()
                grpc.close()
    return results


def _call(
    client: Any, mod: Any, model: str, row: np.ndarray, shared: bool, region_out: Any,
    want_sum: float,
) -> Callable[[], None]:  # fmt: skip
    tensor = mod.InferInput("X", [1, WIDTH], "FP32")
    out_bytes = 4 if model == "sum4m" else NBYTES
    if shared:
        tensor.set_shared_memory("in", NBYTES)
    elif mod is httpclient:
        tensor.set_data_from_numpy(row, binary_data=True)
    else:
        tensor.set_data_from_numpy(row)
    if mod is httpclient:
        output = mod.InferRequestedOutput("Y", binary_data=True)
    else:
        output = mod.InferRequestedOutput("Y")
    if shared:
        output.set_shared_memory("out", out_bytes)

    def call() -> None:
        result = client.infer(model, [tensor], outputs=[output])
        if shared:
            got = shm.get_contents_as_numpy(region_out, np.float32, [1, out_bytes // 4])
        else:
            got = result.as_numpy("Y")
        if model == "sum4m":
            assert abs(float(got[0, 0]) - want_sum) < 1e-3 * abs(want_sum), got
        else:
            assert got[0, 12345] == row[0, 12345] * 2

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=150, help="requests per row")
    args = parser.parse_args()
    results = run(args.requests)
    table = Table(title="4 MiB FP32 input, one client, requests one at a time")
    for column in ("model / transport", "mean ms", "p50 ms", "p99 ms", "req/s",
                   "server CPU ms/req", "client CPU ms/req"):  # fmt: skip
        table.add_column(column, justify="right" if column != "model / transport" else "left")
    for label, f in results.items():
        table.add_row(
            label, f"{f['mean_ms']:.2f}", f"{f['p50_ms']:.2f}", f"{f['p99_ms']:.2f}",
            f"{f['rate']:.0f}", f"{f['server_cpu_ms']:.2f}", f"{f['client_cpu_ms']:.2f}",
        )  # fmt: skip
    console.print(table)
    console.print(f"saved {save('shm', results)}")


if __name__ == "__main__":
    main()
