"""Side by side with NVIDIA Triton itself and Mosec, on the W1 MLP (issue 16).

    python -m bench.bench_triton                 # 5 s a cell, 2 repeats (about 8 minutes)
    python -m bench.bench_triton --quick         # 2 s a cell, 1 repeat (about 2 minutes)
    python -m bench.bench_triton --seconds 10 --repeat 3

Servers, all up at once, each on free loopback ports:

- **sordino** — ``sordino start`` with the peers' settings (max batch 32, 10 ms batching
  delay, 2 intra-op threads; bench_workloads' configuration);
- **sordino defaults** — ``sordino start --model w1=mlp.onnx`` (what users run);
- **triton 10ms / triton 0ms** — the ``tritonserver`` binary of the ``nvidia-pytriton``
  0.7.0 wheel serving W1 through its **Python backend** (a ``model.py`` running ONNX
  Runtime with 2 threads, max batch 32, preferred 32, 10 ms or 0 ms queue delay; one
  server, two models; its session spins as ONNX Runtime's default has it, or not with
  ``--session-spinning off``);
- **mosec** — a Mosec server, one worker running the same session (max batch 32, 10 ms).

The peers are installed on first use into side environments under ``bench/.peers/``
(git-ignored); an install or start that fails ends the run with one line and exit
status 2. One load generator (``bench/peer_load.py``) drives them all: closed loops at
1, 8 and 64 in flight over HTTP/1.1 (KServe binary tensors; raw bytes for Mosec) and gRPC,
cells interleaved server by server (A, B, A, B …), every answer checked against ONNX
Runtime in-process (max abs difference reported). Per cell: req/s, p50, p99, mean batch
(sordino: its batch histogram; Triton: ``nv_inference_count / nv_inference_exec_count``;
Mosec: n/a), CPU ms per request of each server's front end and model process(es) (psutil
over the process tree) and of the generator itself. Medians over the repeats are
printed with the issue's targets, and everything is saved to ``bench/results/triton.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlparse

import numpy as np
import psutil
from rich.console import Console

from bench import peer_load, peers
from bench.common import cell_arguments, report_head, run_plan, save, sordino_server

console = Console(width=150)
CONCURRENCIES = (1, 8, 64)
ROWS = 256  # distinct inputs, sent round robin
SORDINO, DEFAULTS, TRITON, TRITON_0, MOSEC = (
    "sordino", "sordino defaults", "triton 10ms", "triton 0ms", "mosec",
)  # fmt: skip
SORDINO_PY = "sordino python"
"""sordino serving Triton's repository itself: the same ``model.py`` (backend: python),
the same ``config.pbtxt`` (issue 29); only on request (``--servers``)."""
SORDINO_FE = "sordino 2fe"
""""sordino" with ``--frontends 2``: two front-end processes read the connections and
the engine none (issue 30); only on request (``--servers``)."""


@dataclass(frozen=True)
class Target:
    """One server under load: how to reach it, build its requests and read its counters."""

    label: str
    http: str
    grpc: str | None
    model: str
    pid: int
    front: Callable[[psutil.Process, int], str]  # a process of the tree -> its bucket
    batches: Callable[[], tuple[float, float] | None]  # (executions, rows) so far


def _root_is_front(process: psutil.Process, root: int) -> str:
    return "front" if process.pid == root else "model"


def _frontends_are_front(process: psutil.Process, root: int) -> str:
    # The engine process and its front-end processes serve; the workers are the model.
    if process.pid == root:
        return "front"
    try:
        return "front" if "sordino.server.frontend_main" in process.cmdline() else "model"
    except psutil.Error:
        return "model"


def _mosec_parts(process: psutil.Process, root: int) -> str:
    # Mosec's Python launcher starts the Rust front end ("mosec") and the workers.
    if process.pid == root:
        return "other"
    try:
        return "front" if process.name() == "mosec" else "model"
    except psutil.Error:
        return "model"


def tree_cpu(
    pid: int, bucket: Callable[[psutil.Process, int], str]
) -> dict[int, tuple[str, float]]:
    """CPU seconds so far of every live process in ``pid``'s tree, with its bucket."""
    root = psutil.Process(pid)
    found: dict[int, tuple[str, float]] = {}
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            found[process.pid] = (bucket(process, pid), times.user + times.system)
        except psutil.Error:
            continue
    return found


def cpu_delta(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds spent between two :func:`tree_cpu` snapshots, per bucket and in total."""
    spent: dict[str, float] = {"front": 0.0, "model": 0.0}
    for pid, (bucket, seconds) in after.items():
        spent[bucket] = spent.get(bucket, 0.0) + seconds - before.get(pid, (bucket, 0.0))[1]
    spent["total"] = sum(spent.values())
    return spent


def prometheus(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus endpoint, keyed by (name, labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sordino_batches(url: str, model: str) -> tuple[float, float]:
    samples = prometheus(f"{url}/metrics")
    pick = [(n, v) for (n, labels), v in samples.items()
            if n.startswith("sordino_batch_size") and ("model", model) in labels]  # fmt: skip
    count = sum(v for n, v in pick if n.endswith("_count"))
    rows = sum(v for n, v in pick if n.endswith("_sum"))
    return count, rows


def triton_batches(url: str, model: str) -> tuple[float, float]:
    samples = prometheus(url)
    labels = frozenset({("model", model), ("version", "1")})
    # The parser names a counter's samples ..._total whether or not the server did.
    return samples.get(("nv_inference_exec_count_total", labels), 0.0), samples.get(
        ("nv_inference_count_total", labels), 0.0
    )


def mosec_batches(url: str) -> tuple[float, float] | None:
    """Mosec's batch-size histogram, where this version exposes one (else None: n/a)."""
    samples = prometheus(url)
    pick = [(n, v) for (n, _), v in samples.items() if n.startswith("mosec_service_batch_size")]
    if not pick:
        return None
    return (sum(v for n, v in pick if n.endswith("_count")),
            sum(v for n, v in pick if n.endswith("_sum")))  # fmt: skip


def mean_batch(
    before: tuple[float, float] | None, after: tuple[float, float] | None
) -> float | None:
    if before is None or after is None or after[0] <= before[0]:
        return None
    return (after[1] - before[1]) / (after[0] - before[0])


def percentile_ms(latencies: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(latencies) * 1000, q)) if latencies else float("nan")


def run_cell(
    target: Target,
    transport: str,
    concurrency: int,
    seconds: float,
    inputs: np.ndarray,
    expected: np.ndarray,
    warmup: float,
) -> dict[str, Any]:
    """One closed loop against one server; every answer checked after the clock stops."""
    host = urlparse(target.http).netloc
    if transport == "grpc":
        assert target.grpc is not None
        requests = [peer_load.kserve_grpc_request(target.model, "x", r) for r in inputs]
        decode = peer_load.kserve_grpc_output

        def load(length: float) -> peer_load.Answers:
            assert target.grpc is not None
            return asyncio.run(
                peer_load.grpc_closed_loop(target.grpc, requests, concurrency, length)
            )
    else:
        if target.label == MOSEC:
            requests = [peer_load.raw_http_request(host, "/inference", r) for r in inputs]
            decode = peer_load.raw_http_output
        else:
            requests = [peer_load.kserve_http_request(host, target.model, "x", r) for r in inputs]
            decode = peer_load.kserve_http_output

        def load(length: float) -> peer_load.Answers:
            with _runner() as runner:
                return runner.run(
                    peer_load.http_closed_loop(target.http, requests, concurrency, length)
                )

    if warmup > 0:
        load(warmup)
    batches_before, cpu_before = target.batches(), tree_cpu(target.pid, target.front)
    client_before = psutil.Process().cpu_times()
    machine_before = psutil.cpu_times()
    answers = load(seconds)
    machine_after = psutil.cpu_times()
    client_after = psutil.Process().cpu_times()
    cpu_after, batches_after = tree_cpu(target.pid, target.front), target.batches()
    failed, worst, first_error = peer_load.check(answers, expected, decode)
    n = max(len(answers.latencies), 1)
    client = (client_after.user + client_after.system) - (client_before.user + client_before.system)
    return {
        "server": target.label, "transport": transport, "concurrency": concurrency,
        "requests": len(answers.latencies), "seconds": answers.seconds,
        "rate": len(answers.latencies) / answers.seconds if answers.seconds else 0.0,
        "p50_ms": percentile_ms(answers.latencies, 50),
        "p99_ms": percentile_ms(answers.latencies, 99),
        "mean_batch": mean_batch(batches_before, batches_after),
        "cpu_ms": {k: v * 1000 / n for k, v in cpu_delta(cpu_before, cpu_after).items()},
        "client_cpu_ms": client * 1000 / n,
        "idle_share": idle_share(machine_before, machine_after),
        "failed": failed, "max_abs_diff": worst, "first_error": first_error,
    }  # fmt: skip


def perf_analyzer_cell(binary: Path, libs: Path, target: Target, transport: str,
                       concurrency: int, seconds: float) -> dict[str, Any]:  # fmt: skip
    """One perf_analyzer (C++) run: its own req/s and latencies, and CPU per request of
    the server tree and of perf_analyzer itself (requests counted by the server).

    Its windows are a third of ``seconds`` (it measures at least three, and reports the
    last); the stability bound is wide open, as this shared machine never holds 10 %.
    """
    import csv
    import resource
    import subprocess

    address = target.grpc if transport == "grpc" else urlparse(target.http).netloc
    assert address is not None
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "pa.csv"
        cmd = [str(binary), "-m", target.model, "-u", address, "-i", transport,
               "--concurrency-range", str(concurrency), "-p", str(int(seconds * 1000 / 3)),
               "--percentile=99", "--stability-percentage=1000", "--max-trials=3",
               "-f", str(report)]  # fmt: skip
        env = {**os.environ, "LD_LIBRARY_PATH": str(libs)}
        batches_before, cpu_before = target.batches(), tree_cpu(target.pid, target.front)
        own_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=seconds * 8 + 60
        )
        own_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_after, batches_after = tree_cpu(target.pid, target.front), target.batches()
        if done.returncode != 0 or not report.exists():
            tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
            return {"server": target.label, "transport": transport, "concurrency": concurrency,
                    "error": tail[0]}  # fmt: skip
        row = next(csv.DictReader(report.open()))
    served = (batches_after[1] - batches_before[1]) if batches_before and batches_after else 0
    n = max(served, 1)
    own = (own_after.ru_utime + own_after.ru_stime) - (own_before.ru_utime + own_before.ru_stime)
    return {
        "server": target.label, "transport": transport, "concurrency": concurrency,
        "rate": float(row["Inferences/Second"]), "p50_ms": float(row["p50 latency"]) / 1000,
        "p99_ms": float(row["p99 latency"]) / 1000, "served": served,
        "mean_batch": mean_batch(batches_before, batches_after),
        "cpu_ms": {k: v * 1000 / n for k, v in cpu_delta(cpu_before, cpu_after).items()},
        "client_cpu_ms": own * 1000 / n,
    }  # fmt: skip


def idle_share(before: Any, after: Any) -> float:
    """The share of the machine's CPU time (all cores) that was idle between two
    ``psutil.cpu_times()``: what a server that is the bottleneck left unused while
    nothing else ran — a pipeline whose stages take turns shows here."""
    spent = sum(after) - sum(before)
    return (after.idle - before.idle) / spent if spent > 0 else 0.0


@contextmanager
def _runner() -> Iterator[asyncio.Runner]:
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # the plain loop works; it only costs the generator more CPU
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        yield runner


def cells_plan(
    targets: list[str], repeat: int, concurrencies: tuple[int, ...] = CONCURRENCIES
) -> list[tuple[int, int, str, str]]:
    """(repeat, concurrency, transport, server) in run order: servers interleaved within
    each (concurrency, transport), their order rotated every repeat; Mosec is HTTP only."""
    plan = []
    for r in range(repeat):
        order = targets[r % len(targets) :] + targets[: r % len(targets)]
        for concurrency in concurrencies:
            for transport in ("http", "grpc"):
                for server in order:
                    if transport == "grpc" and server == MOSEC:
                        continue
                    plan.append((r, concurrency, transport, server))
    return plan


def aggregate(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The median of every figure over the repeats of each (server, transport, in flight);
    failures are summed and the max abs difference is the worst seen."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for cell in cells:
        groups.setdefault((cell["server"], cell["transport"], cell["concurrency"]), []).append(cell)

    def median(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return statistics.median(present) if present else None

    rows = []
    for (server, transport, concurrency), group in groups.items():
        parts = sorted({k for c in group for k in c["cpu_ms"]})
        rows.append({
            "server": server, "transport": transport, "concurrency": concurrency,
            "repeats": len(group),
            **{k: median([c[k] for c in group])
               for k in ("rate", "p50_ms", "p99_ms", "mean_batch", "client_cpu_ms")},
            "idle_share": median([c.get("idle_share") for c in group]),
            "cpu_ms": {p: median([c["cpu_ms"].get(p) for c in group]) for p in parts},
            "failed": sum(c["failed"] for c in group),
            "max_abs_diff": max(c["max_abs_diff"] for c in group),
        })  # fmt: skip
    return rows


def verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, each as a measured ratio (or value) against its bound."""
    at = {(r["server"], r["transport"], r["concurrency"]): r for r in rows}
    found: list[dict[str, Any]] = []

    def add(name: str, value: float | None, bound: float, higher_is_better: bool) -> None:
        met = None if value is None else (value >= bound if higher_is_better else value <= bound)
        found.append({"target": name, "value": value, "bound": bound,
                      "higher_is_better": higher_is_better, "met": met})  # fmt: skip

    def ratio(a: tuple[str, str, int], b: tuple[str, str, int], key: str) -> float | None:
        if a not in at or b not in at:
            return None
        x, y = at[a][key], at[b][key]
        return None if x is None or not y else x / y

    for transport in ("http", "grpc"):
        us, them = (SORDINO, transport, 64), (TRITON, transport, 64)
        add(f"{transport} c64 throughput / Triton's", ratio(us, them, "rate"), 1.0, True)
        add(f"{transport} c64 p99 / Triton's", ratio(us, them, "p99_ms"), 1.0, False)
    for transport in ("http", "grpc"):
        us, them = (SORDINO_FE, transport, 64), (TRITON, transport, 64)
        if us in at:
            add(
                f"2 front ends: {transport} c64 throughput / Triton's",
                ratio(us, them, "rate"), 1.0, True,
            )  # fmt: skip
            add(f"2 front ends: {transport} c64 p99 / Triton's", ratio(us, them, "p99_ms"), 1.0,
                False)  # fmt: skip
    add(
        "gRPC c64 mean batch / HTTP's",
        ratio((SORDINO, "grpc", 64), (SORDINO, "http", 64), "mean_batch"),
        0.9,
        True,
    )
    add(
        "HTTP c1 p50 / Triton 0ms p50",
        ratio((SORDINO, "http", 1), (TRITON_0, "http", 1), "p50_ms"),
        1.0,
        False,
    )
    c1 = [at.get((s, "http", 1)) for s in (SORDINO, TRITON_0)]
    add(
        "HTTP c1 CPU per request / Triton 0ms's",
        c1[0]["cpu_ms"]["total"] / c1[1]["cpu_ms"]["total"]
        if c1[0] and c1[1] and c1[1]["cpu_ms"].get("total")
        else None,
        1.0,
        False,
    )
    c64 = at.get((SORDINO, "http", 64))
    add(
        "HTTP c64 CPU ms per request (whole tree)",
        c64["cpu_ms"]["total"] if c64 else None,
        0.30,
        False,
    )
    add(
        "defaults HTTP c64 throughput / Mosec's",
        ratio((DEFAULTS, "http", 64), (MOSEC, "http", 64), "rate"),
        1.5,
        True,
    )
    add(
        "defaults HTTP c64 p99 / Mosec's",
        ratio((DEFAULTS, "http", 64), (MOSEC, "http", 64), "p99_ms"),
        1.0,
        False,
    )
    return found  # fmt: skip


def idle_cpu(targets: dict[str, Target], order: list[str], seconds: float) -> dict[str, float]:
    """Each server tree's CPU (% of one core) while nothing is sent to anyone (measured
    before the first cell and after the last).

    All the servers stay up for the whole run, so what an idle one burns is taken from
    the one under load; this makes that visible.
    """
    if seconds <= 0:
        return {}
    pids = {targets[label].pid: targets[label].front for label in order}
    before = {pid: tree_cpu(pid, bucket) for pid, bucket in pids.items()}
    time.sleep(seconds)
    spent = {pid: cpu_delta(before[pid], tree_cpu(pid, bucket)) for pid, bucket in pids.items()}
    found = {label: spent[targets[label].pid]["total"] * 100 / seconds for label in order}
    console.print(
        "idle CPU, % of a core: " + ", ".join(f"{k} {v:.1f}" for k, v in found.items()),
        markup=False, highlight=False,
    )  # fmt: skip
    return found


def show(rows: list[dict[str, Any]], found: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(title="W1 MLP, closed loops, medians over the repeats (CPU: ms per request)")
    columns = ("server", "transport", "in flight", "req/s", "p50 ms", "p99 ms", "mean batch",
               "CPU front", "CPU model", "CPU total", "client CPU", "machine idle",
               "failed", "max |diff|")  # fmt: skip
    for c in columns:
        table.add_column(c, justify="left" if c in ("server", "transport") else "right")
    order = {
        s: i
        for i, s in enumerate((SORDINO, SORDINO_FE, SORDINO_PY, DEFAULTS, TRITON, TRITON_0, MOSEC))
    }
    for r in sorted(
        rows, key=lambda r: (r["concurrency"], r["transport"] != "http", order[r["server"]])
    ):
        cpu = r["cpu_ms"]
        table.add_row(
            r["server"], r["transport"], str(r["concurrency"]), f"{r['rate']:,.0f}",
            f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.1f}",
            "n/a" if r["mean_batch"] is None else f"{r['mean_batch']:.1f}",
            f"{cpu['front']:.3f}", f"{cpu['model']:.3f}", f"{cpu['total']:.3f}",
            f"{r['client_cpu_ms']:.3f}",
            "n/a" if r.get("idle_share") is None else f"{r['idle_share']:.0%}",
            str(r["failed"]), f"{r['max_abs_diff']:.1e}",
        )  # fmt: skip
    console.print(table)
    for v in found:
        value = "n/a" if v["value"] is None else f"{v['value']:.2f}"
        sign = ">=" if v["higher_is_better"] else "<="
        verdict = {True: "met", False: "NOT met", None: "not measured"}[v["met"]]
        console.print(f"{v['target']}: {value} (target {sign} {v['bound']:g}) — {verdict}")


def cross_check(args: argparse.Namespace, targets: dict[str, Target],
                order: list[str]) -> list[dict[str, Any]]:  # fmt: skip
    """The same KServe cells once more from perf_analyzer (C++), interleaved likewise."""
    try:
        python = peers.ensure_venv("triton", peers.TRITON_PACKAGES, "import pytriton")
        binary, libs = peers.ensure_perf_analyzer(python)
    except peers.PeerError as error:
        _fail(str(error))
    found = []
    concurrencies = tuple(int(c) for c in args.concurrency.split(","))
    for _, concurrency, transport, label in cells_plan(order, 1, concurrencies):
        if label == MOSEC:  # not KServe: perf_analyzer cannot drive it
            continue
        cell = perf_analyzer_cell(binary, libs, targets[label], transport, concurrency,
                                  args.seconds)  # fmt: skip
        found.append(cell)
        what = cell.get("error") or f"{cell['rate']:,.0f} req/s, p99 {cell['p99_ms']:.1f} ms"
        console.print(f"[perf_analyzer] {label} {transport} c{concurrency}: {what}",
                      markup=False, highlight=False)  # fmt: skip
    return found


def show_perf_analyzer(cells: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(title="The same, from perf_analyzer (C++), one run each (CPU: ms per request)")
    for c in ("server", "transport", "in flight", "req/s", "p50 ms", "p99 ms", "mean batch",
              "CPU total", "perf_analyzer CPU"):  # fmt: skip
        table.add_column(c, justify="left" if c in ("server", "transport") else "right")
    for c in cells:
        if "error" in c:
            table.add_row(c["server"], c["transport"], str(c["concurrency"]), c["error"])
            continue
        table.add_row(
            c["server"], c["transport"], str(c["concurrency"]), f"{c['rate']:,.0f}",
            f"{c['p50_ms']:.2f}", f"{c['p99_ms']:.1f}",
            "n/a" if c["mean_batch"] is None else f"{c['mean_batch']:.1f}",
            f"{c['cpu_ms']['total']:.3f}", f"{c['client_cpu_ms']:.3f}",
        )  # fmt: skip
    console.print(table)


def _fail(message: str) -> NoReturn:
    console.print(f"bench_triton: {message}", markup=False, highlight=False)
    sys.exit(2)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import onnxruntime as ort

    from bench.bench_workloads import server_config, workload

    w1 = workload("w1", None, None)
    onnx_path = w1.model_file
    inputs = np.random.default_rng(0).random((ROWS, 256), dtype=np.float32)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    expected = np.stack([session.run(None, {"x": row[None]})[0][0] for row in inputs])
    wanted = args.servers.split(",")
    targets: dict[str, Target] = {}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as scratch:
        try:
            if TRITON in wanted or TRITON_0 in wanted:
                python = peers.ensure_venv("triton", peers.TRITON_PACKAGES,
                                           "import pytriton, onnxruntime, numpy")  # fmt: skip
                spin = args.session_spinning == "on"
                models_ = [peers.Batching("w1", spinning=spin),
                           peers.Batching("w1_nodelay", delay_us=0, spinning=spin)]  # fmt: skip
                t = stack.enter_context(peers.triton_server(python, onnx_path, models_))
                for label, model in ((TRITON, "w1"), (TRITON_0, "w1_nodelay")):
                    metrics = t.metrics or ""
                    batches = partial(triton_batches, metrics, model)
                    targets[label] = Target(
                        label, t.http, t.grpc, model, t.pid, _root_is_front, batches
                    )
            if MOSEC in wanted:
                python = peers.ensure_venv("mosec", peers.MOSEC_PACKAGES,
                                           "import mosec, onnxruntime, numpy")  # fmt: skip
                m = stack.enter_context(peers.mosec_server(python, onnx_path))
                targets[MOSEC] = Target(MOSEC, m.http, None, "w1", m.pid, _mosec_parts,
                                        lambda u=m.metrics or "": mosec_batches(u))  # fmt: skip
        except peers.PeerError as error:
            _fail(str(error))
        try:
            if SORDINO in wanted:
                config = server_config(w1, Path(scratch), 2, "adaptive", 100.0)
                s = stack.enter_context(sordino_server(["--no-builtin", "--config", str(config)]))
                targets[SORDINO] = Target(SORDINO, s.http, s.grpc, "w1", s.pid, _root_is_front,
                                          lambda u=s.http: sordino_batches(u, "w1"))  # fmt: skip
            if SORDINO_FE in wanted:
                config = server_config(w1, Path(scratch), 2, "adaptive", 100.0)
                f = stack.enter_context(sordino_server(
                    ["--no-builtin", "--config", str(config), "--frontends", "2"]
                ))  # fmt: skip
                targets[SORDINO_FE] = Target(SORDINO_FE, f.http, f.grpc, "w1", f.pid,
                                             _frontends_are_front,
                                             lambda u=f.http: sordino_batches(u, "w1"))  # fmt: skip
            if SORDINO_PY in wanted:
                repo = peers.write_triton_repository(
                    Path(scratch) / "python-models",
                    [peers.Batching("w1", spinning=args.session_spinning == "on")],
                    onnx_path,
                )
                # The scheduler settings of the "sordino" target (bench_workloads').
                settings = Path(scratch) / "python_runtime.yaml"
                settings.write_text(
                    "scheduler:\n  mode: adaptive\n  slo_p99_ms: 100.0\n  strategies:\n"
                    "    - {name: dynamic_batching, max_batch: 32, timeout_ms: 10}\n"
                )
                p = stack.enter_context(sordino_server(
                    ["--no-builtin", "--config", str(settings), "--model-repository", str(repo)]
                ))  # fmt: skip
                targets[SORDINO_PY] = Target(SORDINO_PY, p.http, p.grpc, "w1", p.pid,
                                             _root_is_front,
                                             lambda u=p.http: sordino_batches(u, "w1"))  # fmt: skip
            if DEFAULTS in wanted:
                d = stack.enter_context(sordino_server(["--model", f"w1={onnx_path}"]))
                targets[DEFAULTS] = Target(DEFAULTS, d.http, d.grpc, "w1", d.pid, _root_is_front,
                                           lambda u=d.http: sordino_batches(u, "w1"))  # fmt: skip
        except RuntimeError as error:
            _fail(f"sordino start failed: {error}")
        order = [label for label in wanted if label in targets]
        idle = {"before": idle_cpu(targets, order, args.idle)}
        plan = cells_plan(order, args.repeat, tuple(int(c) for c in args.concurrency.split(",")))
        cells = run_plan(
            plan,
            lambda step: run_cell(targets[step[3]], step[2], step[1], args.seconds, inputs,
                                  expected, args.warmup),
            lambda step, cell: (
                f"{step[3]} {step[2]} c{step[1]}: {cell['rate']:,.0f} req/s, "
                f"p99 {cell['p99_ms']:.1f} ms"
            ),
            console,
        )  # fmt: skip
        idle["after"] = idle_cpu(targets, order, args.idle)
        analyzed = cross_check(args, targets, order) if args.perf_analyzer else []
    rows = aggregate(cells)
    found = verdicts(rows)
    show(rows, found)
    if analyzed:
        show_perf_analyzer(analyzed)
    report = {
        **report_head("triton", onnxruntime=ort.__version__),
        "settings": {"seconds": args.seconds, "repeat": args.repeat, "warmup": args.warmup,
                     "session_spinning": args.session_spinning,
                     "servers": order, "concurrency": args.concurrency},
        "rows": rows, "targets": found, "idle_cpu_percent": idle, "cells": cells,
        "perf_analyzer": analyzed,
    }  # fmt: skip
    console.print(f"wrote {save(args.name, report)}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cell_arguments(parser, seconds=5.0, repeat=2)
    parser.add_argument("--idle", type=float, default=3.0,
                        help="seconds of idle CPU measured before and after (0: skip)")  # fmt: skip
    parser.add_argument("--concurrency", default="1,8,64", help="requests in flight")
    parser.add_argument("--servers", default=",".join((SORDINO, DEFAULTS, TRITON, TRITON_0, MOSEC)),
                        help="a comma-separated subset, quoted (default: all five)")  # fmt: skip
    parser.add_argument("--perf-analyzer", action="store_true",
                        help="then the KServe cells again from perf_analyzer (C++)")  # fmt: skip
    parser.add_argument("--session-spinning", choices=("on", "off"), default="on",
                        help="whether the ONNX Runtime session of the Python-backend model.py "
                        "(Triton's and 'sordino python') spins: on is ONNX Runtime's "
                        "default; off is what sordino's own ONNX workers do")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="2 s a cell, one repeat")
    parser.add_argument("--name", default="triton", help="results file bench/results/NAME.json")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.repeat, args.warmup = 2.0, 1, 0.3
    known = {SORDINO, DEFAULTS, TRITON, TRITON_0, MOSEC, SORDINO_PY, SORDINO_FE}
    if unknown := set(args.servers.split(",")) - known:
        parser.error(f"unknown server(s) {sorted(unknown)}; choose from {sorted(known)}")
    run(args)


if __name__ == "__main__":
    main()
