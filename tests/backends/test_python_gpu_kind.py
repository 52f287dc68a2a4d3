"""A Python model whose instance group is KIND_GPU, on a machine without that GPU: its
load fails saying so, as Triton 2.51's does ("instance group double_0 of model double
specifies invalid or unsupported gpu id 0. GPUs with at least the minimum required
CUDA compute compatibility of 6.000000 are: "). Before, it loaded and the model was
told ``model_instance_kind: GPU``, ``model_instance_device_id: 0`` with no GPU there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sordino.backends import gpus
from sordino.errors import ModelLoadError
from sordino.models.repository import scan_repository
from sordino.testing import serve_in_thread
from tests.backends.python_models import load_python_backend

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_FP32, dims: [ 2 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 2 ] } ]
instance_group [ { kind: KIND_GPU, count: 1 } ]
"""

# Writes what Triton told it in initialize, beside its folder.
MODEL = """
import json, os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        told = {k: args[k] for k in ("model_instance_kind", "model_instance_device_id")}
        with open(os.path.join(args["model_repository"], "told.json"), "w") as out:
            json.dump(told, out)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]) for r in requests]
"""


def _model(root: Path) -> Path:
    folder = root / "double"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG)
    (folder / "1" / "model.py").write_text(MODEL)
    return folder


def test_a_gpu_the_machine_does_not_show_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _model(tmp_path)
    monkeypatch.setattr(gpus, "_driver_count", lambda: 0)
    with pytest.raises(ModelLoadError) as caught:
        load_python_backend(folder, device="cuda:0")
    assert str(caught.value) == (
        "model double: its instance_group (KIND_GPU) puts an instance on GPU 0, which this "
        "machine does not have (GPUs: none); give the group kind: KIND_CPU to run it on the "
        "CPU, or gpus: the GPUs there are"
    )
    assert not (tmp_path / "double" / "told.json").exists()  # initialize never ran
    monkeypatch.setattr(gpus, "_driver_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # one of the two is this process's
    with pytest.raises(ModelLoadError, match=r"GPU 1, which .* \(GPUs: 0\)"):
        load_python_backend(folder, device="cuda:1")


def test_a_gpu_the_machine_shows_is_told_to_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _model(tmp_path)
    monkeypatch.setattr(gpus, "_driver_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    load_python_backend(folder, device="cuda:1")
    told = json.loads((tmp_path / "double" / "told.json").read_text())
    assert told == {"model_instance_kind": "GPU", "model_instance_device_id": "1"}


@pytest.mark.skipif(bool(gpus.gpus_present()), reason="this machine has a GPU")
def test_sordino_start_refuses_the_model_on_a_machine_without_a_gpu(tmp_path: Path) -> None:
    _model(tmp_path)
    refused = pytest.raises(Exception, match="puts an instance on GPU 0, which this machine")
    with refused, serve_in_thread(sources=scan_repository(tmp_path)):
        pass
    assert not (tmp_path / "double" / "told.json").exists()
