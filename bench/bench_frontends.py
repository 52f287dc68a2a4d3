"""One HTTP process against several on one port: ``sordino start --frontends 1`` and ``2``.

    python -m bench.bench_frontends                    # 5 s a cell, 3 repeats, 64 in flight
    python -m bench.bench_frontends --quick            # 2 s a cell, 1 repeat
    python -m bench.bench_frontends --frontends 1,2,3 --concurrency 8,64 --seconds 10
    python -m bench.bench_frontends --calls 1000       # the engine's calls, read vs forwarded
    python -m bench.bench_frontends --base /work/main  # also main's code, interleaved
    python -m bench.bench_frontends --transport grpc   # gRPC ModelInfer, 8 channels
    python -m bench.bench_frontends --workload w2      # W2 (CNN, 49 KB rows) instead of W1

Both servers are up at once, each ``sordino start`` with bench_triton's "sordino"
settings on W1 (max batch 32, 10 ms batching delay, 2 intra-op threads; ``--workload
w2``: W2, the CNN of bench_workloads, with the same settings) and its own ``--frontends``;
cells are interleaved (A, B, A, B …, the order rotated each repeat).
The load is bench_triton's lean generator (``bench/peer_load.py``: closed loops over
HTTP/1.1 keep-alive, KServe binary tensors, every answer checked against ONNX Runtime).
With ``--transport grpc`` it is gRPC ``ModelInfer`` instead (raw_input_contents,
serialized before the clock starts), the callers spread over ``--channels`` grpc.aio
channels, each its own HTTP/2 connection, so that the kernel can spread them over the
processes as it spreads HTTP connections.

Per cell: req/s, p50, p99, mean batch, and CPU ms per request of each component (psutil
over the server's process tree): **engine** (the ``sordino start`` process: with
``--frontends 1`` its own HTTP listener and decode too; with N > 1 it reads no
connection, so only the service, the scheduler and the link's engine side), **front**
(the N front-end processes: HTTP, decode, encode and the link's other side), **model**
(the worker processes), and the generator. Which process holds each of the generator's
connections is read from the kernel once the load runs ("forwarded": the front ends'
share; 100 % with N > 1 since the engine listens on neither port, about (N − 1) / N
with ``--base`` code older than that, whose engine still read 1/N itself).

``--calls N`` instead profiles the engine's event-loop thread (``cProfile``, as
``bench_request_path`` does) over N digits requests sent one at a time to an
in-process server with ``server.frontends: 1`` (the engine reads the request itself)
and N to one with ``server.frontends: 2`` (a front end decoded it): the engine's Python
calls a request, read by itself against forwarded over the link, and the functions that
differ most.

From those, a per-component CPU model (printed, and saved with the cells to
``bench/results/frontends.json``) says what 16 and 64 cores would give; its
assumptions are printed with it.
"""

from __future__ import annotations

import argparse
import cProfile
import statistics
import tempfile
import threading
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import psutil
from rich.console import Console

from bench import peer_load
from bench.bench_triton import (
    _runner,
    cpu_delta,
    mean_batch,
    percentile_ms,
    sordino_batches,
    tree_cpu,
)
from bench.common import cell_arguments, report_head, run_plan, save, sordino_server

console = Console(width=150)
ROWS = 256
_BASE = "base "  # the label prefix of the servers that run --base's code


def _bucket(process: psutil.Process, root: int) -> str:
    """The component a process of the server's tree belongs to."""
    if process.pid == root:
        return "engine"
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return "model"
    return "front" if "sordino.server.frontend_main" in command else "model"


def _split(root: int, port: int) -> dict[str, int]:
    """The generator's connections to ``port`` held by the engine and by the front ends."""
    held = {"engine": 0, "front": 0}
    server = psutil.Process(root)
    for process in [server, *server.children()]:
        bucket = _bucket(process, root)
        if bucket == "model":
            continue
        try:
            connections = process.net_connections(kind="tcp")
        except psutil.Error:
            continue
        held[bucket] += sum(
            1
            for c in connections
            if c.laddr and c.laddr.port == port and c.raddr and c.status == psutil.CONN_ESTABLISHED
        )
    return held


async def grpc_channels_loop(
    address: str, requests: list[bytes], concurrency: int, seconds: float, channels: int
) -> peer_load.Answers:
    """``concurrency`` callers of ``ModelInfer`` for ``seconds``, spread over ``channels``
    channels (each its own connection: a local subchannel pool)."""
    import grpc

    opened = [
        grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(max(1, min(channels, concurrency)))
    ]
    try:
        calls = [c.unary_unary("/inference.GRPCInferenceService/ModelInfer") for c in opened]
        return await peer_load.grpc_callers(calls, requests, concurrency, seconds)
    finally:
        for channel in opened:
            await channel.close()


def run_cell(
    label: str,
    ends: tuple[str, str, int],
    concurrency: int,
    seconds: float,
    inputs: np.ndarray,
    expected: np.ndarray,
    warmup: float,
    transport: str = "http",
    channels: int = 8,
    model: tuple[str, str] = ("w1", "x"),
) -> dict[str, Any]:
    """One closed loop against one server (``ends``: its HTTP URL, gRPC address and
    pid; ``model``: the model's and its input's names); the split of its connections
    read midway."""
    http, address, pid = ends
    host = urlparse(http).netloc
    name, input_name = model
    if transport == "grpc":
        port = int(address.rsplit(":", 1)[1])
        requests = [peer_load.kserve_grpc_request(name, input_name, r, [1, *r.shape])
                    for r in inputs]  # fmt: skip
        decode = peer_load.kserve_grpc_output
    else:
        port = int(host.rsplit(":", 1)[1])
        requests = [peer_load.kserve_http_request(host, name, input_name, r, [1, *r.shape])
                    for r in inputs]  # fmt: skip
        decode = peer_load.kserve_http_output

    def load(length: float) -> peer_load.Answers:
        with _runner() as runner:
            if transport == "grpc":
                return runner.run(
                    grpc_channels_loop(address, requests, concurrency, length, channels)
                )
            return runner.run(peer_load.http_closed_loop(http, requests, concurrency, length))

    if warmup > 0:
        load(warmup)
    split: dict[str, int] = {}

    def sample() -> None:
        time.sleep(min(1.0, seconds / 3))
        split.update(_split(pid, port))

    sampler = threading.Thread(target=sample, daemon=True)
    batches_before, cpu_before = sordino_batches(http, name), tree_cpu(pid, _bucket)
    client_before = psutil.Process().cpu_times()
    sampler.start()
    answers = load(seconds)
    client_after = psutil.Process().cpu_times()
    cpu_after, batches_after = tree_cpu(pid, _bucket), sordino_batches(http, name)
    sampler.join()
    failed, worst, first_error = peer_load.check(answers, expected, decode)
    n = max(len(answers.latencies), 1)
    client = (client_after.user + client_after.system) - (client_before.user + client_before.system)
    return {
        "server": label, "concurrency": concurrency, "requests": len(answers.latencies),
        "seconds": answers.seconds,
        "rate": len(answers.latencies) / answers.seconds if answers.seconds else 0.0,
        "p50_ms": percentile_ms(answers.latencies, 50),
        "p99_ms": percentile_ms(answers.latencies, 99),
        "mean_batch": mean_batch(batches_before, batches_after),
        "cpu_ms": {k: v * 1000 / n for k, v in cpu_delta(cpu_before, cpu_after).items()},
        "client_cpu_ms": client * 1000 / n,
        "connections": split,
        "failed": failed, "max_abs_diff": worst, "first_error": first_error,
    }  # fmt: skip


def aggregate(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The median of each figure over the repeats of a (server, in flight)."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for cell in cells:
        groups.setdefault((cell["server"], cell["concurrency"]), []).append(cell)
    rows = []
    for (label, concurrency), group in groups.items():

        def med(key: str, group: list[dict[str, Any]] = group) -> float:
            return statistics.median(c[key] for c in group)

        buckets = {k for c in group for k in c["cpu_ms"]}
        forwarded = [c["connections"].get("front", 0) / max(sum(c["connections"].values()), 1)
                     for c in group]  # fmt: skip
        rows.append({
            "server": label, "concurrency": concurrency, "rate": med("rate"),
            "p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"),
            "mean_batch": statistics.median(c["mean_batch"] or 0.0 for c in group),
            "cpu_ms": {k: statistics.median(c["cpu_ms"].get(k, 0.0) for c in group)
                       for k in sorted(buckets)},
            "client_cpu_ms": med("client_cpu_ms"),
            "forwarded_share": statistics.median(forwarded),
            "failed": sum(c["failed"] for c in group), "repeats": len(group),
        })  # fmt: skip
    return rows


def cpu_model(
    rows: list[dict[str, Any]], concurrency: int, prefix: str = ""
) -> dict[str, Any] | None:
    """What 16 and 64 cores would give, from the per-request CPU of each component.

    ``e1``: engine CPU of a request it reads itself (the 1-front-end row); ``e_fwd``: of
    a request that crossed the link, from the N-front-end row's engine CPU and its share
    of forwarded connections (all of them since the engine reads none: then e_fwd is
    measured, not solved); ``f``: the front ends' CPU per request they forward; ``w``:
    the workers' per request. Each process is one core at most. The arrangement is read
    from that share: where every connection was a front end's (this code), N > 1 means
    N front ends beside the engine, the engine's core taking e_fwd a request and the
    workers the cores left after N + 1; where the engine held some (``--base`` code
    before the engine stopped listening), the engine is the first of the N and reads
    1/N of the connections at e1.
    """
    ours = [r for r in rows if r["server"].startswith(prefix) and r["concurrency"] == concurrency
            and not (not prefix and r["server"].startswith(_BASE))]  # fmt: skip
    one = next((r for r in ours if r["server"] == f"{prefix}1 front end"), None)
    many = [r for r in ours if r["server"] != f"{prefix}1 front end"]
    if one is None or not many:
        return None
    many.sort(key=lambda r: r["forwarded_share"])
    other = many[-1]
    share = other["forwarded_share"]
    if share <= 0.0:
        return None
    apart = share >= 0.99  # the engine read no connection: it holds the ports only
    e1 = one["cpu_ms"]["engine"]
    w = statistics.mean([one["cpu_ms"].get("model", 0.0), other["cpu_ms"].get("model", 0.0)])
    e_fwd = max((other["cpu_ms"]["engine"] - (1 - share) * e1) / share, 1e-6)
    f = other["cpu_ms"].get("front", 0.0) / share
    if apart:  # every N > 1 row measures e_fwd and f directly: their mean
        direct = [r for r in many if r["forwarded_share"] >= 0.99]
        e_fwd = max(statistics.mean(r["cpu_ms"]["engine"] for r in direct), 1e-6)
        f = statistics.mean(r["cpu_ms"].get("front", 0.0) for r in direct)

    def rate_at(n: int, cores: int) -> float:
        """req/s with ``n`` processes reading connections on ``cores`` cores."""
        if n == 1:  # one process: it reads, decodes and runs the engine
            engine, left = 1000.0 / e1, cores - 1
        elif apart:  # n front ends beside the engine's core, every request through them
            engine, left = 1000.0 / e_fwd, cores - 1 - n
        else:  # the engine is the first of n and reads 1/n itself; n - 1 take the rest
            engine, left = 1000.0 / ((e1 + (n - 1) * e_fwd) / n), cores - n
        # Either way the front ends' cores carry f a request they forward: at most n·1000/f.
        fronts = 1000.0 * n / f if n > 1 and f > 0 else float("inf")
        workers = 1000.0 * left / w if w > 0 else float("inf")
        return max(min(engine, fronts, workers), 0.0)

    def best(cores: int) -> tuple[int, float]:
        """(front ends, req/s) at the best N for ``cores``."""
        options = [(rate_at(n, cores), n) for n in range(1, cores)]
        top = max(rate for rate, _ in options)
        # The fewest front ends within 2 % of the best: past that, a process buys nothing.
        rate, n = min(((r, n) for r, n in options if r >= 0.98 * top), key=lambda o: o[1])
        return n, rate

    return {
        "code": prefix.strip() or "this checkout",
        "concurrency": concurrency,
        "e1_ms": e1, "e_fwd_ms": e_fwd, "front_ms": f, "worker_ms": w,
        "forwarded_share": share,
        "cores": {str(c): dict(zip(("frontends", "rate"), best(c), strict=True))
                  for c in (2, 4, 8, 16, 64)},
        "ceiling_rate": 1000.0 / e_fwd,
        "engine_reads": not apart,
        "assumptions": [
            "per-request CPU of each component stays as measured here (W1, this batch size)",
            (
                "with N > 1 the engine reads no connection: every request reaches it "
                "decoded (e_fwd); N = 1 is one process at e1"
                if apart
                else "the kernel spreads connections evenly, so the engine reads 1/N of "
                "them itself (at e1)"
            ),
            "the engine's loop is one core; each front end is one core; workers scale to "
            + ("the cores left (cores - N - 1; cores - 1 at N = 1)" if apart
               else "the cores left (cores - N)")
            + ", the generator runs elsewhere",
            "no cost from cross-core traffic, memory bandwidth or the arena",
        ],
    }  # fmt: skip


def show(rows: list[dict[str, Any]], models: list[dict[str, Any] | None]) -> None:
    console.print("server             in flight   req/s    p50 ms  p99 ms  batch  "
                  "engine  front  model  client  (CPU ms/req)  forwarded")  # fmt: skip
    for r in sorted(rows, key=lambda r: (r["concurrency"], r["server"])):
        cpu = r["cpu_ms"]
        console.print(
            f"{r['server']:<18} {r['concurrency']:>9} {r['rate']:>8,.0f} {r['p50_ms']:>8.2f} "
            f"{r['p99_ms']:>7.2f} {r['mean_batch']:>6.1f} {cpu.get('engine', 0):>7.3f} "
            f"{cpu.get('front', 0):>6.3f} {cpu.get('model', 0):>6.3f} "
            f"{r['client_cpu_ms']:>7.3f}                {r['forwarded_share']:>5.0%}"
            + (f"  {r['failed']} FAILED" if r["failed"] else ""),
            markup=False, highlight=False,
        )  # fmt: skip
    for model in models:
        if model is None:
            continue
        console.print(
            f"CPU model of {model['code']} (c{model['concurrency']}): "
            f"e1 {model['e1_ms']:.3f} ms, engine per "
            f"forwarded request {model['e_fwd_ms']:.3f} ms, front end {model['front_ms']:.3f} "
            f"ms, workers {model['worker_ms']:.3f} ms",
            markup=False, highlight=False,
        )  # fmt: skip
        for cores, best in model["cores"].items():
            console.print(f"  {cores:>3} cores: {best['frontends']} front end(s) (the fewest "
                          f"within 2 % of the best), {best['rate']:,.0f} req/s",
                          markup=False, highlight=False)  # fmt: skip
        console.print(
            f"  ceiling (the engine's core, every request read elsewhere): "
            f"{model['ceiling_rate']:,.0f} req/s",
            markup=False,
            highlight=False,
        )
        for line in model["assumptions"]:
            console.print(f"  assumes: {line}", markup=False, highlight=False)


def engine_calls(requests: int, top: int) -> dict[str, Any]:
    """The engine's calls a request: read by its own listener, and forwarded by a front end."""
    import http.client

    from bench.bench_request_path import _json_body, _on_loop, _rows, _tally
    from sordino.config import RuntimeConfig
    from sordino.models.repository import builtin_sources
    from sordino.testing import serve_in_thread

    digits = [s for s in builtin_sources() if s.name == "digits-classifier"]
    bodies = [_json_body(row) for row in _rows(requests)]
    results: dict[str, Any] = {}
    # One process reads its own connections; with front ends the engine reads none.
    for label, count in (("read by the engine", 1), ("forwarded", 2)):
        config = RuntimeConfig.model_validate(
            {"server": {"frontends": count, "shed_loop_lag": 0.01}}
        )
        with serve_in_thread(config, digits) as server:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)

            def one(body: bytes, conn: http.client.HTTPConnection = conn) -> None:
                conn.request("POST", "/v2/models/digits-classifier/infer", body,
                             {"Content-Type": "application/json"})  # fmt: skip
                response = conn.getresponse()
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}: {response.read()[:200]!r}")
                response.read()

            for body in bodies[:50]:  # warm
                one(body)
            profile = cProfile.Profile()
            _on_loop(server.loop, profile.enable)
            for body in bodies:
                one(body)
            _on_loop(server.loop, profile.disable)
            conn.close()
            results[label] = _tally(profile, requests)
    direct, forwarded = results["read by the engine"], results["forwarded"]
    console.print(f"engine's calls a request: read by itself {direct['all_calls']:.0f} "
                  f"({direct['calls']:.0f} in sordino and the server libraries), forwarded "
                  f"{forwarded['all_calls']:.0f} ({forwarded['calls']:.0f})",
                  markup=False, highlight=False)  # fmt: skip
    names = set(direct["functions"]) | set(forwarded["functions"])
    change = sorted(
        ((forwarded["functions"].get(n, 0.0) - direct["functions"].get(n, 0.0), n) for n in names),
        key=lambda d: abs(d[0]), reverse=True,
    )  # fmt: skip
    for delta, name in change[:top]:
        console.print(f"  {delta:+6.2f}  {name}", markup=False, highlight=False)
    for part in results.values():
        part.pop("functions")
    results["largest_changes"] = [{"function": n, "calls": d} for d, n in change[:top]]
    return results


def run(args: argparse.Namespace) -> dict[str, Any]:
    import onnxruntime as ort

    from bench.bench_workloads import server_config, workload

    w = workload(args.workload, None, None)
    inputs = np.random.default_rng(0).random((ROWS, *w.item_shape), dtype=np.float32)
    session = ort.InferenceSession(str(w.model_file), providers=["CPUExecutionProvider"])
    expected = np.stack([session.run(None, {w.input_name: row[None]})[0][0] for row in inputs])
    counts = [int(n) for n in args.frontends.split(",")]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    servers: dict[str, tuple[str, str, int]] = {}
    cells: list[dict[str, Any]] = []
    with ExitStack() as stack, tempfile.TemporaryDirectory() as scratch:
        # One batching policy for either workload: W2's auto mode would pick its batch
        # cap from a curve measured at start, which differs from server to server.
        config = server_config(w, Path(scratch), 2, "adaptive", 100.0)
        codes: list[tuple[str, dict[str, str] | None]] = [("", None)]
        if args.base:
            codes.append((_BASE, {"PYTHONPATH": str(Path(args.base).resolve() / "src")}))
        for prefix, env in codes:
            for n in counts:
                label = f"{prefix}{n} front end" + ("s" if n > 1 else "")
                s = stack.enter_context(sordino_server(
                    ["--no-builtin", "--config", str(config), "--frontends", str(n)], env=env
                ))  # fmt: skip
                servers[label] = (s.http, s.grpc, s.pid)
        labels = list(servers)
        plan = [(r, c, labels[(i + r) % len(labels)])
                for r in range(args.repeat) for c in concurrencies
                for i in range(len(labels))]  # fmt: skip
        cells = run_plan(
            plan,
            lambda step: run_cell(step[2], servers[step[2]], step[1], args.seconds, inputs,
                                  expected, args.warmup, args.transport, args.channels,
                                  (w.name, w.input_name)),
            lambda step, cell: (
                f"{step[2]} c{step[1]}: {cell['rate']:,.0f} req/s, p99 {cell['p99_ms']:.1f} ms, "
                f"connections {cell['connections']}"
            ),
            console,
        )  # fmt: skip
    rows = aggregate(cells)
    model = cpu_model(rows, max(concurrencies))
    base = cpu_model(rows, max(concurrencies), _BASE) if args.base else None
    show(rows, [model, base])
    report = {
        **report_head("frontends"),
        "settings": {"workload": args.workload,
                     "seconds": args.seconds, "repeat": args.repeat, "warmup": args.warmup,
                     "transport": args.transport, "channels": args.channels,
                     "frontends": counts, "concurrency": concurrencies},
        "base": args.base, "rows": rows, "model": model, "base_model": base, "cells": cells,
    }  # fmt: skip
    console.print(f"wrote {save(args.name, report)}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cell_arguments(parser, seconds=5.0, repeat=3)
    parser.add_argument("--frontends", default="1,2", help="the --frontends of each server")
    parser.add_argument("--concurrency", default="64", help="requests in flight")
    parser.add_argument("--workload", choices=("w1", "w2"), default="w1",
                        help="W1 (MLP, 1 KB rows) or W2 (CNN, 49 KB rows)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="2 s a cell, one repeat")
    parser.add_argument("--transport", choices=("http", "grpc"), default="http",
                        help="the generator's protocol")  # fmt: skip
    parser.add_argument("--channels", type=int, default=8,
                        help="with --transport grpc: channels the callers share")  # fmt: skip
    parser.add_argument("--calls", type=int, default=0,
                        help="instead: profile the engine, N requests each way")  # fmt: skip
    parser.add_argument("--top", type=int, default=15, help="with --calls: functions shown")
    parser.add_argument(
        "--base",
        default=None,
        help="a checkout whose src/ the same servers also run (labelled "
        "'base'), interleaved with this one's: before/after side by side",
    )
    parser.add_argument("--name", default="frontends", help="results file bench/results/NAME.json")
    args = parser.parse_args()
    if args.calls:
        report = {"benchmark": "frontends_calls",
                  "date": datetime.now(UTC).isoformat(timespec="seconds"),
                  "requests": args.calls, **engine_calls(args.calls, args.top)}  # fmt: skip
        console.print(f"wrote {save(args.name + '_calls', report)}")
        return
    if args.quick:
        args.seconds, args.repeat, args.warmup = 2.0, 1, 0.3
    if "1" not in args.frontends.split(","):
        parser.error("--frontends must include 1 (the baseline the CPU model starts from)")
    run(args)


if __name__ == "__main__":
    main()
