"""Errors lead with Triton's phrases (what clients match on), over HTTP and gRPC.

The table is in docs/http-api.md ("Error texts"). sordino's own explanation follows
in parentheses.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sordino.testing import RunningServer


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


def _inputs(client: Any, shapes: dict[str, list[int]], datatype: str = "INT32") -> list[Any]:
    mod = _mod(client)
    tensors = []
    for name, shape in shapes.items():
        tensor = mod.InferInput(name, shape, datatype)
        dtype = np.int32 if datatype == "INT32" else np.float32
        tensor.set_data_from_numpy(np.zeros(shape, dtype=dtype))
        tensors.append(tensor)
    return tensors


def _error(call: Any) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.message())


def test_unknown_model_infer_and_metadata(client: Any) -> None:
    inputs = _inputs(client, {"INPUT0": [1, 16]})
    for message in (
        _error(lambda: client.infer("wrong_model_name", inputs)),
        _error(lambda: client.get_model_metadata("wrong_model_name")),
        _error(lambda: client.get_model_config("wrong_model_name")),
    ):
        assert message.startswith("Request for unknown model: 'wrong_model_name' is not found")
        assert "loaded models:" in message  # sordino's helpful tail stays


def test_unknown_version(client: Any) -> None:
    inputs = _inputs(client, {"INPUT0": [1, 16], "INPUT1": [1, 16]})
    message = _error(lambda: client.infer("simple", inputs, model_version="7"))
    assert message.startswith("Request for unknown model: 'simple' version 7 is not found")
    message = _error(lambda: client.get_model_metadata("simple", model_version="7"))
    assert message.startswith("Request for unknown model: 'simple' version 7 is not found")


@pytest.mark.parametrize(
    ("shapes", "datatype", "lead"),
    [
        (
            {"INPUT0": [65, 16], "INPUT1": [65, 16]},
            "INT32",
            "inference request batch-size must be <= 64 for 'simple'",
        ),
        ({"INPUT0": [1, 16]}, "INT32", "expected 2 inputs but got 1 inputs for model 'simple'"),
        (
            {"INPUT0": [1, 8], "INPUT1": [1, 8]},
            "INT32",
            "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,8]",
        ),
        (
            {"INPUT0": [1, 16], "INPUT1": [1, 16]},
            "FP32",
            "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'",
        ),
        (
            {"INPUT0": [1, 16], "INPUT1": [1, 16], "INPUT9": [1, 16]},
            "INT32",
            "unexpected inference input 'INPUT9' for model 'simple'",
        ),
    ],
    ids=["batch", "count", "shape", "datatype", "unexpected input"],
)
def test_input_mismatches(
    client: Any, shapes: dict[str, list[int]], datatype: str, lead: str
) -> None:
    message = _error(lambda: client.infer("simple", _inputs(client, shapes, datatype)))
    assert message.startswith(lead), message
    assert "(sordino: " in message


def test_unknown_output(client: Any) -> None:
    inputs = _inputs(client, {"INPUT0": [1, 16], "INPUT1": [1, 16]})
    outputs = [_mod(client).InferRequestedOutput("OUTPUT9")]
    message = _error(lambda: client.infer("simple", inputs, outputs=outputs))
    assert message.startswith("unexpected inference output 'OUTPUT9' for model 'simple'")
