"""Backends by kind: the factory behind ``ModelConfig.backend``."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from sordino.backends.base import ModelRunOptions
from sordino.backends.onnx import OnnxBackend
from sordino.backends.registry import (
    backend_kinds,
    create_backend,
    kind_for_platform,
    reset_backend_kinds,
)
from sordino.errors import ModelLoadError


def test_onnxruntime_builds_an_onnx_backend() -> None:
    """The ``onnxruntime`` kind gives an unloaded ONNX Runtime backend."""
    backend = create_backend(
        ModelRunOptions("onnxruntime"),
        name="m",
        version="1",
        providers=("CPUExecutionProvider",),
        intra_op_threads=1,
    )
    assert isinstance(backend, OnnxBackend)
    assert "onnxruntime" in backend_kinds()


def test_run_options_are_what_the_model_configuration_says() -> None:
    """One value carries a model's options to each instance's backend, whichever
    executor starts it (worker process, thread, Ray actor): none is left behind."""
    from sordino.backends.registry import run_options
    from sordino.config.models import ModelConfig

    config = ModelConfig(
        max_batch_size=4,
        thread_spinning=True,
        framework_memory={"arena_max": "64MB"},
        onnxruntime={"inter_op_threads": 2},
        input=[{"name": "X", "data_type": "TYPE_FP32", "dims": [4], "reshape": {"shape": [2, 2]}}],
        triton_config={"name": "m", "max_batch_size": 4},
    )
    run = run_options(config)
    assert run.backend == "onnxruntime" and run.thread_spinning
    assert run.memory == config.framework_memory and run.memory.arena_max == 64 * 1024 * 1024
    assert run.onnxruntime == config.onnxruntime
    assert json.loads(run.triton_config or "") == {"name": "m", "max_batch_size": 4}
    assert run.reshapes is not None and [r.name for r in run.reshapes.inputs] == ["X"]
    assert run_options(ModelConfig()).reshapes is None
    assert pickle.loads(pickle.dumps(run)) == run  # it crosses to a worker whole


def test_an_unknown_kind_names_the_known_ones() -> None:
    """Asking for a backend this build lacks is a load error that lists what exists."""
    with pytest.raises(ModelLoadError, match=r"unknown backend 'tensorflow'.*onnxruntime"):
        create_backend(
            ModelRunOptions("tensorflow"),
            name="m",
            version="1",
            providers=(),
            intra_op_threads=None,
        )


PLUGIN = """
import numpy as np

from sordino.backends.base import BackendKind, BackendStatistics
from sordino.inference import ModelMetadata, TensorSpec


class Doubler:
    def __init__(self, options):
        self.options = options

    def load(self, model_path, device):
        self.factor = float(model_path.read_text())
        spec_in, spec_out = TensorSpec("x", "FP32", (-1,)), TensorSpec("y", "FP32", (-1,))
        self.metadata = ModelMetadata(
            self.options.name, self.options.version, "doubler", (spec_in,), (spec_out,), True
        )

    def infer(self, batch):
        return {"y": batch["x"] * self.factor}

    def unload(self):
        pass

    def statistics(self):
        return BackendStatistics(0, 0, 0, 0.0)


KIND = BackendKind("doubler", Doubler, model_files=("factor.txt",), platforms=("doubler_txt",))
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package ``sordino_doubler`` registering kind ``doubler``, found via its dist-info."""
    (tmp_path / "sordino_doubler.py").write_text(PLUGIN)
    info = tmp_path / "sordino_doubler-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sordino-doubler\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[sordino.backends]\ndoubler = sordino_doubler:KIND\nbroken = sordino_doubler:MISSING\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    reset_backend_kinds()
    yield tmp_path
    reset_backend_kinds()


def test_a_package_adds_a_backend_kind_through_its_entry_point(plugin: Path) -> None:
    """An installed package's ``sordino.backends`` entry point is a kind like the built-ins."""
    kinds = backend_kinds()
    assert {"onnxruntime", "python", "doubler"} <= set(kinds)
    assert "broken" not in kinds  # a bad entry point is skipped, never fatal
    assert kind_for_platform("doubler_txt") is kinds["doubler"]
    version = plugin / "m" / "1"
    version.mkdir(parents=True)
    (version / "factor.txt").write_text("2")
    assert kinds["doubler"].model_file(version) == version / "factor.txt"
    backend = create_backend(
        ModelRunOptions("doubler"), name="m", version="1", providers=(), intra_op_threads=None
    )
    backend.load(version / "factor.txt", "cpu")
    out = backend.infer({"x": np.array([1.0, 3.0], dtype=np.float32)})
    assert out["y"].tolist() == [2.0, 6.0]


def test_a_repository_folder_holds_its_kinds_file(plugin: Path) -> None:
    """A version folder without the kind's file is refused naming the file expected."""
    version = plugin / "m" / "1"
    version.mkdir(parents=True)
    assert (
        backend_kinds()["python"].model_file(version)
        == f"no model.py file in {version} (expected model.py)"
    )
