"""Triton's ``reshape``: clients send and read a tensor's ``dims``, the model takes or
gives its ``reshape``. Triton's own quickstart model repository (``densenet_onnx``)
declares one; sordino refused it before ("sordino does not support output fc6_1:
reshape")."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from pydantic import ValidationError
from tritonclient.utils import InferenceServerException

from sordino.config import RuntimeConfig
from sordino.config.models import ModelConfig
from sordino.errors import ConfigError, ModelLoadError
from sordino.models.repository import scan_repository
from sordino.testing import RunningServer, serve_in_thread
from tests.models import densenet_shaped_model, grid_model

# Triton's docs/examples/model_repository/densenet_onnx/config.pbtxt, as it is.
DENSENET = """name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size : 1
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape { shape: [ 1000, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]"""

GRID = """name: "grid"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "GRID" data_type: TYPE_FP32 dims: [ -1, 2, 2 ] reshape: { shape: [ -1, 4 ] } } ]
output [
  { name: "TOTAL" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } },
  { name: "TWICE" data_type: TYPE_FP32 dims: [ -1, 2, 2 ] reshape: { shape: [ -1, 4 ] } }
]
"""


def _model(root: Path, name: str, config: str, make: Any) -> Path:
    (root / name / "1").mkdir(parents=True)
    make(root / name / "1" / "model.onnx")
    (root / name / "config.pbtxt").write_text(config)
    return root


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("repository")
    _model(root, "densenet_onnx", DENSENET, densenet_shaped_model)
    labels = "".join(f"LABEL_{k}\n" for k in range(1000))
    (root / "densenet_onnx" / "densenet_labels.txt").write_text(labels)
    _model(root, "grid", GRID, grid_model)
    with serve_in_thread(RuntimeConfig(), scan_repository(root)) as running:
        yield running


@pytest.fixture(params=["http", "grpc"])
def client(served: RunningServer, request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "http":
        client: Any = httpclient.InferenceServerClient(served.url.removeprefix("http://"))
    else:
        client = grpcclient.InferenceServerClient(served.grpc_url)
    yield client
    client.close()


def _mod(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def _metadata(client: Any, name: str) -> dict[str, Any]:
    if isinstance(client, grpcclient.InferenceServerClient):
        return client.get_model_metadata(name, as_json=True)  # type: ignore[no-any-return]
    return client.get_model_metadata(name)  # type: ignore[no-any-return]


def _shapes(tensors: list[dict[str, Any]]) -> dict[str, list[int]]:
    return {t["name"]: [int(d) for d in t["shape"]] for t in tensors}


def test_tritons_quickstart_densenet_repository_serves_unchanged(client: Any) -> None:
    """As Triton's image_client asks it: the scores as [1, 1000], and the top three
    classes with their labels (the model's [1, 1000, 1, 1] read through the reshape)."""
    mod = _mod(client)
    means = np.array([0.5, 2.0, 1.0], np.float32)
    image = np.broadcast_to(means[:, None, None], (3, 224, 224))[None].astype(np.float32)
    tensor = mod.InferInput("data_0", [1, 3, 224, 224], "FP32")
    tensor.set_data_from_numpy(image)
    metadata = _metadata(client, "densenet_onnx")
    assert _shapes(metadata["inputs"]) == {"data_0": [-1, 3, 224, 224]}
    assert _shapes(metadata["outputs"]) == {"fc6_1": [-1, 1000]}
    if isinstance(client, grpcclient.InferenceServerClient):
        config = client.get_model_config("densenet_onnx", as_json=True)["config"]
    else:
        config = client.get_model_config("densenet_onnx")
    (output,) = config["output"]
    assert [int(d) for d in output["dims"]] == [1000]
    assert [int(d) for d in output["reshape"]["shape"]] == [1000, 1, 1]
    assert "reshape" not in config["input"][0]
    scores = client.infer("densenet_onnx", [tensor]).as_numpy("fc6_1")
    expected = np.array([(k + 1) * means[k % 3] for k in range(1000)], np.float32)
    assert scores.shape == (1, 1000)
    np.testing.assert_allclose(scores[0], expected, rtol=1e-5)
    asked = mod.InferRequestedOutput("fc6_1", class_count=3)
    top = client.infer("densenet_onnx", [tensor], outputs=[asked]).as_numpy("fc6_1")
    assert top.shape == (1, 3)
    # Class k scores (k + 1) * means[k % 3]: the largest are 998, 995 and 992 (channel 2).
    assert [entry.decode().split(":")[1:] for entry in top[0]] == [
        ["997", "LABEL_997"],
        ["994", "LABEL_994"],
        ["991", "LABEL_991"],
    ]


def test_variable_dims_and_an_empty_reshape(client: Any) -> None:
    """``dims: [-1, 2, 2]`` taken as ``[-1, 4]`` by the model (the request's size carried
    to the reshape's -1), and the other way round for an output; a ``[batch]`` output
    read as ``[batch, 1]``."""
    mod = _mod(client)
    assert _shapes(_metadata(client, "grid")["outputs"]) == {
        "TOTAL": [-1, 1],
        "TWICE": [-1, -1, 2, 2],
    }
    grid = np.arange(2 * 12, dtype=np.float32).reshape(2, 3, 2, 2)
    tensor = mod.InferInput("GRID", [2, 3, 2, 2], "FP32")
    tensor.set_data_from_numpy(grid)
    result = client.infer("grid", [tensor])
    total = grid.sum(axis=(1, 2, 3)).reshape(2, 1)
    np.testing.assert_array_equal(result.as_numpy("TOTAL"), total)
    np.testing.assert_array_equal(result.as_numpy("TWICE"), 2 * grid)
    odd = mod.InferInput("GRID", [1, 3, 4], "FP32")  # not the dims declared
    odd.set_data_from_numpy(np.ones((1, 3, 4), np.float32))
    with pytest.raises(InferenceServerException):
        client.infer("grid", [odd])


def test_requests_sent_together_come_back_each_its_own(served: RunningServer) -> None:
    """Reshaping relabels a batch: requests that may run as one come back each its own."""
    client = httpclient.InferenceServerClient(served.url.removeprefix("http://"), concurrency=4)
    grids = [np.full((1, 2, 2, 2), i, np.float32) for i in range(4)]
    pending = []
    for grid in grids:
        tensor = httpclient.InferInput("GRID", [1, 2, 2, 2], "FP32")
        tensor.set_data_from_numpy(grid)
        pending.append(client.async_infer("grid", [tensor]))
    for grid, call in zip(grids, pending, strict=True):
        result = call.get_result()
        np.testing.assert_array_equal(result.as_numpy("TWICE"), 2 * grid)
    client.close()


@pytest.mark.parametrize(
    ("dims", "reshape", "limit", "said"),
    [
        ([12], [5, 2], 4, "dims [12] and reshape [5, 2] do not hold the same elements"),
        ([-1], [-1, 4], 4, "do not hold the same elements"),
        ([2, -1, 6], [8, -1, 1, 6], 4, "do not hold the same elements"),
        ([1], [], 0, "an empty reshape needs max_batch_size above 0"),
        ([2], [], 4, "an empty reshape holds one element"),
        ([0, 4], [4], 4, "each size must be at least 1"),
    ],
)
def test_a_reshape_triton_refuses_is_refused(
    dims: list[int], reshape: list[int], limit: int, said: str
) -> None:
    given = {"name": "X", "data_type": "TYPE_FP32", "dims": dims, "reshape": {"shape": reshape}}
    with pytest.raises(ValidationError, match=re.escape(said)):
        ModelConfig(max_batch_size=limit, input=[given])
    # Triton's own example of one that holds: [2, 4, -1, 6] as [8, -1, 1, 6].
    ModelConfig(max_batch_size=4, input=[{**given, "dims": [2, 4, -1, 6],
                                          "reshape": [8, -1, 1, 6]}])  # fmt: skip


def test_a_reshape_the_model_does_not_have_stops_the_load(tmp_path: Path) -> None:
    text = DENSENET.replace("[ 1000, 1, 1 ]", "[ 10, 100 ]")
    root = _model(tmp_path, "densenet_onnx", text, densenet_shaped_model)
    (source,) = scan_repository(root)
    said = (
        "output fc6_1 has reshape [10, 100], but the model's shape is [1000, 1, 1] (after "
        "the batch dimension)"
    )
    with (
        pytest.raises(ModelLoadError, match=re.escape(said)),
        serve_in_thread(RuntimeConfig(), [source]),
    ):
        pass


def test_a_python_model_sees_and_gives_the_reshaped_tensors() -> None:
    """As on Triton (bench.triton_python_parity compares the two): ``execute`` gets GRID
    as [rows, n, 4] and its [rows, n, 4] and [rows] outputs reach clients as
    [rows, n, 2, 2] and [rows, 1], whether the requests run apart or in one batch."""
    fixture = Path(__file__).parent.parent / "fixtures" / "triton_python_answers"
    sources = [s for s in scan_repository(fixture) if s.name == "reshaped"]
    with serve_in_thread(RuntimeConfig(), sources) as running:
        client = httpclient.InferenceServerClient(
            running.url.removeprefix("http://"), concurrency=3
        )
        grids = [np.arange(r * 8, dtype=np.float32).reshape(r, 2, 2, 2) for r in (1, 2, 3)]
        pending = []
        for grid in grids:
            tensor = httpclient.InferInput("GRID", list(grid.shape), "FP32")
            tensor.set_data_from_numpy(grid)
            pending.append(client.async_infer("reshaped", [tensor]))
        for grid, call in zip(grids, pending, strict=True):
            result = call.get_result()
            rows = grid.shape[0]
            assert result.as_numpy("SEEN").tolist() == [[rows, 2, 4]] * rows
            np.testing.assert_array_equal(result.as_numpy("TWICE"), 2 * grid)
            total = grid.reshape(rows, -1).sum(axis=1, keepdims=True)
            np.testing.assert_array_equal(result.as_numpy("TOTAL"), total)
        config = client.get_model_config("reshaped")
        assert config["input"][0]["reshape"] == {"shape": [-1, 4]}
        assert config["output"][1]["reshape"] == {"shape": []}
        client.close()


def test_a_model_in_the_servers_own_process_is_reshaped_too(tmp_path: Path) -> None:
    """(``isolation: thread``: the backend runs in the server, not in a worker.)"""
    root = _model(tmp_path, "grid", GRID, grid_model)
    (source,) = scan_repository(root)
    threaded = dataclasses.replace(
        source, config=source.config.model_copy(update={"isolation": "thread"})
    )
    with serve_in_thread(RuntimeConfig(), [threaded]) as running:
        client = httpclient.InferenceServerClient(running.url.removeprefix("http://"))
        grid = np.ones((1, 2, 2, 2), np.float32)
        tensor = httpclient.InferInput("GRID", [1, 2, 2, 2], "FP32")
        tensor.set_data_from_numpy(grid)
        result = client.infer("grid", [tensor])
        np.testing.assert_array_equal(result.as_numpy("TOTAL"), [[8.0]])
        np.testing.assert_array_equal(result.as_numpy("TWICE"), 2 * grid)
        client.close()


def test_a_model_that_does_not_batch_is_reshaped_whole(tmp_path: Path) -> None:
    """Triton's older densenet_onnx configuration: max_batch_size 0, the whole input
    reshaped to the model's [1, 3, 224, 224] and its output from [1, 1000, 1, 1]."""
    text = """platform: "onnxruntime_onnx"
max_batch_size : 0
input [ { name: "data_0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 224, 224 ]
          reshape { shape: [ 1, 3, 224, 224 ] } } ]
output [ { name: "fc6_1" data_type: TYPE_FP32 dims: [ 1000 ]
           reshape { shape: [ 1, 1000, 1, 1 ] } } ]
"""
    (source,) = scan_repository(_model(tmp_path, "densenet_onnx", text, densenet_shaped_model))
    with serve_in_thread(RuntimeConfig(), [source]) as running:
        client = httpclient.InferenceServerClient(running.url.removeprefix("http://"))
        metadata = client.get_model_metadata("densenet_onnx")
        assert _shapes(metadata["inputs"]) == {"data_0": [3, 224, 224]}
        assert _shapes(metadata["outputs"]) == {"fc6_1": [1000]}
        tensor = httpclient.InferInput("data_0", [3, 224, 224], "FP32")
        tensor.set_data_from_numpy(np.ones((3, 224, 224), np.float32))
        scores = client.infer("densenet_onnx", [tensor]).as_numpy("fc6_1")
        assert scores.shape == (1000,)
        np.testing.assert_allclose(scores[:3], [1.0, 2.0, 3.0], rtol=1e-5)
        client.close()


def test_a_refused_reshape_in_a_repository_says_so_in_one_line(tmp_path: Path) -> None:
    text = GRID.replace("dims: [ -1, 2, 2 ] reshape: { shape: [ -1, 4 ] } } ]",
                        "dims: [ -1 ] reshape: { shape: [ -1, 4 ] } } ]", 1)  # fmt: skip
    root = _model(tmp_path, "grid", text, grid_model)
    with pytest.raises(ConfigError) as raised:
        scan_repository(root)
    said = str(raised.value)
    assert said.endswith(
        "config.pbtxt: the model: input GRID: dims [-1] and reshape [-1, 4] do not hold the "
        "same elements (each run of sizes between -1s must hold as many on both sides)"
    )
    assert "\n" not in said and "pydantic" not in said
