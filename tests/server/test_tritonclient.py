"""Compatibility with the official tritonclient HTTP client (JSON and binary data)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sordino.testing import RunningServer
from tests.conftest import digits_pixels


@pytest.fixture
def client(server: RunningServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))


def test_server_and_model_readiness(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("digits-classifier")
    assert client.get_server_metadata()["name"] == "sordino"


def test_model_metadata_and_config(client: httpclient.InferenceServerClient) -> None:
    meta = client.get_model_metadata("simple")
    assert [i["name"] for i in meta["inputs"]] == ["INPUT0", "INPUT1"]
    config = client.get_model_config("simple")
    assert config["max_batch_size"] == 64
    assert config["input"][0]["data_type"] == "TYPE_INT32"


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_digits_infer_matches_onnxruntime(
    client: httpclient.InferenceServerClient, reference: dict[str, Any], binary: bool
) -> None:
    pixels = digits_pixels(4, seed=3)
    inp = httpclient.InferInput("pixels", list(pixels.shape), "FP32")
    inp.set_data_from_numpy(pixels, binary_data=binary)
    out = httpclient.InferRequestedOutput("probabilities", binary_data=binary)
    result = client.infer("digits-classifier", [inp], outputs=[out])
    expected = reference["digits-classifier"].run(None, {"pixels": pixels})[0]
    np.testing.assert_allclose(result.as_numpy("probabilities"), expected, rtol=1e-6)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_simple_int32_two_inputs(client: httpclient.InferenceServerClient, binary: bool) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    result = client.infer("simple", inputs, outputs=outputs, request_id="abc", priority=1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response()["id"] == "abc"


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_bytes_model(client: httpclient.InferenceServerClient, binary: bool) -> None:
    text = np.array([[b"Hello"], [b"WORLD"]], dtype=object)
    inp = httpclient.InferInput("text", [2, 1], "BYTES")
    inp.set_data_from_numpy(text, binary_data=binary)
    out = httpclient.InferRequestedOutput("normalized", binary_data=binary)
    result = client.infer("text-normalizer", [inp], outputs=[out])
    got = [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy("normalized").ravel()]
    assert got == ["hello", "world"]


def test_statistics_extension(client: httpclient.InferenceServerClient) -> None:
    stats = client.get_inference_statistics("digits-classifier")
    entry = stats["model_stats"][0]
    assert entry["name"] == "digits-classifier"
    assert "success" in entry["inference_stats"]
    # Triton 2.51's fields, in its order; a CPU model's memory usage and the response
    # statistics (which its Python and ONNX backends never report) are empty there too.
    assert list(entry) == [
        "name", "version", "last_inference", "inference_count", "execution_count",
        "inference_stats", "response_stats", "batch_stats", "memory_usage",
    ]  # fmt: skip
    assert (entry["response_stats"], entry["memory_usage"]) == ({}, [])


def test_errors_surface_as_exceptions(client: httpclient.InferenceServerClient) -> None:
    inp = httpclient.InferInput("pixels", [1, 64], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 64), dtype=np.float32))
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.infer("nope", [inp])


def test_timeout_parameter_accepted(client: httpclient.InferenceServerClient) -> None:
    inp = httpclient.InferInput("pixels", [1, 64], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 64), dtype=np.float32))
    result = client.infer("digits-classifier", [inp], timeout=5_000_000)
    assert result.as_numpy("probabilities").shape == (1, 10)
