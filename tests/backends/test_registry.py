"""Backends by kind: the factory behind ``ModelConfig.backend``."""

from __future__ import annotations

import pytest

from sordino.backends.onnx import OnnxBackend
from sordino.backends.registry import backend_kinds, create_backend
from sordino.errors import ModelLoadError


def test_onnxruntime_builds_an_onnx_backend() -> None:
    """The ``onnxruntime`` kind gives an unloaded ONNX Runtime backend."""
    backend = create_backend(
        "onnxruntime",
        name="m",
        version="1",
        providers=("CPUExecutionProvider",),
        intra_op_threads=1,
    )
    assert isinstance(backend, OnnxBackend)
    assert "onnxruntime" in backend_kinds()


def test_an_unknown_kind_names_the_known_ones() -> None:
    """Asking for a backend this build lacks is a load error that lists what exists."""
    with pytest.raises(ModelLoadError, match=r"unknown backend 'tensorflow'.*onnxruntime"):
        create_backend("tensorflow", name="m", version="1", providers=(), intra_op_threads=None)
