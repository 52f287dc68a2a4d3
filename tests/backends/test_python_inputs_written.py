"""A Triton Python model may write into its inputs (``x *= 100``, ``img /= 255``): Triton's
stub has its own copy of them. sordino's arena blocks are read again after a model ran:
by a pipeline's other steps, and by the batch's second run when its worker was lost.
Before, a model writing into its inputs changed what those read (checked side by side
with Triton 2.51: there the other step reads the input as the client sent it)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from sordino.config import RuntimeConfig, load_config
from sordino.models.ensembles import with_ensembles
from sordino.models.repository import scan_repository
from sordino.testing import serve_in_thread
from tests.backends.python_models import write_python_model

CONFIG = """backend: "python"
max_batch_size: 8
input [ { name: "X", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""

WRITER = """import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.marker = os.path.join(args["model_repository"], "lost-once")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            x *= 100  # in place
            if x[0, 0] == 700 and not os.path.exists(self.marker):
                open(self.marker, "w").close()
                os._exit(1)  # the worker is lost after writing: the batch runs again
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.copy())]))
        return responses
"""

READER = """import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.05)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
"""

ENSEMBLE = """platform: "ensemble"
max_batch_size: 8
input [ { name: "X", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "A", data_type: TYPE_FP32, dims: [ 4 ] },
         { name: "B", data_type: TYPE_FP32, dims: [ 4 ] },
         { name: "C", data_type: TYPE_FP32, dims: [ 4 ] } ]
ensemble_scheduling {
  step [
    { model_name: "writer" model_version: -1
      input_map { key: "X" value: "X" } output_map { key: "Y" value: "A" } },
    { model_name: "reader" model_version: -1
      input_map { key: "X" value: "X" } output_map { key: "Y" value: "B" } },
    { model_name: "writer" model_version: -1
      input_map { key: "X" value: "B" } output_map { key: "Y" value: "C" } }
  ]
}
"""


def _repository(root: Path) -> Path:
    for name, model in (("writer", WRITER), ("reader", READER)):
        write_python_model(root, name, model, CONFIG)
    (root / "both" / "1").mkdir(parents=True)
    (root / "both" / "config.pbtxt").write_text(ENSEMBLE)
    return root


def _infer(url: str, model: str, x: list[float], outputs: list[str]) -> list[list[float]]:
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    tensor = httpclient.InferInput("X", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.array([x], np.float32))
    result = client.infer(model, [tensor])
    client.close()
    return [result.as_numpy(name)[0].tolist() for name in outputs]


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_a_steps_writes_into_its_inputs_reach_no_other_step(tmp_path: Path, isolation: str) -> None:
    sources = [
        dataclasses.replace(s, config=s.config.model_copy(update={"isolation": isolation}))
        for s in scan_repository(_repository(tmp_path))
    ]
    config = load_config(None, {"model_repository": str(tmp_path)})
    config = config.model_copy(
        update={"pipelines": with_ensembles(config.pipelines, config.model_repository)}
    )
    with serve_in_thread(config, sources) as server:
        a, b, c = _infer(server.url, "both", [1, 2, 3, 4], ["A", "B", "C"])
    assert a == [100, 200, 300, 400]
    assert b == [1, 2, 3, 4]  # the input as the client sent it (was A's)
    assert c == [100, 200, 300, 400]  # and B, the answer, unchanged by C's step


def test_a_batch_run_again_after_its_worker_was_lost_reads_the_inputs_as_sent(
    tmp_path: Path,
) -> None:
    with serve_in_thread(RuntimeConfig(), scan_repository(_repository(tmp_path))) as server:
        (y,) = _infer(server.url, "writer", [7, 8, 9, 10], ["Y"])
    assert (tmp_path / "writer" / "lost-once").exists()  # the first run's worker was lost
    assert y == [700, 800, 900, 1000]  # the second run read [7, 8, 9, 10] (was 70000, …)
