"""The scalar inputs of a generation request, checked: each mistake a 400 saying what to fix.

An input a generator does not take is refused by :func:`refuse_unknown`: diffusers'
pipeline arguments sordino does not implement (:data:`NOT_SUPPORTED`: ``clip_skip``, the
SDXL refiner's ``aesthetic_score`` and ``denoising_start``/``denoising_end``, SD3's
per-encoder prompts ...) as :class:`~sordino.errors.Unsupported` saying "not supported"
and why (HTTP 400, gRPC UNIMPLEMENTED), never silently ignored; any other name as a
:class:`~sordino.errors.TensorError` listing the inputs the model takes. A generator
publishes its refusals as ``ModelMetadata.refused`` so that HTTP and gRPC answer them
the same way before the request reaches it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from sordino.errors import InvalidRequest, TensorError, Unsupported
from sordino.inference import Tensor

__all__ = ["NOT_SUPPORTED", "one_float", "one_int", "one_text", "refuse_unknown"]

_PER_ENCODER = (
    "per-encoder prompts are taken by SDXL exports (prompt_2, negative_prompt_2) only: "
    "SD 1.x/2.x has one text encoder, and SD3's encoders all read prompt and negative_prompt"
)
_REFINER = (
    "the SDXL refiner (aesthetic-score conditioning, denoising_start/denoising_end of a "
    "base + refiner ensemble) is not implemented; base SDXL image to image takes image and "
    "strength"
)
NOT_SUPPORTED: dict[str, str] = {
    "prompt_2": _PER_ENCODER,
    "negative_prompt_2": _PER_ENCODER,
    "prompt_3": _PER_ENCODER,
    "negative_prompt_3": _PER_ENCODER,
    "clip_skip": "diffusers' clip_skip (text rows from an earlier CLIP layer) is not "
    "implemented; the text rows are diffusers' default ones",
    "aesthetic_score": _REFINER,
    "negative_aesthetic_score": _REFINER,
    "denoising_start": _REFINER,
    "denoising_end": _REFINER,
    "negative_original_size": "negative micro-conditioning is not implemented; the negative "
    "rows take original_size, crops_coords_top_left and target_size as the prompt's do",
    "negative_crops_coords_top_left": "negative micro-conditioning is not implemented; the "
    "negative rows take crops_coords_top_left as the prompt's do",
    "negative_target_size": "negative micro-conditioning is not implemented; the negative "
    "rows take target_size as the prompt's do",
    "guidance_rescale": "guidance_rescale is not implemented (diffusers' default 0.0 applies)",
    "eta": "eta is not implemented (DDIM runs with diffusers' default eta 0.0)",
    "timesteps": "custom timesteps are not implemented; the scheduler's schedule for steps runs",
    "sigmas": "custom sigmas are not implemented; the scheduler's schedule for steps runs",
    "max_sequence_length": "SD3's T5 max_sequence_length is diffusers' default, 256",
    "prompt_embeds": "precomputed text embeddings are not implemented; send the prompt",
    "negative_prompt_embeds": "precomputed text embeddings are not implemented; send the "
    "negative_prompt",
    "mask_image": "inpainting is not implemented",
    "skip_guidance_layers": "SD3's skip-layer guidance is not implemented",
    "skip_layer_guidance_scale": "SD3's skip-layer guidance is not implemented",
    "ip_adapter_image": "IP-Adapter images are not implemented",
}
"""diffusers' pipeline arguments a served export does not take, and why."""


def refuse_unknown(model: str, unknown: Iterable[str], taken: Iterable[str]) -> None:
    """Raise for the first of ``unknown`` (sorted), if any, inputs model ``model`` does not
    take (``taken``): :class:`Unsupported` for a diffusers argument in :data:`NOT_SUPPORTED`,
    else :class:`TensorError`. (Over HTTP and gRPC the protocol layer refuses them first,
    from the model's ``metadata.refused``: this is for a request built in-process.)"""
    names = sorted(unknown)
    if not names:
        return
    key = names[0]
    listed = ", ".join(taken)
    if key in NOT_SUPPORTED:
        raise Unsupported(
            f"model {model!r} has no input {key!r}: not supported: {NOT_SUPPORTED[key]} "
            f"(it takes inputs {listed})"
        )
    raise TensorError(f"model {model!r} takes inputs {listed}; it has no input {key!r}")


_INT_TYPES = ("INT64", "INT32", "INT16", "INT8", "UINT64", "UINT32", "UINT16", "UINT8")


def _one(array: Tensor, name: str) -> Any:
    values = np.asarray(array).reshape(-1)
    if values.size != 1:
        raise TensorError(f"input {name!r} takes one value, got {values.size}")
    return values[0]


def one_text(array: Tensor) -> str:
    value = _one(array, "prompt")
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise TensorError("input 'prompt' is not valid UTF-8 text") from None
    if not isinstance(value, str):
        raise TensorError(f"input 'prompt' must be text (BYTES), got {np.asarray(array).dtype}")
    if not value.strip():
        raise InvalidRequest("the prompt is empty; say which digit to draw, e.g. 'a handwritten 7'")
    return value


def one_int(array: Tensor, name: str, datatype: str | None, low: int, high: int) -> int:
    kind = np.asarray(array).dtype.kind
    if (datatype is not None and datatype not in _INT_TYPES) or kind not in "iu":
        shown = datatype or str(np.asarray(array).dtype)
        raise TensorError(f"input {name!r} must be an integer (INT64 or INT32), got {shown}")
    value = int(_one(array, name))
    if not low <= value <= high:
        if name == "steps":
            raise InvalidRequest(
                f"steps must be between {low} and {high} for this model, got {value}"
            )
        raise InvalidRequest(f"{name} must be between {low} and {high}, got {value}")
    return value


def one_float(array: Tensor, name: str, low: float, high: float) -> float:
    if np.asarray(array).dtype.kind not in "fiu":
        raise TensorError(f"input {name!r} must be a number (FP32), got {np.asarray(array).dtype}")
    value = float(_one(array, name))
    if not (low <= value <= high) or math.isnan(value):
        raise InvalidRequest(f"{name} must be between {low:g} and {high:g}, got {value:g}")
    return value
