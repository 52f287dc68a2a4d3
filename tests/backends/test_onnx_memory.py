"""The ONNX backend's arena settings: shrinking after large batches, the arena off."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from sordino.backends.onnx import OnnxBackend
from sordino.config.memory import FrameworkMemoryConfig
from tests.conftest import digits_pixels

DIGITS = Path(str(resources.files("sordino.models.builtin").joinpath("digits-classifier.onnx")))


def test_shrinks_after_large_batches_only(reference: dict[str, Any]) -> None:
    backend = OnnxBackend(
        name="digits", version="1", memory=FrameworkMemoryConfig(shrink_after_rows=8)
    )
    backend.load(DIGITS)
    session = reference["digits-classifier"]
    for rows in (1, 7, 8, 32):
        pixels = digits_pixels(rows, seed=rows)
        got = backend.infer({"pixels": pixels})["probabilities"]
        expected = session.run(None, {session.get_inputs()[0].name: pixels})[0]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert backend.arena_shrinks == 2


def test_without_the_cpu_arena_answers_stay_equal(reference: dict[str, Any]) -> None:
    backend = OnnxBackend(name="digits", version="1", memory=FrameworkMemoryConfig(cpu_arena=False))
    backend.load(DIGITS)
    pixels = digits_pixels(4)
    session = reference["digits-classifier"]
    expected = session.run(None, {session.get_inputs()[0].name: pixels})[0]
    np.testing.assert_allclose(
        backend.infer({"pixels": pixels})["probabilities"], expected, rtol=1e-5, atol=1e-6
    )
    assert backend.arena_shrinks == 0
