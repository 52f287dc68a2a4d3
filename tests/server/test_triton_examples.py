"""Triton's example models (``sordino start --with-triton-examples``) with Triton's clients.

Each test does what Triton's example client program for the model does
(simple_http_string_infer_client, simple_grpc_string_infer_client and the INT8 variant)
and checks what it checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from sordino.models.repository import builtin_sources, triton_example_sources
from sordino.testing import RunningServer, serve_in_thread


@pytest.fixture(scope="module")
def examples() -> Iterator[RunningServer]:
    simple = [s for s in builtin_sources() if s.name == "simple"]
    with serve_in_thread(sources=simple + triton_example_sources()) as running:
        yield running


@pytest.fixture(params=["http", "grpc"])
def client(examples: RunningServer, request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "http":
        client: Any = httpclient.InferenceServerClient(url=examples.url.removeprefix("http://"))
    else:
        client = grpcclient.InferenceServerClient(examples.grpc_url)
    yield client
    client.close()


def _mod(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def test_simple_string(client: Any) -> None:
    mod = _mod(client)
    in0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    in1 = np.ones((1, 16), dtype=np.int32)
    strings0 = np.array([str(x).encode() for x in in0.ravel()], dtype=object).reshape(1, 16)
    strings1 = np.array([str(x).encode() for x in in1.ravel()], dtype=object).reshape(1, 16)
    inputs = [
        mod.InferInput("INPUT0", [1, 16], "BYTES"),
        mod.InferInput("INPUT1", [1, 16], "BYTES"),
    ]
    inputs[0].set_data_from_numpy(strings0)
    inputs[1].set_data_from_numpy(strings1)
    outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
    result = client.infer("simple_string", inputs, outputs=outputs)
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    for i in range(16):
        assert int(out0[0][i]) == in0[0][i] + in1[0][i]
        assert int(out1[0][i]) == in0[0][i] - in1[0][i]
    config = client.get_model_config("simple_string")
    max_batch = (
        config["max_batch_size"] if isinstance(config, dict) else config.config.max_batch_size
    )
    assert max_batch == 8


def test_simple_int8(client: Any) -> None:
    mod = _mod(client)
    in0 = np.arange(16, dtype=np.int8).reshape(1, 16)
    in1 = np.ones((1, 16), dtype=np.int8)
    inputs = [mod.InferInput("INPUT0", [1, 16], "INT8"), mod.InferInput("INPUT1", [1, 16], "INT8")]
    inputs[0].set_data_from_numpy(in0)
    inputs[1].set_data_from_numpy(in1)
    result = client.infer("simple_int8", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), in0 + in1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), in0 - in1)
    assert result.as_numpy("OUTPUT0").dtype == np.int8
