"""Shared pieces of the benchmarks: a server process, a closed-loop client, tables."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console(width=110)
RESULTS = Path(__file__).parent / "results"
Step = TypeVar("Step", bound=tuple[Any, ...])


@dataclass
class Measurement:
    """One row of a benchmark table."""

    label: str
    concurrency: int
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    mean_batch: float | None = None

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rate": self.rate}


def summarize(label: str, concurrency: int, latencies: list[float], seconds: float,
              mean_batch: float | None = None) -> Measurement:  # fmt: skip
    arr = np.asarray(latencies) * 1000
    return Measurement(
        label, concurrency, len(latencies), seconds,
        float(np.percentile(arr, 50)), float(np.percentile(arr, 99)), mean_batch,
    )  # fmt: skip


@dataclass(frozen=True)
class Endpoints:
    """Where a benchmarked server listens."""

    http: str  # http://127.0.0.1:PORT
    grpc: str  # 127.0.0.1:PORT
    pid: int  # the server process; its children are the workers

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used so far by the server process, its workers, and this client."""
        import psutil

        server = psutil.Process(self.pid)
        workers = 0.0
        for child in server.children(recursive=True):
            try:
                times = child.cpu_times()
            except psutil.NoSuchProcess:
                continue
            workers += times.user + times.system
        own, mine = server.cpu_times(), psutil.Process().cpu_times()
        return {
            "server": own.user + own.system,
            "workers": workers,
            "client": mine.user + mine.system,
        }


@contextmanager
def sordino_server(
    args: list[str],
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
    python: str | None = None,
) -> Iterator[Endpoints]:
    """Run ``sordino start`` (free ports, scratch data dir) in its own process.

    ``prefix`` goes before the command (``["taskset", "-c", "1"]`` pins the server and
    the workers it starts to one core); ``python`` is the interpreter to run it with
    (another environment's, with sordino's dependencies installed; default this one's).
    """
    scratch = tempfile.TemporaryDirectory(prefix="sordino-bench-")
    cmd = [*(prefix or []), python or sys.executable, "-m", "sordino", "start", "--http-port", "0",
           "--grpc-port", "0",
           "--log-level", "warning", "--data-dir", scratch.name, *args]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )  # fmt: skip
    assert proc.stdout is not None
    http = grpc = None
    for line in proc.stdout:
        if match := re.search(r"listening on (http://\S+)", line):
            http = match.group(1)
        elif match := re.search(r"listening on grpc://(\S+)", line):
            grpc = match.group(1)
        if http and grpc:
            break
    if http is None or grpc is None:
        proc.kill()
        raise RuntimeError("sordino start did not come up")
    # Keep reading its output so the server never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in proc.stdout or ()], daemon=True).start()
    try:
        yield Endpoints(http, grpc, proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        scratch.cleanup()


async def closed_loop(
    url: str, payloads: list[bytes], concurrency: int, headers: dict[str, str],
    check: Callable[[int, bytes, str | None], None] | None = None,
    on_done: Callable[[], None] | None = None,
) -> tuple[list[float], float]:  # fmt: skip
    """Send every payload with ``concurrency`` clients, each waiting for its answer.

    Return per-request latencies (seconds) and the wall time of the whole run.
    """
    latencies: list[float] = []
    next_index = 0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal next_index
        while next_index < len(payloads):
            i = next_index
            next_index += 1
            start = time.perf_counter()
            async with session.post(url, data=payloads[i], headers=headers) as response:
                body = await response.read()
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")
                header_length = response.headers.get("Inference-Header-Content-Length")
            latencies.append(time.perf_counter() - start)
            if check is not None:
                check(i, body, header_length)
            if on_done is not None:
                on_done()

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        return latencies, time.perf_counter() - started


def progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console,
    )  # fmt: skip


def batch_metrics(url: str, model: str) -> tuple[float, float]:
    """Return (count, sum) of the server's batch-size histogram for ``model``."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"{url}/metrics").read().decode()
    count = total = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == "sordino_batch_size":
            for s in family.samples:
                if s.labels.get("model") == model and s.name.endswith("_count"):
                    count = s.value
                elif s.labels.get("model") == model and s.name.endswith("_sum"):
                    total = s.value
    return count, total


def show(title: str, rows: list[Measurement], unit: str = "req/s") -> None:
    table = Table(title=title)
    for column in ("what", "concurrency", unit, "p50 ms", "p99 ms", "mean batch"):
        table.add_column(column, justify="right" if column != "what" else "left")
    for m in rows:
        table.add_row(
            m.label, str(m.concurrency), f"{m.rate:,.0f}", f"{m.p50_ms:.2f}", f"{m.p99_ms:.2f}",
            f"{m.mean_batch:.1f}" if m.mean_batch else "",
        )  # fmt: skip
    console.print(table)


def save(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2))
    return path


def alternation_arguments(parser: argparse.ArgumentParser) -> None:
    """``--base``, ``--pairs``, ``--rounds``, ``--seconds``: this checkout's ``src/``
    measured in runs alternated with another checkout's (see :func:`alternated`)."""
    parser.add_argument("--base", type=Path, help="a checkout whose src/ runs alternated")
    parser.add_argument("--pairs", type=int, default=3, help="runs of each code")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds a run")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of a round")


def alternated(base: Path | None) -> list[tuple[str, Path]]:
    """The ``src/`` folders an A/B alternates: ``("base", …)`` when ``base`` is given,
    then ``("this", …)``, this checkout's."""
    codes = [("base", base / "src")] if base else []
    codes.append(("this", Path(__file__).resolve().parents[1] / "src"))
    return codes


def child_run(command: list[str], src: Path, timeout: float) -> dict[str, Any]:
    """Run ``command`` with ``src`` on its ``PYTHONPATH``; its last line of output is a
    JSON report whose ``us`` list gets its median as ``median_us``. A failed child ends
    the benchmark with its error output (no traceback here)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"the measured process failed:\n{out.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result["median_us"] = statistics.median(result["us"])
    return result


def report_alternation(runs: dict[str, list[float]], report: dict[str, Any], what: str) -> None:
    """Print each code's median of ``runs`` (µs ``what``) and this / base; add both to
    ``report`` (``<label>_median_us``, ``ratio``)."""
    for label, values in runs.items():
        report[f"{label}_median_us"] = statistics.median(values)
        console.print(f"{label}: median {statistics.median(values):.1f} µs {what} "
                      f"(runs {', '.join(f'{v:.1f}' for v in values)})")  # fmt: skip
    if "base" in runs:
        ratio = report["this_median_us"] / report["base_median_us"]
        report["ratio"] = ratio
        console.print(f"this / base: {ratio:.3f}")


def report_head(benchmark: str, **versions: str) -> dict[str, Any]:
    """The head of a saved report: ``benchmark``, the date (UTC) and the machine (CPUs,
    platform, Python, then ``versions`` such as ``onnxruntime=...``, then the 1-minute load)."""
    return {
        "benchmark": benchmark,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), **versions,
                    "load_1m": os.getloadavg()[0]},
    }  # fmt: skip


def cell_arguments(parser: argparse.ArgumentParser, *, seconds: float, repeat: int) -> None:
    """Add ``--seconds`` (default ``seconds``), ``--repeat`` (default ``repeat``) and
    ``--warmup`` (0.5 s): the length of each cell of a plan and the rounds over it."""
    parser.add_argument("--seconds", type=float, default=seconds, help="measured seconds a cell")
    parser.add_argument("--repeat", type=int, default=repeat, help="rounds over every cell")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds a cell")


def run_plan(
    plan: Sequence[Step],
    run: Callable[[Step], dict[str, Any]],
    describe: Callable[[Step, dict[str, Any]], str],
    out: Console,
    clock: bool = True,
) -> list[dict[str, Any]]:
    """Run every step of ``plan`` in order and return its cells.

    A step's first item is its repeat, stored in the cell as ``repeat``. After each cell
    ``out`` prints one progress line: ``[i/n Ts] `` (``T``, seconds since the start, only
    with ``clock``), then ``describe(step, cell)``, then, when the cell has failed answers,
    ``, N FAILED (first error)``. ``cell`` must hold ``failed`` and ``first_error``."""
    cells = []
    started = time.monotonic()
    for i, step in enumerate(plan, 1):
        cell = run(step)
        cell["repeat"] = step[0]
        cells.append(cell)
        elapsed = f" {time.monotonic() - started:4.0f}s" if clock else ""
        out.print(
            f"[{i}/{len(plan)}{elapsed}] {describe(step, cell)}"
            + (f", {cell['failed']} FAILED ({cell['first_error']})" if cell["failed"] else ""),
            markup=False, highlight=False,
        )  # fmt: skip
    return cells


def json_request(name: str, array: np.ndarray, datatype: str = "FP32") -> bytes:
    """A KServe v2 JSON body with one input."""
    import orjson

    return orjson.dumps(
        {"inputs": [{"name": name, "shape": list(array.shape), "datatype": datatype,
                     "data": array.ravel().tolist()}]}
    )  # fmt: skip


def binary_request(name: str, array: np.ndarray, datatype: str = "FP32") -> tuple[bytes, str]:
    """A binary-tensor-extension body (binary output too); returns (body, header length)."""
    import orjson

    header = orjson.dumps(
        {
            "inputs": [{"name": name, "shape": list(array.shape), "datatype": datatype,
                        "parameters": {"binary_data_size": array.nbytes}}],
            "parameters": {"binary_data_output": True},
        }
    )  # fmt: skip
    return header + np.ascontiguousarray(array).tobytes(), str(len(header))


def decode_output(body: bytes, header_length: str | None) -> np.ndarray:
    """The first output of a KServe v2 response, JSON or binary, as FP32."""
    import orjson

    if header_length is None:
        return np.asarray(orjson.loads(body)["outputs"][0]["data"], dtype=np.float32)
    return np.frombuffer(body[int(header_length) :], dtype=np.float32)


async def open_loop(
    url: str, payloads: list[bytes], rate: float, headers: dict[str, str],
    max_in_flight: int = 512,
) -> tuple[list[float], float, int]:  # fmt: skip
    """Send payloads at a fixed arrival ``rate`` regardless of answers (open loop).

    Latency is measured from each request's intended send time, so a server that
    falls behind is charged for the delay it causes (no coordinated omission).
    Returns latencies (seconds), wall time, and how many requests failed.
    """
    latencies: list[float] = []
    failures = 0
    connector = aiohttp.TCPConnector(limit=max_in_flight)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()

        async def one(i: int) -> None:
            nonlocal failures
            intended = start + i / rate
            delay = intended - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                async with session.post(url, data=payloads[i], headers=headers) as response:
                    await response.read()
                    if response.status != 200:
                        failures += 1
            except aiohttp.ClientError:
                failures += 1
            latencies.append(time.perf_counter() - intended)

        await asyncio.gather(*(one(i) for i in range(len(payloads))))
        return latencies, time.perf_counter() - start, failures


async def grpc_closed_loop(
    address: str, model: str, input_name: str, datatype: str, arrays: list[np.ndarray],
    concurrency: int, check: Callable[[int, np.ndarray], None] | None = None,
    on_done: Callable[[], None] | None = None,
) -> tuple[list[float], float]:  # fmt: skip
    """The closed loop of :func:`closed_loop` over KServe v2 gRPC (``ModelInfer``).

    A lean client, as aiohttp is for HTTP: one grpc.aio channel, requests serialized
    before the clock starts (raw_input_contents), answers parsed with the protobuf
    messages. tritonclient's aio client costs more CPU per call than the server does
    on this machine, which would make the client the thing measured.
    """
    import grpc

    from sordino.protocol.pb import kserve_v2_pb2 as pb

    bodies = []
    for array in arrays:
        request = pb.ModelInferRequest(model_name=model)
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = input_name, datatype
        tensor.shape.extend(array.shape)
        request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
        bodies.append(request.SerializeToString())
    latencies: list[float] = []
    next_index = 0
    async with grpc.aio.insecure_channel(address) as channel:
        infer = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=None,
            response_deserializer=pb.ModelInferResponse.FromString,
        )

        async def one_client() -> None:
            nonlocal next_index
            while next_index < len(arrays):
                i = next_index
                next_index += 1
                start = time.perf_counter()
                response = await infer(bodies[i])
                latencies.append(time.perf_counter() - start)
                if check is not None:
                    check(i, np.frombuffer(response.raw_output_contents[0], dtype=np.float32))
                if on_done is not None:
                    on_done()

        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        return latencies, time.perf_counter() - started


def core_busy_s(core: int | None) -> float:
    """CPU seconds ``core`` has been busy (all processes, /proc/stat); 0 where unknown."""
    if core is None:
        return 0.0
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            fields = line.split()
            if fields[0] == f"cpu{core}":
                # user nice system idle iowait irq softirq steal: all but idle and iowait
                ticks = sum(int(v) for i, v in enumerate(fields[1:9]) if i not in (3, 4))
                return ticks / os.sysconf("SC_CLK_TCK")
    except OSError:
        pass
    return 0.0


def others_share(
    core: int | None, busy_before: float, cpu_before: dict[str, float],
    cpu_after: dict[str, float], seconds: float,
) -> float:  # fmt: skip
    """The share of ``core`` that processes other than the server and its workers took
    over ``seconds`` (on a shared machine, what the server could not have)."""
    if core is None or seconds <= 0:
        return 0.0
    ours = sum(cpu_after[k] - cpu_before[k] for k in ("server", "workers"))
    return max(0.0, (core_busy_s(core) - busy_before - ours) / seconds)
