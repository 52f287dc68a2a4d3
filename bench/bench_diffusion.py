"""W3: diffusion under a bursty 2x overload, premium and free, four ways of serving it.

Runs the digits-diffusion generator in a real runtime (worker process, shared-memory
arena, the engine) in this process and drives it through ``InferenceService.infer``,
the path every transport calls (no HTTP client competing for the 2 CPU cores):

1. capacity: closed loop at 20 steps (64 clients: full 128-row batches), images/s;
2. the same arrivals (seeded) for each row: quiet (0.3x capacity), then 2x capacity with
   bursts (a burst of 0.5 s worth of capacity every 2 s), then quiet again; 25 %
   premium (priority 1, deadline ``--premium-slo``), 75 % free (priority 3, deadline
   ``--free-slo``); every request asks for 20 steps, a digit from 0-9 and its own seed.

Rows: request-level batching (a generation is one unit: new requests wait for the running
cohort), step-level batching (every step a work item; priorities act at each step
boundary, so premium steps go first), + degradation (remaining steps cut to meet the
deadline, floor 4, premium protected), + reuse (approximate: cached state at step 10).

Per row: premium p99 and SLO attainment, free p99, dropped (503/timeout) by class,
goodput (images/s within SLO), mean steps served and agreement (the built-in
classifier labels the image as the asked digit).

Also ``--quality``: agreement at 50/20/10/4/2 steps (200 images each) and a chart.

    python -m bench.bench_diffusion [--seconds 12] [--quality]

With ``--export DIR`` the same rows and arrivals run on a Stable Diffusion export
(bench/diffusion_export.py): prompts from a fixed list of ten, own seeds, ``--steps``
steps; the quality figure is the mean absolute pixel difference of each served image
from the full-step image of the same request.

    python -m bench.bench_diffusion --export DIR [--steps 10] [--seconds 12]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.resources
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from bench.common import console, save
from sordino.config import RuntimeConfig
from sordino.config.iterative import DegradeConfig, IterativeConfig, ReuseConfig
from sordino.errors import SordinoError
from sordino.inference import InferRequest
from sordino.models.repository import ModelSource, builtin_sources
from sordino.protocol.status import http_status
from sordino.server.runtime import Runtime

STEPS = 20
MAX_BATCH = 128  # rows per batch: 64 requests' steps with guidance (two rows each)
PREMIUM, FREE = 1, 3


@dataclass
class Outcome:
    """One request of a row: its class, when it arrived (s after the row's start), its
    latency, HTTP status and what it was served."""

    cls: str
    arrival: float
    latency: float
    status: int
    steps: int = 0
    prompt: int = -1
    """The digit asked for (digits), or the index of the prompt (an export)."""
    seed: int = -1
    label: int = -1
    """The classifier's digit for the image (digits only)."""
    reason: str = ""
    image: np.ndarray | None = None
    """The served image (an export only: its quality is measured after the rows)."""
    reused: int = 0
    """Steps started from a cached state (approximate reuse)."""


@dataclass
class Row:
    name: str
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)


def _classifier() -> Any:
    data = importlib.resources.files("sordino.models.builtin") / "digits-classifier.onnx"
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(data.read_bytes(), options, providers=["CPUExecutionProvider"])


def _label(classifier: Any, image: np.ndarray) -> int:
    small = image.reshape(8, 4, 8, 4).mean(axis=(1, 3)) / 255.0 * 16.0
    (probabilities,) = classifier.run(None, {"pixels": small.reshape(1, 64).astype(np.float32)})
    return int(np.argmax(probabilities))


def _source(iterative: IterativeConfig) -> ModelSource:
    base = next(s for s in builtin_sources() if s.name == "digits-diffusion")
    config = base.config.model_copy(update={"iterative": iterative, "max_batch_size": MAX_BATCH})
    return ModelSource(base.name, base.version, base.path, config, base.description)


def _iterative(kind: str, guidance: float | None = 3.0) -> IterativeConfig:
    """Row ``kind``'s ``iterative:`` (guidance None: the model's own)."""
    guided = {} if guidance is None else {"guidance": guidance}
    no_reuse = ReuseConfig(cache_entries=0, coalesce=False)
    off = DegradeConfig(enabled=False)
    if kind == "request":
        return IterativeConfig(**guided, batching="request", degrade=off, reuse=no_reuse)
    if kind == "step":
        return IterativeConfig(**guided, degrade=off, reuse=no_reuse)
    if kind == "degrade":
        return IterativeConfig(**guided, reuse=no_reuse)
    reuse = ReuseConfig(cache_entries=0, coalesce=False, approximate=True)
    return IterativeConfig(**guided, reuse=reuse)


def _request(digit: int, seed: int, priority: int, slo_s: float) -> InferRequest:
    return InferRequest(
        model="digits-diffusion",
        inputs={
            "prompt": np.array([str(digit).encode()], dtype=object),
            "seed": np.array([seed], dtype=np.int64),
            "steps": np.array([STEPS], dtype=np.int32),
        },
        input_datatypes={"prompt": "BYTES", "seed": "INT64", "steps": "INT32"},
        parameters={"priority": priority, "timeout": int(slo_s * 1e6)},
    )


class Digits:
    """The built-in digits-diffusion generator as W3's workload."""

    model = "digits-diffusion"
    label = "digits-diffusion"
    steps = STEPS
    max_batch = MAX_BATCH
    clients = 64
    slo = (1.0, 2.0)
    warm = False
    quality_columns: tuple[tuple[str, str], ...] = (("agreement", "agreement"),)

    def __init__(self) -> None:
        self._classifier: Any = None

    def sources(self, kind: str) -> list[ModelSource]:
        return [_source(_iterative(kind))]

    async def one(
        self, runtime: Runtime, cls: str, digit: int, seed: int, slo_s: float, t0: float
    ) -> Outcome:
        """One request through ``InferenceService.infer``; an error is an outcome too."""
        if self._classifier is None:
            self._classifier = _classifier()
        priority = PREMIUM if cls == "premium" else FREE
        start = time.perf_counter()
        try:
            response = await runtime.service.infer(_request(digit, seed, priority, slo_s))
        except SordinoError as exc:
            return Outcome(
                cls, start - t0, time.perf_counter() - start, http_status(exc), reason=exc.reason
            )
        latency = time.perf_counter() - start
        try:
            image = np.array(response.outputs["image"])
            steps = int(response.parameters["steps_used"])
        finally:
            response.release()
        label = _label(self._classifier, image)
        return Outcome(cls, start - t0, latency, 200, steps, digit, seed, label)

    async def assess(self, rows: list[Row], data_dir: Path) -> list[dict[str, float]]:
        """Agreement per row: the classifier labels the image as the asked digit."""
        figures = []
        for row in rows:
            served = [o for o in row.outcomes if o.status == 200]
            agree = float(np.mean([o.label == o.prompt for o in served])) if served else 0.0
            figures.append({"agreement": agree})
        return figures


Workload = Any
"""``Digits`` or ``diffusion_export.Export``: ``model``, ``label``, ``steps``, ``max_batch``,
``clients``, ``slo`` (premium, free seconds), ``warm``, ``quality_columns``, ``sources(kind)``,
``one(...)`` and ``assess(rows, data_dir)``."""


def _arrivals(capacity: float, seconds: float, seed: int) -> list[tuple[float, str, int, int]]:
    """(time, class, digit, seed): quiet, 2x with bursts, quiet."""
    rng = np.random.default_rng(seed)
    quiet, peak = 0.3 * capacity, 2.0 * capacity
    phases = [(0.0, 0.2 * seconds, quiet), (0.2 * seconds, 0.85 * seconds, peak),
              (0.85 * seconds, seconds, quiet)]  # fmt: skip
    times: list[float] = []
    for begin, end, rate in phases:
        t = begin
        while True:
            t += rng.exponential(1.0 / rate)
            if t >= end:
                break
            times.append(t)
    burst_at = 0.2 * seconds + 1.0
    while burst_at < 0.85 * seconds:
        times += list(burst_at + rng.uniform(0, 0.05, int(0.5 * capacity)))
        burst_at += 2.0
    times.sort()
    return [
        (t, "premium" if rng.random() < 0.25 else "free", int(rng.integers(0, 10)), i)
        for i, t in enumerate(times)
    ]


async def _with_runtime(workload: Workload, kind: str, data_dir: Path, body: Any) -> Any:
    strategy = {"name": "dynamic_batching", "max_batch": workload.max_batch}
    config = RuntimeConfig.model_validate(
        {"server": {"data_dir": str(data_dir)}, "scheduler": {"strategies": [strategy]}}
    )
    runtime = Runtime(config, workload.sources(kind))
    await runtime.start()
    try:
        return await body(runtime)
    finally:
        await runtime.stop()


async def capacity(workload: Workload, data_dir: Path, seconds: float = 4.0) -> float:
    """Images/s of a closed loop of ``workload.clients`` clients, step-level batching."""

    async def body(runtime: Runtime) -> float:
        if workload.warm:  # a request outside the list: the first run's cost not in a row
            await workload.one(runtime, "free", -1, 10**6, 600.0, 0.0)
        done = 0
        deadline = time.perf_counter() + seconds

        async def client(k: int) -> None:
            nonlocal done
            seed = k * 1000
            while time.perf_counter() < deadline:
                seed += 1
                outcome = await workload.one(runtime, "free", seed % 10, seed, 60.0, 0.0)
                done += outcome.status == 200

        started = time.perf_counter()
        await asyncio.gather(*(client(k) for k in range(workload.clients)))
        return done / (time.perf_counter() - started)

    result: float = await _with_runtime(workload, "step", data_dir, body)
    return result


async def run_row(
    workload: Workload, kind: str, name: str, arrivals: list[tuple[float, str, int, int]],
    slo: dict[str, float], data_dir: Path,
) -> Row:  # fmt: skip
    """The arrivals, open loop, on a fresh runtime serving the model as ``kind``."""

    async def body(runtime: Runtime) -> Row:
        if workload.warm:  # a request outside the list: the first run's cost not in a row
            await workload.one(runtime, "free", -1, 10**6, 600.0, 0.0)
        row = Row(name)
        t0 = time.perf_counter()
        tasks = []
        for at, cls, prompt, seed in arrivals:
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(
                workload.one(runtime, cls, prompt, seed, slo[cls], t0)
            ))  # fmt: skip
        row.outcomes = list(await asyncio.gather(*tasks))
        row.seconds = time.perf_counter() - t0
        pipeline = runtime.get(workload.model).pipeline
        assert pipeline is not None
        degrade = runtime.step_degrader.statistics()
        row.counters = {
            "degraded_requests": degrade.degraded_requests,
            "steps_saved_by_degrading": degrade.steps_saved,
            "ended_at_deadline": degrade.ended_at_deadline,
            "reuse_hits": pipeline.states.hits,
            "reuse_misses": pipeline.states.misses,
            "steps_saved_by_reuse": pipeline.states.steps_saved,
        }
        return row

    result: Row = await _with_runtime(workload, kind, data_dir, body)
    return result


def summarize(row: Row, slo: dict[str, float], span: float) -> dict[str, Any]:
    """Per class figures; goodput over the overload phase (arrivals in it, within SLO)."""
    out: dict[str, Any] = {"row": row.name}
    begin, end = 0.2 * span, 0.85 * span
    good = sum(
        1
        for o in row.outcomes
        if o.status == 200 and o.latency <= slo[o.cls] and begin <= o.arrival < end
    )
    for cls in ("premium", "free"):
        mine = [o for o in row.outcomes if o.cls == cls]
        ok = [o for o in mine if o.status == 200]
        within = [o for o in ok if o.latency <= slo[cls]]
        lat = np.array([o.latency for o in ok]) if ok else np.array([np.nan])
        out[f"{cls}_requests"] = len(mine)
        out[f"{cls}_p99_ms"] = float(np.percentile(lat, 99) * 1000) if ok else float("nan")
        out[f"{cls}_slo_attainment"] = len(within) / len(mine) if mine else float("nan")
        out[f"{cls}_dropped"] = len(mine) - len(ok)
        reasons: dict[str, int] = {}
        for o in mine:
            if o.status != 200:
                reasons[o.reason] = reasons.get(o.reason, 0) + 1
        out[f"{cls}_drop_reasons"] = reasons
    served = [o for o in row.outcomes if o.status == 200]
    out["goodput"] = good / (end - begin)
    out["mean_steps"] = float(np.mean([o.steps for o in served])) if served else 0.0
    out.update(row.counters)
    return out


def show(rows: list[dict[str, Any]], capacity_rate: float, workload: Workload) -> None:
    from rich.table import Table

    title = f"W3 {workload.label}, 2x overload (capacity {capacity_rate:.1f} images/s)"
    table = Table(title=title)
    columns = [("row", "row"), ("premium p99 ms", "premium_p99_ms"),
               ("premium SLO", "premium_slo_attainment"), ("free p99 ms", "free_p99_ms"),
               ("free SLO", "free_slo_attainment"), ("dropped prem/free", None),
               ("goodput img/s", "goodput"), ("mean steps", "mean_steps"),
               *workload.quality_columns]  # fmt: skip
    for title, _ in columns:
        table.add_column(title, justify="left" if title == "row" else "right")
    for r in rows:
        cells = []
        for _, key in columns:
            if key is None:
                cells.append(f"{r['premium_dropped']}/{r['free_dropped']}")
            elif isinstance(r[key], str):
                cells.append(r[key])
            elif key.endswith("slo_attainment") or key == "agreement":
                cells.append(f"{r[key]:.1%}")
            elif key.startswith("mean_abs_diff"):
                cells.append("-" if np.isnan(r[key]) else f"{r[key]:.4f}")
            else:
                cells.append(f"{r[key]:.1f}")
        table.add_row(*cells)
    console.print(table)


ROWS = (("request", "1 request-level"), ("step", "2 step-level"),
        ("degrade", "3 step + preempt + degrade"),
        ("reuse", "4 = 3 + approximate reuse"))  # fmt: skip


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    """Run what ``args`` ask; return the payload (saved under bench/results unless
    ``args.save`` is false)."""
    workload: Workload = Digits()
    if args.export is not None:
        from bench.diffusion_export import Export

        workload = Export(args.export, steps=args.steps or 10, references=args.references)
    elif args.steps is not None or args.references is not None:
        raise SystemExit("--steps and --references are for --export (digits run 20 steps)")
    if args.clients:
        workload.clients = args.clients
    if args.max_batch:
        workload.max_batch = args.max_batch
    name = "diffusion" if args.export is None else "diffusion-export"
    with tempfile.TemporaryDirectory(prefix="sordino-w3-") as scratch:
        data_dir = Path(scratch)
        payload: dict[str, Any] = {}
        if args.quality or args.quality_only:
            if args.export is not None:
                raise SystemExit("--quality is for digits-diffusion; leave out --export")
            from bench.diffusion_quality import chart, quality

            curves = await quality(data_dir)
            payload["quality"] = curves
            chart(curves, Path(args.chart))
            console.print(f"chart: {args.chart}")
            if args.quality_only:
                console.print(f"saved {save('diffusion-quality', payload)}")
                return payload
        rate = args.capacity or await capacity(workload, data_dir, args.capacity_seconds)
        console.print(
            f"capacity: {rate:.1f} images/s at {workload.steps} steps "
            f"(closed loop, {workload.clients} clients)"
        )
        premium_slo = args.premium_slo or workload.slo[0]
        free_slo = args.free_slo or workload.slo[1]
        slo = {"premium": premium_slo, "free": free_slo}
        arrivals = _arrivals(rate, args.seconds, seed=7)
        console.print(f"{len(arrivals)} arrivals over {args.seconds:g} s")
        rows, summaries = [], []
        for kind, title in ROWS:
            row = await run_row(workload, kind, title, arrivals, slo, data_dir)
            rows.append(row)
            summaries.append(summarize(row, slo, args.seconds))
            console.print(f"{title}: done in {row.seconds:.1f} s; {row.counters}")
        for summary, figures in zip(summaries, await workload.assess(rows, data_dir), strict=True):
            summary.update(figures)
        show(summaries, rate, workload)
        payload.update({"model": workload.label, "steps": workload.steps, "capacity": rate,
                        "clients": workload.clients, "max_batch": workload.max_batch,
                        "slo_s": slo, "arrivals": len(arrivals), "seconds": args.seconds,
                        "rows": summaries})  # fmt: skip
        if args.save:
            console.print(f"saved {save(name, payload)}")
        return payload


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="length of each row's run")
    parser.add_argument(
        "--premium-slo", type=float, default=None, help="premium deadline, s (digits 1, export 3)"
    )
    parser.add_argument(
        "--free-slo", type=float, default=None, help="free deadline, s (digits 2, export 6)"
    )
    parser.add_argument("--capacity", type=float, default=None, help="skip measuring it")
    parser.add_argument("--capacity-seconds", type=float, default=4.0, help="its closed loop, s")
    parser.add_argument("--clients", type=int, default=None, help="closed-loop clients")
    parser.add_argument("--max-batch", type=int, default=None, help="denoiser rows per batch")
    parser.add_argument("--quality", action="store_true", help="also the quality curve")
    parser.add_argument("--quality-only", action="store_true", help="only the quality curve")
    parser.add_argument("--chart", default="docs/images/diffusion-quality.png")
    parser.add_argument(
        "--export", type=Path, default=None, help="a Stable Diffusion export folder instead"
    )
    parser.add_argument("--steps", type=int, default=None, help="steps per request (--export: 10)")
    parser.add_argument(
        "--references", type=int, default=None,
        help="full-step references for at most this many served requests (--export; all)",
    )  # fmt: skip
    parser.add_argument("--no-save", dest="save", action="store_false", help="no JSON result")
    return parser


def main() -> None:
    asyncio.run(main_async(parser().parse_args()))


if __name__ == "__main__":
    main()
