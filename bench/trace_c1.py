"""Where one request's time goes at 1 in flight: timestamps along the path (issue 30).

    python -m bench.trace_c1                  # W1, HTTP KServe binary, 1 in flight, 8 s
    python -m bench.trace_c1 --seconds 12 --src /other/checkout/src

A copy of ``--src`` (this checkout's by default) gets a mark — ``perf_counter_ns()``,
CLOCK_MONOTONIC, so the server's and the worker's marks share one clock — at each step
of the path listed in ``MARKS`` below; the source itself is never touched. ``sordino
start`` runs the copy with bench_triton's "sordino" settings (max batch 32, 10 ms wait,
adaptive, 2 intra-op threads), a closed loop of one request at a time is sent, and the
marks of both processes, merged in time order, are cut into requests (each starts at
the HTTP bytes' arrival). For the requests that took the most common way (the same
marks in the same order) it prints the median time between each mark and the next,
and the same for ONNX Runtime alone on one row (in this process, a 600 µs sleep
between runs, as the server's worker sees it). Each mark costs ~0.3 µs; the marks are
an anchor's exact line, and one that no longer matches ends the run with its name.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import peer_load
from bench.bench_triton import _runner
from bench.bench_workloads import server_config, workload
from bench.common import sordino_server

# (file under src/sordino, the anchor line stripped, the mark's name, before/after it)
MARKS: list[tuple[str, str, str, str]] = [
    ("server/http_protocol.py", "def data_received(self, data: bytes) -> None:",
     "front: HTTP bytes in", "after"),
    ("server/fast_infer.py", "if len(body) > limit:", "front: body whole (open_infer)", "before"),
    ("server/fast_infer.py",
     "response = await serve(parts, request, opened.route, opened.shared, watch)",
     "front: decoded", "before"),
    ("server/service.py", "accepted, ticket = await self._accept(request, route, one_shot=True)",
     "front: queued (admitted, submitted)", "after"),
    ("scheduling/loop.py",
     "task = asyncio.get_running_loop().create_task(self._runner.execute(batch), context=context)",
     "front: batch decided", "before"),
    ("scheduling/batches.py",
     "outputs = await self._executor.run(self.model, [item.inputs for item in live], context)",
     "front: batch task runs", "before"),
    ("execution/chain.py",
     "return self._staging.outputs(staged, await self._dispatcher.dispatch(entry, staged))",
     "front: staged in the arena", "before"),
    ("execution/worker.py", "self._send(Run(batch_id, inputs, space, fault, segment, rows, facts))",
     "front: Run to write (placed)", "before"),
    ("execution/worker_loop.py", "message = link.recv()", "worker: Run read", "after"),
    ("backends/onnx.py", "results = session.run(None, feed, options)", "worker: ORT run", "before"),
    ("backends/onnx.py", "results = session.run(None, feed, options)", "worker: ORT done", "after"),
    ("execution/worker_loop.py", "link.send(Done(run.batch_id, written, infer_s))",
     "worker: Done to write (outputs in)", "before"),
    ("execution/worker_pipe.py", "data = os.read(self._fd, 1 << 16)", "front: Done readable",
     "before"),
    ("execution/worker.py", "result = await future", "front: batch resumed", "after"),
    ("scheduling/batches.py",
     "outputs = await self._executor.run(self.model, [item.inputs for item in live], context)",
     "front: executor returned", "after"),
    ("scheduling/batches.py",
     "self._outcomes.batch_observed(rows, len(live), t1 - t0, t2 - t1, t3 - t2, ok=True)",
     "front: outputs handed", "before"),
    ("server/service.py", "outputs = await route.scheduler.result(accepted)",
     "front: request resumed", "after"),
    ("server/fast_infer.py",
     "response = await serve(parts, request, opened.route, opened.shared, watch)",
     "front: response built", "after"),
    ("server/fast_infer.py", "if parts.registry.stopping:", "front: encoded", "before"),
    ("server/http_cycle.py", "self.respond(status, payload, headers)", "front: written", "after"),
]  # fmt: skip
FIRST = MARKS[0][2]

TRACE_MODULE = '''"""Marks for bench/trace_c1.py (a copy of the source only)."""
import os, time
_marks = []
_dir = os.environ["SORDINO_TRACE_DIR"]
def mark(name):
    _marks.append((name, time.perf_counter_ns()))
    if len(_marks) >= 2000:
        with open(os.path.join(_dir, str(os.getpid())), "a") as f:
            f.write("".join(f"{n}\\t{t}\\n" for n, t in _marks))
        _marks.clear()
'''


def instrument(src: Path, into: Path) -> Path:
    """Copy ``src`` (a ``src/`` with ``sordino/``) under ``into`` with the marks in."""
    copy = into / "src"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__"))
    package = copy / "sordino"
    (package / "_trace_marks.py").write_text(TRACE_MODULE)
    lines_of: dict[str, list[str]] = {}
    for path, anchor, name, where in MARKS:
        lines = lines_of.setdefault(path, (package / path).read_text().splitlines())
        found = [i for i, line in enumerate(lines) if line.strip() == anchor]
        if len(found) != 1:
            raise SystemExit(f"trace_c1: {path}: {len(found)} lines are {anchor!r}; fix MARKS")
        at = found[0]
        indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
        if where == "after" and anchor.endswith(":"):
            indent += "    "
        call = f"{indent}_sordino_mark({name!r})"
        lines.insert(at + 1 if where == "after" else at, call)
    for path, lines in lines_of.items():
        text = "\n".join(lines) + "\n"
        head = "from __future__ import annotations\n"
        text = text.replace(
            head, head + "from sordino._trace_marks import mark as _sordino_mark\n", 1
        )
        (package / path).write_text(text)
    return copy


def breakdown(directory: Path, skip: float) -> tuple[list[str], list[list[float]], int]:
    """The most common way's marks, the µs between each and the next per request, and
    how many requests there were in all."""
    events: list[tuple[int, str]] = []
    until = None  # the earliest of the processes' last marks written out
    for file in directory.iterdir():
        marks = [line.split("\t") for line in file.read_text().splitlines()]
        events += [(int(stamp), name) for name, stamp in marks]
        until = min(until or int(marks[-1][1]), int(marks[-1][1]))
    events = sorted(e for e in events if until is None or e[0] <= until)
    requests: list[list[tuple[str, int]]] = []
    for stamp, name in events:
        if name == FIRST:
            requests.append([])
        if requests:
            requests[-1].append((name, stamp))
    requests = requests[int(len(requests) * skip) : -1]
    ways = collections.Counter(tuple(n for n, _ in r) for r in requests)
    way = list(ways.most_common(1)[0][0])
    chosen = [r for r in requests if [n for n, _ in r] == way]
    steps = [[(r[i][1] - r[i - 1][1]) / 1000 for r in chosen] for i in range(1, len(way))]
    return way, steps, len(requests)


def raw_onnx(model: Path, runs: int = 1000) -> float:
    """Median µs of ONNX Runtime's run on one row, 2 threads, no spinning, 600 µs apart."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    row = np.random.default_rng(0).random((1, 256), dtype=np.float32)
    took = []
    for _ in range(runs):
        time.sleep(0.0006)
        start = time.perf_counter_ns()
        session.run(None, {"x": row})
        took.append((time.perf_counter_ns() - start) / 1000)
    return statistics.median(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--src", type=Path, default=Path(__file__).resolve().parent.parent / "src")
    args = parser.parse_args()
    w1 = workload("w1", None, None)
    rows = np.random.default_rng(0).random((256, 256), dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="trace-c1-") as scratch:
        root = Path(scratch)
        marks = root / "marks"
        marks.mkdir()
        src = instrument(args.src.resolve(), root)
        config = server_config(w1, root, 2, "adaptive", 100.0)
        repo = Path(__file__).resolve().parent.parent
        env = {"PYTHONPATH": f"{src}{os.pathsep}{repo}", "SORDINO_TRACE_DIR": str(marks)}
        with sordino_server(["--no-builtin", "--config", str(config)], env=env) as server:
            host = server.http.split("//", 1)[1]
            requests = [peer_load.kserve_http_request(host, "w1", "x", row) for row in rows]
            with _runner() as runner:  # the bench's lean client, on uvloop
                answers = runner.run(
                    peer_load.http_closed_loop(server.http, requests, 1, args.seconds)
                )
        way, steps, total = breakdown(marks, skip=0.1)
    latencies = sorted(answers.latencies)
    print(f"{len(latencies)} requests, client p50 {latencies[len(latencies) // 2] * 1000:.3f} ms; "
          f"{len(steps[0])} of the {total} traced took the most common way:")  # fmt: skip
    for i, took in enumerate(steps):
        print(f"  {way[i]:>36} -> {way[i + 1]:<36} {statistics.median(took):7.1f} µs")
    ends = [sum(step[j] for step in steps) for j in range(len(steps[0]))]
    print(f"  {'first mark to last, median':>75} {statistics.median(ends):7.1f} µs")
    parts: dict[str, float] = {}
    for i, took in enumerate(steps):
        a, b = way[i].split(":")[0], way[i + 1].split(":")[0]
        part = a if a == b else f"{a} -> {b}"
        parts[part] = parts.get(part, 0.0) + statistics.median(took)
    print("  sums of the medians: " + ", ".join(f"{k} {v:.0f} µs" for k, v in parts.items()))
    print(f"ONNX Runtime alone, one row, 600 µs apart: {raw_onnx(w1.model_file):.1f} µs")


if __name__ == "__main__":
    main()
