"""From a generated 8x8 sample to what a client sees: a 32x32 grey image and its PNG."""

from __future__ import annotations

import io

import numpy as np
import numpy.typing as npt

__all__ = ["classifier_pixels", "png_bytes", "to_image"]

SIDE = 8
SCALE = 4


def to_image(sample: npt.NDArray[np.float32], side: int = SIDE) -> npt.NDArray[np.uint8]:
    """A square sample of values in [-1, 1] as a UINT8 image 4x as wide (8x8 -> 32x32)."""
    values = np.asarray(sample, dtype=np.float64).reshape(side, side)
    pixels = np.clip((values + 1.0) / 2.0, 0, 1)
    big = np.kron(pixels, np.ones((SCALE, SCALE)))
    return np.asarray(np.round(big * 255.0), dtype=np.uint8)


def classifier_pixels(samples: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Samples [N, 64] in [-1, 1] on the digits classifier's 0-16 pixel scale."""
    return np.asarray((np.clip(samples, -1.0, 1.0) + 1.0) * 8.0, dtype=np.float32)


def png_bytes(image: npt.NDArray[np.uint8]) -> bytes:
    """A PNG of ``image``: greyscale [H, W] or RGB [H, W, 3] (deterministic: no
    timestamps or text chunks)."""
    from PIL import Image

    buffer = io.BytesIO()
    pixels = np.ascontiguousarray(image)
    Image.fromarray(pixels, mode="RGB" if pixels.ndim == 3 else "L").save(
        buffer, format="PNG", optimize=False
    )
    return buffer.getvalue()
