"""What one inference request costs the server's front end: calls, files, CPU (issue 30).

    python -m bench.bench_request_path                     # both parts, about 40 s
    python -m bench.bench_request_path --calls-only        # the call count alone, ~10 s
    python -m bench.bench_request_path --seconds 5 --requests 500
    python -m bench.bench_request_path --calls-only --tenants  # with an API key (auth.required)

Two parts, on the built-in digits classifier (an MLP: a request is almost all front end):

- **calls** — a real server in this process (``sordino.testing.serve_in_thread``, the
  event-loop lag rule on as ``sordino start`` has it), ``--requests`` unary requests
  one at a time over loopback from this process's main thread (HTTP/1.1 keep-alive
  JSON, then gRPC ``ModelInfer``), with ``cProfile`` enabled on the server's event-loop
  thread only. Per request: the Python function calls made in sordino and in the server
  libraries (uvicorn, starlette, grpc, anyio), the distinct files they ran in, the calls
  that cross from one such file to another, and every call the profile saw (stdlib and
  C functions included). The worker process (the model) is not counted. The files are
  counted twice: every file a call ran in while profiling (the server's timers too), and
  those with a call every request (half a call a request or more). Also per request,
  the reviewer's figures of issue 30 (``LOOKUPS``): how often the model was looked up,
  the deadline resolved and an API key hashed. With ``--tenants`` the server has a tenant
  and ``auth.required``, and every request carries the tenant's key.
- **cpu** — ``sordino start`` in its own process, the lean closed-loop generator of
  ``bench_triton`` (``bench/peer_load.py``: prebuilt request bytes, nothing parsed while
  the clock runs) in this one; for HTTP JSON and gRPC at 1 and 64 in flight, the server
  process's own CPU time (its workers apart) over the requests served, per request.
  CPU per request holds up on a shared machine where a rate would not: read the rate
  column only as a check that the loop ran. Each cell also gives the mean rows a batch
  (the server's ``sordino_batch_size`` histogram over the cell).

Results go to ``bench/results/request_path.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import http.client
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import psutil

from bench.common import console, save, sordino_server

MODEL = "digits-classifier"
SERVER_LIBS = ("/sordino/", "/uvicorn/", "/starlette/", "/grpc/", "/anyio/")
"""Path parts of the files whose calls count as the server's own."""


LOOKUPS = {
    "model lookups (registry.get / route)": ("server/registry.py:get", "server/registry.py:route"),
    "deadline resolved (choose_timeout)": ("admission/chain.py:choose_timeout",),
    "API key hashed (hash_key)": ("config/tenants.py:hash_key",),
}
"""The reviewer's per-request figures: the functions whose calls each one counts."""
TENANT_KEY = "bench-key-0123456789"


def _json_body(row: np.ndarray) -> bytes:
    return orjson.dumps(
        {"inputs": [{"name": "pixels", "shape": [1, row.size], "datatype": "FP32",
                     "data": row.tolist()}]}
    )  # fmt: skip


def _grpc_message(row: np.ndarray) -> bytes:
    from sordino.protocol.pb import kserve_v2_pb2 as pb

    request = pb.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "pixels", "FP32"
    tensor.shape.extend([1, row.size])
    request.raw_input_contents.append(np.ascontiguousarray(row, dtype=np.float32).tobytes())
    return bytes(request.SerializeToString())


def _rows(count: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 17, size=(count, 64)).astype(np.float32)


def _counted(filename: str) -> bool:
    return any(part in filename for part in SERVER_LIBS)


def _short(filename: str) -> str:
    return filename.split("/site-packages/")[-1].split("/src/")[-1]


def _tally(profile: cProfile.Profile, requests: int, top: int = 0) -> dict[str, Any]:
    """Per request: calls in the server's files, those files, the crossings between them.

    With ``top``, print the ``top`` functions of the server's files by calls."""
    import pstats

    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    if top:
        ranked = sorted(
            ((nc, key) for key, (_cc, nc, *_rest) in stats.items() if _counted(key[0])),
            reverse=True,
        )
        for nc, (filename, line, name) in ranked[:top]:
            console.print(f"    {nc / requests:6.2f}  {_short(filename)}:{line} {name}")
    own = total = moves = 0
    files: set[str] = set()
    for (filename, _line, _name), (_cc, nc, _tt, _ct, callers) in stats.items():
        total += nc
        if not _counted(filename):
            continue
        own += nc
        files.add(filename)
        for (caller_file, _l, _n), entry in callers.items():
            if caller_file != filename and _counted(caller_file):
                moves += entry[0] if isinstance(entry, tuple) else entry
    functions = {
        f"{_short(filename)}:{name}": nc / requests
        for (filename, _line, name), (_cc, nc, *_rest) in stats.items()
        if _counted(filename)
    }
    lookups = {
        label: sum(
            nc / requests
            for (filename, _line, name), (_cc, nc, *_rest) in stats.items()
            if f"{_short(filename)}:{name}" in {f"sordino/{n}" for n in names}
        )
        for label, names in LOOKUPS.items()
    }
    by_file: dict[str, float] = {}
    for (filename, _line, _name), (_cc, nc, *_rest) in stats.items():
        if _counted(filename):
            by_file[filename] = by_file.get(filename, 0.0) + nc / requests
    return {
        "functions": functions,
        "lookups": lookups,
        "calls": own / requests,
        "files": len(files),
        "files_each_request": sum(1 for calls in by_file.values() if calls >= 0.5),
        "file_moves": moves / requests,
        "all_calls": total / requests,
    }


def _on_loop(loop: asyncio.AbstractEventLoop, action: Any) -> None:
    """Run ``action`` on the server's loop thread and wait for it."""
    done = threading.Event()

    def run() -> None:
        action()
        done.set()

    loop.call_soon_threadsafe(run)
    done.wait(10)


def calls(requests: int, top: int = 0, tenants: bool = False) -> dict[str, dict[str, Any]]:
    """Profile ``requests`` unary requests per transport on an in-process server.

    With ``tenants``, the server has one tenant and ``auth.required``; requests carry its key."""
    import grpc

    from sordino.config import load_config
    from sordino.config.tenants import hash_key
    from sordino.testing import serve_in_thread

    rows = _rows(requests)
    settings: dict[str, Any] = {"server": {"shed_loop_lag": 0.01}}  # as sordino start has it
    headers = {"Content-Type": "application/json"}
    metadata: tuple[tuple[str, str], ...] = ()
    if tenants:
        settings["tenants"] = [{"name": "acme", "keys": [hash_key(TENANT_KEY)]}]
        settings["auth"] = {"required": True}
        headers["Authorization"] = f"Bearer {TENANT_KEY}"
        metadata = (("authorization", f"Bearer {TENANT_KEY}"),)
    config = load_config(None, settings)
    results: dict[str, dict[str, Any]] = {}
    with serve_in_thread(config) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port)
        path = f"/v2/models/{MODEL}/infer"

        def http_one(row: np.ndarray) -> None:
            conn.request("POST", path, _json_body(row), headers)
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")

        channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        messages = [_grpc_message(row) for row in rows]

        def grpc_one(index: int) -> None:
            infer(messages[index], metadata=metadata)

        for label, one in (
            ("http_json", lambda i: http_one(rows[i])),
            ("grpc", grpc_one),
        ):
            for i in range(50):  # warm: first-call imports, caches, the batch curve
                one(i % requests)
            profile = cProfile.Profile()
            _on_loop(server.loop, profile.enable)
            for i in range(requests):
                one(i)
            _on_loop(server.loop, profile.disable)
            if top:
                console.print(f"  {label}: the {top} most called, per request")
            results[label] = _tally(profile, requests, top)
        channel.close()
        conn.close()
    return results


def _batches(http: str) -> tuple[float, float]:
    """The server's ``sordino_batch_size`` histogram: (rows, batches) so far, all models."""
    import urllib.request

    with urllib.request.urlopen(f"{http}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    rows = batches = 0.0
    for line in text.splitlines():
        if line.startswith("sordino_batch_size_sum"):
            rows += float(line.rsplit(" ", 1)[1])
        elif line.startswith("sordino_batch_size_count"):
            batches += float(line.rsplit(" ", 1)[1])
    return rows, batches


def _server_cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def cpu(seconds: float) -> list[dict[str, Any]]:
    """CPU of the front-end process per request, HTTP JSON and gRPC, at 1 and 64 in flight."""
    from bench import peer_load

    rows = _rows(256)
    cells: list[dict[str, Any]] = []
    with sordino_server([]) as server:
        host = server.http.split("//", 1)[1]
        json_requests = []
        for row in rows:
            body = _json_body(row)
            head = (
                f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: {host}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            json_requests.append(head.encode() + body)
        grpc_requests = [_grpc_message(row) for row in rows]
        load_once = asyncio.run(peer_load.http_closed_loop(server.http, json_requests, 1, 0.5))
        assert load_once.statuses and load_once.statuses[0] == 200, load_once.bodies[:1]
        # The server's own ticking (telemetry, the loop-lag timer) runs whether or not
        # requests come; measured idle and taken off, so c1's few requests do not carry it.
        before, started = _server_cpu(server.pid), time.perf_counter()
        time.sleep(seconds)
        idle = (_server_cpu(server.pid) - before) / (time.perf_counter() - started)
        for transport in ("http_json", "grpc"):
            for concurrency in (1, 64):

                def load(
                    length: float, transport: str = transport, concurrency: int = concurrency
                ) -> peer_load.Answers:
                    if transport == "grpc":
                        return asyncio.run(
                            peer_load.grpc_closed_loop(
                                server.grpc, grpc_requests, concurrency, length
                            )
                        )
                    return asyncio.run(
                        peer_load.http_closed_loop(server.http, json_requests, concurrency, length)
                    )

                load(1.0)  # warm
                rows_before, batches_before = _batches(server.http)
                before, started = _server_cpu(server.pid), time.perf_counter()
                answers = load(seconds)
                elapsed = time.perf_counter() - started
                used = _server_cpu(server.pid) - before - idle * elapsed
                rows_after, batches_after = _batches(server.http)
                batches = max(batches_after - batches_before, 1)
                served = len(answers.latencies)
                failed = sum(1 for status in answers.statuses if status != 200)
                cells.append({
                    "transport": transport, "concurrency": concurrency, "requests": served,
                    "failed": failed, "rate": served / answers.seconds,
                    "front_cpu_ms": used * 1000 / max(served, 1),
                    "mean_batch": (rows_after - rows_before) / batches,
                })  # fmt: skip
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="profiled requests each")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of a CPU cell")
    parser.add_argument("--calls-only", action="store_true")
    parser.add_argument("--cpu-only", action="store_true")
    parser.add_argument("--top", type=int, default=0, help="list the N most called")
    parser.add_argument("--label", default="", help="a name for this run in the JSON")
    parser.add_argument(
        "--tenants", action="store_true", help="a tenant, auth.required, requests with its key"
    )
    args = parser.parse_args()
    payload: dict[str, Any] = {"label": args.label, "at": time.strftime("%Y-%m-%d %H:%M:%S")}
    if not args.cpu_only:
        payload["calls"] = calls(args.requests, args.top, args.tenants)
        payload["tenants"] = args.tenants
        console.print("[bold]Per unary request (server event-loop thread)[/]")
        for label, row in payload["calls"].items():
            console.print(
                f"  {label:10} {row['calls']:7.1f} calls in {row['files']:3d} files "
                f"({row['files_each_request']} of them every request), "
                f"{row['file_moves']:6.1f} file-to-file calls; {row['all_calls']:7.1f} calls "
                "with stdlib and C"
            )
            for name, count in row["lookups"].items():
                console.print(f"  {'':10} {name}: {count:.2f}")
    if not args.calls_only:
        payload["cpu"] = cpu(args.seconds)
        console.print("[bold]Front-end process CPU per request (sordino start, lean client)[/]")
        for cell in payload["cpu"]:
            console.print(
                f"  {cell['transport']:10} c{cell['concurrency']:<3} "
                f"{cell['front_cpu_ms']:.3f} ms CPU/request, {cell['mean_batch']:.1f} rows a "
                f"batch  ({cell['requests']} requests, "
                f"{cell['failed']} failed, {cell['rate']:.0f} req/s on a shared machine)"
            )
    path = save("request_path", payload)
    console.print(f"saved {path}")
    Path(path).write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
