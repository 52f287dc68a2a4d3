"""Image to image for a Stable Diffusion export: the input image, checked, and its latents.

As diffusers' ``StableDiffusionImg2ImgPipeline`` (0.35) does it:

- :func:`read_image` turns the request's ``image`` (one BYTES value: a PNG or any image
  Pillow reads, as bytes or base64 — a ``data:`` URL too — or raw RGB bytes, row-major
  [H, W, 3], when ``width`` and ``height`` say the size) into RGB pixels, refusing
  anything else with a message that says what to send; the size must be a multiple of 8
  (diffusers would silently resize it down);
- :func:`pixels_to_sample` is ``VaeImageProcessor.preprocess``: [N, 3, H, W] in [-1, 1];
- :func:`sample_latents` is ``retrieve_latents(vae.encode(image), generator)`` with the
  ONNX encoder's ``latent_parameters`` (mean and log-variance): ``mean + std * noise``,
  then times the VAE's scaling factor. The noise is numpy's ``default_rng([2, seed])``
  (the per-step noise of Euler ancestral and LCM is ``[1, seed]``, the initial noise
  ``seed`` itself or the request's ``latents``), so tools/make_sd_references.py can give
  diffusers the same draws and compare.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

import numpy as np
import numpy.typing as npt

from sordino.errors import InvalidRequest, TensorError
from sordino.inference import Tensor

__all__ = ["ImageInput", "pixels_to_sample", "read_image", "sample_latents"]

# Magic numbers of the formats Pillow reads that a user would send.
_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF8", b"RIFF", b"BM", b"II*\x00", b"MM\x00*")
ImageInput = npt.NDArray[np.uint8]
"""RGB pixels, [H, W, 3]."""


def read_image(
    array: Tensor, *, width: int | None, height: int | None, max_side: int
) -> ImageInput:
    """The RGB pixels of the request's ``image`` input; a 400 that says what to fix."""
    values = np.asarray(array).reshape(-1)
    if values.size != 1:
        raise TensorError(f"input 'image' takes one image (BYTES), got {values.size} values")
    data = values[0]
    if isinstance(data, str):
        data = data.encode("utf-8")
    if not isinstance(data, bytes):
        raise TensorError("input 'image' must be BYTES: a PNG, base64 of one, or raw RGB bytes")
    pixels = _decode(data, width, height, max_side)
    if pixels is None and not data.startswith(_MAGIC):
        decoded = _base64(data)
        if decoded is not None:
            pixels = _decode(decoded, width, height, max_side)
    if pixels is None:
        size = f"{width} x {height} x 3 = {width * height * 3}" if width and height else ""
        raise InvalidRequest(
            f"input 'image' ({len(data)} bytes) is not an image: send a PNG (or JPEG, WebP) "
            "as bytes or base64, or raw RGB bytes (row-major, 3 per pixel) with width and "
            "height" + (f" ({size} bytes)" if size else "")
        )
    h, w = pixels.shape[:2]
    if w % 8 or h % 8:
        raise InvalidRequest(
            f"the image is {w}x{h}; image to image needs a width and height that are "
            f"multiples of 8 (e.g. {w - w % 8 or 8}x{h - h % 8 or 8}): crop or resize it"
        )
    if (width is not None and width != w) or (height is not None and height != h):
        raise InvalidRequest(
            f"the image is {w}x{h} but width/height ask for {width or w}x{height or h}; "
            "image to image answers at the image's size: leave width and height out or "
            "resize the image"
        )
    return pixels


def _base64(data: bytes) -> bytes | None:
    if data.startswith(b"data:"):
        data = data.partition(b",")[2]
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def _decode(data: bytes, width: int | None, height: int | None, max_side: int) -> ImageInput | None:
    if data.startswith(_MAGIC):
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(data)) as image:
                w, h = image.size
                if max(w, h) > max_side:
                    raise InvalidRequest(
                        f"the image is {w}x{h}; at most {max_side} pixels a side is accepted"
                    )
                return np.asarray(image.convert("RGB"), dtype=np.uint8)
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
            raise InvalidRequest(
                f"input 'image' looks like an image file but cannot be read ({len(data)} "
                "bytes): send a complete PNG or JPEG"
            ) from None
    if width and height and len(data) == width * height * 3:
        return np.frombuffer(data, dtype=np.uint8).reshape(height, width, 3).copy()
    return None


def pixels_to_sample(pixels: ImageInput) -> npt.NDArray[np.float32]:
    """``VaeImageProcessor.preprocess``: [1, 3, H, W] float32 in [-1, 1]."""
    values = pixels.astype(np.float32) / np.float32(255.0)
    return np.ascontiguousarray((values * 2.0 - 1.0).transpose(2, 0, 1)[None], dtype=np.float32)


def sample_latents(
    parameters: npt.NDArray[Any], seed: int, scaling_factor: float
) -> npt.NDArray[np.float32]:
    """``scaling_factor * latent_dist.sample()`` of the encoder's mean and log-variance."""
    values = np.asarray(parameters, dtype=np.float32)
    mean, logvar = np.split(values, 2, axis=1)
    std = np.exp(np.float32(0.5) * np.clip(logvar, -30.0, 20.0)).astype(np.float32)
    noise = np.random.default_rng([2, seed]).standard_normal(mean.shape).astype(np.float32)
    return np.asarray(np.float32(scaling_factor) * (mean + std * noise), dtype=np.float32)
