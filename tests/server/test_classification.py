"""Triton's classification extension over HTTP and gRPC, with tritonclient."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sordino.config.models import ModelConfig
from sordino.errors import ModelLoadError
from sordino.models.repository import ModelSource, builtin_sources
from sordino.server.classification import read_labels, top_k
from sordino.testing import RunningServer
from tests.conftest import digits_pixels

LABELS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


@pytest.fixture(params=["http", "grpc"])
def client(server: RunningServer, request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "http":
        client: Any = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    else:
        client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def _mod(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def _expected(pixels: np.ndarray) -> np.ndarray:
    digits = next(s for s in builtin_sources() if s.name == "digits-classifier")
    session = ort.InferenceSession(str(digits.path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"pixels": pixels})[0])


def test_top_k_scores_indices_and_labels(client: Any) -> None:
    """Triton's image_client asks for classification: k and parses score:index:label."""
    pixels = digits_pixels(3, seed=5)
    mod = _mod(client)
    tensor = mod.InferInput("pixels", list(pixels.shape), "FP32")
    tensor.set_data_from_numpy(pixels)
    output = mod.InferRequestedOutput("probabilities", class_count=3)
    result = client.infer("digits-classifier", [tensor], outputs=[output])
    got = result.as_numpy("probabilities")
    assert got.shape == (3, 3)
    expected = _expected(pixels)
    for row, entries in enumerate(got):
        order = np.argsort(-expected[row])[:3]
        for rank, entry in enumerate(entries):
            text = entry.decode() if isinstance(entry, bytes) else entry
            score, index, label = text.split(":")
            assert int(index) == order[rank] and label == LABELS[order[rank]]
            assert float(score) == pytest.approx(float(expected[row, order[rank]]), abs=1e-5)


def test_classification_next_to_a_raw_output(client: Any) -> None:
    """A model without labels answers score:index; other outputs stay raw."""
    mod = _mod(client)
    a = np.array([[5, 1, 9, 3] + [0] * 12], dtype=np.int32)
    inputs = [
        mod.InferInput("INPUT0", [1, 16], "INT32"),
        mod.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(np.zeros_like(a))
    outputs = [
        mod.InferRequestedOutput("OUTPUT0", class_count=2),
        mod.InferRequestedOutput("OUTPUT1"),
    ]
    result = client.infer("simple", inputs, outputs=outputs)
    top = [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy("OUTPUT0").ravel()]
    assert top == ["9.000000:2", "5.000000:0"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a)


def test_classification_of_a_bytes_output_is_refused(client: Any) -> None:
    mod = _mod(client)
    tensor = mod.InferInput("text", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"A"]], dtype=object))
    output = mod.InferRequestedOutput("normalized", class_count=1)
    with pytest.raises(InferenceServerException, match="takes a numeric output"):
        client.infer("text-normalizer", [tensor], outputs=[output])


def test_top_k_without_batching_and_k_past_the_classes() -> None:
    array = np.array([0.1, 0.7, 0.2], dtype=np.float32)
    got = top_k(array, 5, ["a", "b"], batched=False)
    assert got.tolist() == [b"0.700000:1:b", b"0.200000:2", b"0.100000:0:a"]


def test_a_missing_label_file_fails_the_load(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    model.write_bytes(b"")
    source = ModelSource("m", "1", model, ModelConfig(name="m", label_filename="labels.txt"))
    with pytest.raises(ModelLoadError, match=r"label_filename 'labels\.txt' cannot be read"):
        read_labels(source)
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    assert read_labels(source) == {"*": ["cat", "dog"]}
    mapped = ModelSource("m", "1", model, ModelConfig(name="m", label_filename={"y": "labels.txt"}))
    assert read_labels(mapped) == {"y": ["cat", "dog"]}
