"""Step caching (``iterative.step_cache``) on digits-diffusion: speed and image difference.

Runs the digits-diffusion generator in a real runtime (worker process, shared-memory
arena, the engine), driven in-process through ``InferenceService.infer`` as
``bench_diffusion`` does, once per row: the cache off, then on at two settings. Every
row answers the same seeded requests (digit ``i % 10``, seed ``i``, 20 DDIM steps,
guidance 3), first one at a time (latency), then from ``--clients`` closed-loop clients
(throughput); the rows alternate for ``--rounds`` rounds. Per row: denoiser calls per
image, mean latency and images/s (medians of the rounds) with their ratios to the cache
off, and against the uncached image of the same request: max and mean absolute pixel
difference, PSNR, and agreement (the built-in classifier labels the image as the asked
digit).

    python -m bench.bench_step_cache [--requests 200] [--single 40] [--clients 32] [--rounds 3]

With ``--export DIR`` the model is a Stable Diffusion (SDXL, SD3) export served the
same way (``sordino start --model sd=DIR``): prompt ``"a poster, number i"``, seed
``i``, 20 steps of the export's scheduler, its default guidance and size; the
agreement column is left out (no classifier reads a poster).

    python -m bench.bench_step_cache --export tests/fixtures/sd/tiny-sd --requests 40
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from bench.bench_diffusion import FREE, _classifier, _label, _request, _source
from bench.common import console, save
from sordino.config import ModelConfig, RuntimeConfig
from sordino.config.iterative import IterativeConfig, ReuseConfig, StepCacheConfig
from sordino.inference import InferRequest
from sordino.models.repository import ModelSource, sources_for
from sordino.server.runtime import Runtime

ROWS: tuple[tuple[str, StepCacheConfig], ...] = (
    ("off", StepCacheConfig()),  # rows: threshold / max_skips
    ("on, 0.1 / 2 (default)", StepCacheConfig(enabled=True)),
    ("on, 0.2 / 3", StepCacheConfig(enabled=True, threshold=0.2, max_skips=3)),
)


EXPORT_NAME = "sd"


def _export_request(index: int) -> InferRequest:
    return InferRequest(
        model=EXPORT_NAME,
        inputs={
            "prompt": np.array([f"a poster, number {index}".encode()], dtype=object),
            "seed": np.array([index], dtype=np.int64),
            "steps": np.array([20], dtype=np.int32),
        },
        input_datatypes={"prompt": "BYTES", "seed": "INT64", "steps": "INT32"},
        parameters={"priority": FREE, "timeout": 600_000_000},
    )


def _sources(iterative: IterativeConfig, export: Path | None) -> list[ModelSource]:
    if export is None:
        return [_source(iterative)]
    config = ModelConfig(name=EXPORT_NAME, path=export, max_batch_size=64, iterative=iterative)
    return sources_for(config)


async def _answer(
    runtime: Runtime, index: int, export: Path | None = None
) -> tuple[np.ndarray, int]:
    request = _request(index % 10, index, FREE, 600.0) if export is None else _export_request(index)
    response = await runtime.service.infer(request)
    try:
        return np.array(response.outputs["image"]), int(response.parameters["cached_steps"])
    finally:
        response.release()


async def run_row(
    cache: StepCacheConfig,
    requests: int,
    single: int,
    clients: int,
    data_dir: Path,
    export: Path | None = None,
) -> dict[str, Any]:
    reuse = ReuseConfig(cache_entries=0, coalesce=False)
    iterative = (
        IterativeConfig(guidance=3.0, reuse=reuse, step_cache=cache)
        if export is None
        else IterativeConfig(reuse=reuse, step_cache=cache)
    )
    strategy = {"name": "dynamic_batching", "max_batch": 128}
    config = RuntimeConfig.model_validate(
        {"server": {"data_dir": str(data_dir)}, "scheduler": {"strategies": [strategy]}}
    )
    runtime = Runtime(config, _sources(iterative, export))
    await runtime.start()
    try:
        await _answer(runtime, 10**6, export)  # warm the worker
        pipeline = runtime.registry.get(EXPORT_NAME if export else "digits-diffusion").pipeline
        assert pipeline is not None
        before = pipeline.step_cache.statistics()
        started = time.perf_counter()
        for index in range(single):
            await _answer(runtime, index, export)
        latency = (time.perf_counter() - started) / single
        images: dict[int, np.ndarray] = {}
        cached = 0
        queue = list(range(requests))

        async def client() -> None:
            nonlocal cached
            while queue:
                index = queue.pop()
                images[index], skipped = await _answer(runtime, index, export)
                cached += skipped

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        rate = requests / (time.perf_counter() - started)
        after = pipeline.step_cache.statistics()
    finally:
        await runtime.stop()
    calls = (after.computed - before.computed) / (single + requests)
    return {
        "latency_s": latency,
        "images_per_s": rate,
        "cached_steps": cached,
        "calls_per_image": calls,
        "images": images,
    }


def _compare(base: dict[int, np.ndarray], images: dict[int, np.ndarray]) -> dict[str, float]:
    diffs = [np.abs(images[i].astype(np.int16) - base[i].astype(np.int16)) for i in base]
    mse = float(np.mean([np.mean(d.astype(np.float64) ** 2) for d in diffs]))
    return {
        "max_abs_diff": float(max(d.max() for d in diffs)),
        "mean_abs_diff": float(np.mean([d.mean() for d in diffs])),
        "psnr_db": float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse),
    }


async def main_async(args: argparse.Namespace) -> None:
    classifier = None if args.export else _classifier()
    results: list[dict[str, Any]] = [{"row": name, "latency": [], "rate": []} for name, _ in ROWS]
    with tempfile.TemporaryDirectory(prefix="sordino-step-cache-") as scratch:
        for round_ in range(args.rounds):  # rows interleaved: a shared machine's drift hits all
            for (name, cache), row in zip(ROWS, results, strict=True):
                got = await run_row(
                    cache, args.requests, args.single, args.clients, Path(scratch), args.export
                )
                row["latency"].append(got["latency_s"])
                row["rate"].append(got["images_per_s"])
                row["cached_steps"], row["images"] = got["cached_steps"], got["images"]
                row["calls_per_image"] = got["calls_per_image"]
                console.print(f"round {round_ + 1}, {name}: {got['images_per_s']:.1f} images/s")
    for row in results:
        row["latency_s"] = float(np.median(row.pop("latency")))
        row["images_per_s"] = float(np.median(row.pop("rate")))
    base = results[0]
    model = f"export {args.export}" if args.export else "digits-diffusion"
    table = Table(title=f"step cache, {model}, 20 steps, {args.requests} images")
    for column in ("row", "calls/image", "latency ms", "x off", "images/s", "x off",
                   "max |diff|", "mean |diff|", "PSNR dB", "agreement"):  # fmt: skip
        table.add_column(column)
    payload_rows = []
    uncached = base["images"]
    for row in results:
        images = row.pop("images")
        quality = _compare(uncached, images)
        agreement = (
            float("nan")
            if args.export
            else float(np.mean([_label(classifier, images[i]) == i % 10 for i in images]))
        )
        calls = row["calls_per_image"]
        figures = {**row, **quality, "agreement": agreement, "calls_per_image": calls,
                   "latency_ratio": row["latency_s"] / base["latency_s"],
                   "rate_ratio": row["images_per_s"] / base["images_per_s"]}  # fmt: skip
        payload_rows.append(figures)
        table.add_row(
            row["row"], f"{calls:.1f}", f"{row['latency_s'] * 1000:.1f}",
            f"{figures['latency_ratio']:.2f}", f"{row['images_per_s']:.1f}",
            f"{figures['rate_ratio']:.2f}", f"{quality['max_abs_diff']:.0f}",
            f"{quality['mean_abs_diff']:.2f}", f"{quality['psnr_db']:.1f}", f"{agreement:.3f}",
        )  # fmt: skip
    console.print(table)
    payload = {"requests": args.requests, "single": args.single, "clients": args.clients,
               "rounds": args.rounds, "export": str(args.export or ""),
               "rows": payload_rows}  # fmt: skip
    console.print(f"saved {save('step-cache-export' if args.export else 'step-cache', payload)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="images per row (clients)")
    parser.add_argument("--single", type=int, default=40, help="images one at a time")
    parser.add_argument("--clients", type=int, default=32, help="closed-loop clients")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (medians are shown)")
    parser.add_argument(
        "--export", type=Path, default=None, help="a Stable Diffusion export folder instead"
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
