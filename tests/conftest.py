"""Shared fixtures: a real server on a loopback port, direct ONNX Runtime references."""

from __future__ import annotations

from collections.abc import Iterator
from importlib import resources
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from sordino.testing import RunningServer, serve_in_thread


@pytest.fixture(scope="session")
def server() -> Iterator[RunningServer]:
    """The built-in models served by a real server for the whole session."""
    with serve_in_thread() as running:
        yield running


@pytest.fixture(scope="session")
def reference() -> dict[str, Any]:
    """Direct ONNX Runtime sessions on the built-in model files (the unbatched truth)."""
    root = resources.files("sordino.models.builtin")
    sessions = {}
    for name in ("digits-classifier", "simple", "text-normalizer"):
        sessions[name] = ort.InferenceSession(
            str(root.joinpath(f"{name}.onnx")), providers=["CPUExecutionProvider"]
        )
    return sessions


def digits_pixels(n: int, seed: int = 0) -> np.ndarray:
    """``n`` rows of plausible 8x8 digit pixels (0-16) as FP32."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 17, size=(n, 64)).astype(np.float32)
