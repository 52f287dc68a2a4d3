"""A Stable Diffusion request's inputs, and what an export's folder says about them.

:class:`SDParams` is a checked text-to-image (or image-to-image) request of a served
Stable Diffusion export (stable_diffusion.py parses it; SDXL's adds its own fields).
The limits every SD pipeline checks against (:data:`INPUTS`, :data:`MAX_IMAGES`,
:data:`MAX_SIDE`) live here, beside the reads of the export's JSON files that set the
rest: :func:`size_multiple` (the image sides the UNet takes) and :func:`export_json`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from sordino.errors import ModelLoadError
from sordino.generation.pipeline import GenerateParams

__all__ = [
    "INPUTS",
    "MAX_IMAGES",
    "MAX_SIDE",
    "SDParams",
    "export_json",
    "nearest_multiple",
    "size_multiple",
]

INPUTS = (
    "prompt",
    "negative_prompt",
    "seed",
    "steps",
    "guidance",
    "width",
    "height",
    "num_images",
    "latents",
    "image",
    "strength",
)
"""The inputs an SD 1.x/2.x (and SD3) request may carry."""
MAX_IMAGES = 8
MAX_SIDE = 2048


@dataclass(frozen=True, slots=True)
class SDParams(GenerateParams):
    """A checked text-to-image request."""

    negative_prompt: str
    width: int
    height: int
    num_images: int
    latents: npt.NDArray[np.float32] | None
    image: npt.NDArray[np.uint8] | None = None
    """Image to image: the RGB pixels [H, W, 3] (H and W are ``height`` and ``width``)."""
    strength: float = 1.0
    encoded: npt.NDArray[np.float32] | None = None
    """Image to image: the image's latents (scaled), set once the VAE encoder ran."""


def size_multiple(export: Path) -> int:
    """The multiple of pixels an image side must be for the export's UNet.

    The VAE makes a latent pixel of 8x8 image pixels; each UNet down block after the
    first halves the latents, and the up blocks concatenate their skip connections, so
    a latent side the halvings leave odd fails inside the graph (ONNX Runtime's Concat
    error). 8 x 2^(blocks - 1): 64 for SD 1.x/2.x (four blocks), 32 for SDXL (three).
    """
    blocks = export_json(export / "unet" / "config.json").get("block_out_channels") or [0] * 4
    return int(8 * 2 ** (max(len(blocks), 1) - 1))


def nearest_multiple(side: int, multiple: int) -> int:
    """The multiple nearest ``side`` (at least one multiple)."""
    return max(multiple, round(side / multiple) * multiple)


def export_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` of an export; ``{}`` where the file is absent (the
    defaults apply) or holds no object. A file that is there but cannot be read or
    parsed raises :class:`ModelLoadError` naming it: defaults in its place would give
    other images than the export's own pipeline."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path} of the export: {exc}") from None
    return value if isinstance(value, dict) else {}
