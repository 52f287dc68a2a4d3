"""What the tests of served Stable Diffusion exports share: the models a fixture export
serves (one per scheduler), a request built from a plain body, and one generation run
straight through a pipeline (no HTTP), so a test can compare its latents."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import aclosing, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from sordino.config import ModelConfig
from sordino.config.iterative import IterativeConfig
from sordino.generation.reuse import Generated
from sordino.generation.stable_diffusion import StableDiffusion
from sordino.inference import InferRequest
from sordino.models.repository import ModelSource, sources_for
from sordino.testing import RunningServer, serve_in_thread

__all__ = [
    "DTYPES",
    "TYPES",
    "generate_one",
    "model_for",
    "pipeline_of",
    "scheduler_sources",
    "sd_request",
    "serve_exports",
]

Schedulers = dict[str, tuple[str | None, dict[str, Any]]]
"""Model suffix -> (scheduler class, or None for the export's own; its options)."""

P = TypeVar("P", bound=StableDiffusion)

TYPES = {
    "prompt": "BYTES",
    "negative_prompt": "BYTES",
    "image": "BYTES",
    "width": "INT32",
    "height": "INT32",
    "steps": "INT32",
    "num_images": "INT32",
    "seed": "INT64",
    "guidance": "FP32",
    "strength": "FP32",
    "latents": "FP32",
}
"""The KServe datatype of each input an export's generator takes."""

DTYPES = {"BYTES": np.object_, "INT32": np.int32, "INT64": np.int64, "FP32": np.float32}


@contextmanager
def serve_exports(
    exports: dict[str, Path], scheduler: str | None = None
) -> Iterator[RunningServer]:
    """A server in this process serving each export as its key (thread instances), with no
    result cache or coalescing, so that every request computes its own image."""
    sources = []
    for name, export in exports.items():
        config = ModelConfig(
            name=name,
            path=export,
            isolation="thread",
            iterative=IterativeConfig(
                scheduler=scheduler, reuse={"cache_entries": 0, "coalesce": False}
            ),
        )
        sources.extend(sources_for(config))
    with serve_in_thread(sources=sources) as running:
        yield running


def scheduler_sources(
    prefix: str, export: Path, schedulers: Schedulers, guidance: float | None = None
) -> list[ModelSource]:
    """The export served once per scheduler, as ``PREFIX-SUFFIX`` (thread instances)."""
    sources = []
    for suffix, (kind, options) in schedulers.items():
        settings: dict[str, Any] = {"scheduler": kind, "scheduler_options": options}
        if guidance is not None:
            settings["guidance"] = guidance
        config = ModelConfig(
            name=f"{prefix}-{suffix}",
            path=export,
            isolation="thread",
            iterative=IterativeConfig(**settings),
        )
        sources.extend(sources_for(config))
    return sources


def model_for(
    case: dict[str, Any], prefix: str, schedulers: Schedulers, default: str | None = None
) -> str:
    """The served model whose scheduler is the reference case's (``default``: the
    export's own scheduler class)."""
    for suffix, (kind, options) in schedulers.items():
        if (kind or default) == case["scheduler"] and options == case["options"]:
            return f"{prefix}-{suffix}"
    raise AssertionError(f"no model serves {case['name']}")


def sd_request(model: str, body: dict[str, Any], tenant: str | None = None) -> InferRequest:
    """``body``'s values as one-element tensors (texts and bytes as BYTES, floats FP32,
    other numbers INT64; arrays as they are)."""
    inputs: dict[str, Any] = {}
    for key, value in body.items():
        if isinstance(value, str | bytes):
            data = value if isinstance(value, bytes) else value.encode()
            inputs[key] = np.array([data], dtype=object)
        elif isinstance(value, float):
            inputs[key] = np.array([value], dtype=np.float32)
        elif isinstance(value, np.ndarray):
            inputs[key] = value
        else:
            inputs[key] = np.array([value], dtype=np.int64)
    parameters = {"tenant": tenant} if tenant is not None else {}
    return InferRequest(model=model, inputs=inputs, parameters=parameters)


async def generate_one(
    pipeline: StableDiffusion, model: str, body: dict[str, Any], tenant: str | None = None
) -> Generated:
    """One request through ``pipeline`` (its denoiser batches shared with whatever else
    runs); the final result."""
    params = pipeline.parse(sd_request(model, body, tenant))
    running = pipeline.run(params, priority=2, timeout_s=None, request_id=None, progress=False)
    async with aclosing(running) as answers:
        async for answer in answers:
            if isinstance(answer, tuple):
                return answer[0]
    raise AssertionError("no image")


def pipeline_of(server: RunningServer, model: str, kind: type[P]) -> P:
    """The generator ``model`` is served by, checked to be a ``kind``."""
    pipeline = server.runtime.registry.get(model).pipeline
    assert isinstance(pipeline, kind)
    return pipeline
