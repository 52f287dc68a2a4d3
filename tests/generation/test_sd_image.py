"""The image of an image-to-image request: every form it may come in, and the mistakes."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from sordino.errors import InvalidRequest
from sordino.generation.sd_image import pixels_to_sample, read_image, sample_latents

PIXELS = np.random.default_rng(0).integers(0, 256, (16, 24, 3), dtype=np.uint8)


def _file(image_format: str, pixels: np.ndarray = PIXELS) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=image_format)
    return buffer.getvalue()


def _read(value: bytes | str, width: int | None = None, height: int | None = None) -> np.ndarray:
    return read_image(np.array([value], dtype=object), width=width, height=height, max_side=64)


def test_png_bytes_base64_data_url_and_raw_rgb_give_the_same_pixels() -> None:
    png = _file("PNG")
    encoded = base64.b64encode(png).decode()
    raw = base64.b64encode(PIXELS.tobytes())
    for value in (png, encoded, "data:image/png;base64," + encoded):
        np.testing.assert_array_equal(_read(value), PIXELS)
    np.testing.assert_array_equal(_read(PIXELS.tobytes(), 24, 16), PIXELS)
    np.testing.assert_array_equal(_read(raw, 24, 16), PIXELS)


def test_other_formats_are_read_as_rgb() -> None:
    grey = np.full((8, 8), 77, dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(grey, mode="L").save(buffer, format="JPEG", quality=100)
    pixels = _read(buffer.getvalue())
    assert pixels.shape == (8, 8, 3) and abs(int(pixels.mean()) - 77) <= 1


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (b"hello", "input 'image' (5 bytes) is not an image"),
        (PIXELS.tobytes(), "raw RGB bytes (row-major, 3 per pixel) with width and height"),
        (_file("PNG")[:40], "looks like an image file but cannot be read"),
        (_file("PNG", np.zeros((72, 8, 3), np.uint8)), "at most 64 pixels a side"),
        (_file("PNG", np.zeros((12, 8, 3), np.uint8)), "the image is 8x12; image to image"),
    ],
)
def test_what_is_not_a_usable_image_is_named(value: bytes, says: str) -> None:
    with pytest.raises(InvalidRequest, match=says.replace("(", r"\(").replace(")", r"\)")):
        _read(value)


def test_pixels_become_the_encoder_input_and_latents_are_sampled() -> None:
    sample = pixels_to_sample(np.array([[[0, 255, 51]]], dtype=np.uint8))
    np.testing.assert_allclose(sample.reshape(-1), [-1.0, 1.0, -0.6], atol=1e-6)
    parameters = np.zeros((1, 8, 2, 2), np.float32)
    parameters[:, 4:] = -100.0  # log-variance clamped at -30: std ~ 3e-7
    latents = sample_latents(parameters, seed=5, scaling_factor=0.5)
    assert latents.shape == (1, 4, 2, 2) and np.abs(latents).max() < 1e-6
    parameters[:, 4:] = 0.0  # std 1: the latents are the seeded noise, scaled
    noise = np.random.default_rng([2, 5]).standard_normal((1, 4, 2, 2)).astype(np.float32)
    np.testing.assert_allclose(sample_latents(parameters, 5, 0.5), 0.5 * noise, rtol=1e-6)
