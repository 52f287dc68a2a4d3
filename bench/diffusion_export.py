"""W3 on a Stable Diffusion export: the workload ``bench_diffusion --export DIR`` runs.

The export (``tools/make_tiny_sd_export.py``; any SD 1.x/2.x, SDXL or SD3 export) is
served as model ``sd`` by the same real runtime W3 uses for digits-diffusion (worker
processes, the shared-memory arena, the engine), its ``iterative:`` set per row as for
digits (request-level batching, step-level, + degradation, + approximate reuse), the
export's own scheduler, guidance and size. A request is one of ten fixed prompts (the
arrival's index 0-9), its own seed and ``steps`` steps, through
``InferenceService.infer``.

Quality: after the rows, the full-step image of each served request (the same prompt,
seed and steps on a step-level runtime without degradation or reuse, nothing else
running against the clock: a closed loop with no deadline) is generated once, and each
row's served images are compared with it: mean absolute pixel difference (pixels in
[0, 1]) over the served requests, and over those served degraded or from a cached
state. An undegraded, unreused image equals its reference to within float rounding of
a different batch (diffusers' image for the same latents, tests/generation).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np

from bench.bench_diffusion import FREE, PREMIUM, Outcome, Row, _iterative, _with_runtime
from bench.common import console
from sordino.config import ModelConfig
from sordino.errors import SordinoError
from sordino.inference import InferRequest
from sordino.models.repository import ModelSource, sources_for
from sordino.protocol.status import http_status
from sordino.server.runtime import Runtime

__all__ = ["PROMPTS", "Export"]

PROMPTS = (
    "a red house at night",
    "a poster of a jazz festival",
    "a bowl of fruit on a wooden table",
    "a lighthouse in a storm",
    "a cat wearing a hat",
    "a mountain lake at sunrise",
    "a city street in the rain",
    "a robot reading a book",
    "a field of sunflowers",
    "an astronaut riding a horse",
)
WARM_PROMPT = "a warm-up request"
"""The prompt of a runtime's first request: not in the list, so it seeds no cached state."""


class Export:
    """A Stable Diffusion export as W3's workload (see ``bench_diffusion.Digits``)."""

    model = "sd"
    max_batch = 16  # denoiser rows per call: 8 guided requests' steps
    clients = 8  # capacity's closed loop: full batches, as digits' 64 clients fill 128 rows
    slo = (3.0, 6.0)
    warm = True
    quality_columns: tuple[tuple[str, str], ...] = (
        ("mean |d| served", "mean_abs_diff"),
        ("mean |d| cut/reused", "mean_abs_diff_changed"),
    )

    def __init__(self, path: Path, *, steps: int = 10, references: int | None = None) -> None:
        """``references``: full-step references for at most this many served requests (a
        seeded sample); None: all of them."""
        if not path.is_dir():
            raise SystemExit(f"--export {path}: not a folder")
        self.path = path
        self.steps = steps
        self.references = references
        self.label = f"export {path.name}, {steps} steps"

    def sources(self, kind: str) -> list[ModelSource]:
        """The export as model ``sd`` with row ``kind``'s ``iterative:`` (its own guidance)."""
        config = ModelConfig(
            name=self.model,
            path=self.path,
            max_batch_size=self.max_batch,
            iterative=_iterative(kind, guidance=None),
        )
        return sources_for(config)

    def request(self, prompt: int, seed: int, priority: int, slo_s: float) -> InferRequest:
        text = WARM_PROMPT if prompt < 0 else PROMPTS[prompt % len(PROMPTS)]
        return InferRequest(
            model=self.model,
            inputs={
                "prompt": np.array([text.encode()], dtype=object),
                "seed": np.array([seed], dtype=np.int64),
                "steps": np.array([self.steps], dtype=np.int32),
            },
            input_datatypes={"prompt": "BYTES", "seed": "INT64", "steps": "INT32"},
            parameters={"priority": priority, "timeout": int(slo_s * 1e6)},
        )

    async def one(
        self, runtime: Runtime, cls: str, prompt: int, seed: int, slo_s: float, t0: float
    ) -> Outcome:
        """One request through ``InferenceService.infer``; an error is an outcome too."""
        priority = PREMIUM if cls == "premium" else FREE
        start = time.perf_counter()
        try:
            response = await runtime.service.infer(self.request(prompt, seed, priority, slo_s))
        except SordinoError as exc:
            latency = time.perf_counter() - start
            return Outcome(cls, start - t0, latency, http_status(exc), 0, prompt, seed,
                           reason=exc.reason)  # fmt: skip
        latency = time.perf_counter() - start
        try:
            image = np.array(response.outputs["image"], dtype=np.uint8)
            steps = int(response.parameters["steps_used"])
            reused = int(response.parameters.get("reused_steps", 0))
        finally:
            response.release()
        return Outcome(cls, start - t0, latency, 200, steps, prompt, seed, image=image,
                       reused=reused)  # fmt: skip

    async def full_step_images(
        self, wanted: list[tuple[int, int]], data_dir: Path
    ) -> dict[tuple[int, int], np.ndarray]:
        """The full-step image of each (prompt, seed): a step-level runtime without
        degradation or reuse, ``clients`` closed-loop clients, no deadline."""

        async def body(runtime: Runtime) -> dict[tuple[int, int], np.ndarray]:
            images: dict[tuple[int, int], np.ndarray] = {}
            queue = list(wanted)

            async def client() -> None:
                while queue:
                    prompt, seed = queue.pop()
                    outcome = await self.one(runtime, "free", prompt, seed, 600.0, 0.0)
                    if outcome.status != 200 or outcome.image is None:
                        raise RuntimeError(f"reference {prompt}/{seed}: {outcome.reason}")
                    if outcome.steps != self.steps:
                        raise RuntimeError(f"reference {prompt}/{seed}: {outcome.steps} steps")
                    images[prompt, seed] = outcome.image

            await asyncio.gather(*(client() for _ in range(self.clients)))
            return images

        result: dict[tuple[int, int], np.ndarray] = await _with_runtime(
            self, "step", data_dir, body
        )
        return result

    async def assess(self, rows: list[Row], data_dir: Path) -> list[dict[str, float]]:
        """Per row, the mean absolute pixel difference ([0, 1] pixels) of its served images
        from the full-step images of the same requests: over all served, and over those
        served with fewer steps or from a cached state; and how many were compared."""
        served = sorted({(o.prompt, o.seed) for r in rows for o in r.outcomes if o.status == 200})
        if self.references is not None and len(served) > self.references:
            rng = np.random.default_rng(0)
            picked = rng.choice(len(served), self.references, replace=False)
            served = sorted(served[i] for i in picked)
        started = time.perf_counter()
        references = await self.full_step_images(served, data_dir)
        elapsed = time.perf_counter() - started
        console.print(f"{len(references)} full-step references in {elapsed:.1f} s")
        figures = []
        for row in rows:
            all_diffs, changed = [], []
            for o in row.outcomes:
                reference = references.get((o.prompt, o.seed))
                if o.status != 200 or o.image is None or reference is None:
                    continue
                diff = float(np.mean(np.abs(o.image.astype(np.int16) - reference) / 255.0))
                all_diffs.append(diff)
                if o.steps < self.steps or o.reused:
                    changed.append(diff)
            figures.append({
                "mean_abs_diff": float(np.mean(all_diffs)) if all_diffs else float("nan"),
                "mean_abs_diff_changed": float(np.mean(changed)) if changed else float("nan"),
                "compared": float(len(all_diffs)),
                "compared_changed": float(len(changed)),
                "mean_reused_steps": float(np.mean([o.reused for o in row.outcomes
                                                    if o.status == 200] or [0])),
            })  # fmt: skip
        return figures
