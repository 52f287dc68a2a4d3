"""The ONNX Runtime backend's profiling switch, without a server."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from sordino.backends.onnx import OnnxBackend

MODEL = Path(str(resources.files("sordino.models.builtin").joinpath("digits-classifier.onnx")))


@pytest.fixture
def backend() -> OnnxBackend:
    backend = OnnxBackend(name="digits", version="1")
    backend.load(MODEL)
    return backend


def _nodes(path: str) -> int:
    return sum(1 for e in json.loads(Path(path).read_text()) if e.get("cat") == "Node")


def test_batches_between_start_and_stop_are_traced(backend: OnnxBackend, tmp_path: Path) -> None:
    batch = {"pixels": np.zeros((2, 64), np.float32)}
    expected = backend.infer(batch)["probabilities"]
    backend.start_profiling(str(tmp_path / "p"))
    assert backend.profiling
    np.testing.assert_array_equal(backend.infer(batch)["probabilities"], expected)
    backend.infer(batch)
    path, batches = backend.stop_profiling()
    assert not backend.profiling and batches == 2
    assert Path(path).parent == tmp_path and _nodes(path) > 0
    backend.infer(batch)  # the serving session again: nothing more is traced
    assert backend.statistics().batches == 4


def test_starting_again_abandons_the_first_trace(backend: OnnxBackend, tmp_path: Path) -> None:
    """A second start (after a lost stop) replaces the first profiling session."""
    batch = {"pixels": np.zeros((1, 64), np.float32)}
    backend.start_profiling(str(tmp_path / "first"))
    backend.infer(batch)
    backend.start_profiling(str(tmp_path / "second"))
    backend.infer(batch)
    path, batches = backend.stop_profiling()
    assert Path(path).name.startswith("second") and batches == 1
    assert not backend.profiling
    with pytest.raises(RuntimeError, match="not being profiled"):
        backend.stop_profiling()
