"""Triton's example models (``sordino start --with-triton-examples``) with Triton's clients.

Each test does what Triton's example client program for the model does
(simple_http_string_infer_client, simple_grpc_string_infer_client and the INT8 variant)
and checks what it checks.
"""

from __future__ import annotations

import queue
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


def _repeat_inputs(values: list[int]) -> list[Any]:
    array = np.array(values, dtype=np.int32)
    inputs = [
        grpcclient.InferInput("IN", [len(values)], "INT32"),
        grpcclient.InferInput("DELAY", [len(values)], "UINT32"),
        grpcclient.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(array)
    inputs[1].set_data_from_numpy(np.zeros(len(values), dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.zeros(1, dtype=np.uint32))
    return inputs


def _stream(examples: RunningServer, values: list[int], *, empty_final: bool) -> list[Any]:
    """Send one request to repeat_int32 over ModelStreamInfer; every response, in order."""
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(examples.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer(
        "repeat_int32", _repeat_inputs(values), request_id="r",
        enable_empty_final_response=empty_final,
    )  # fmt: skip
    got = []
    while True:
        result, error = answers.get(timeout=30)
        assert error is None, error
        got.append(result)
        final = result.get_response().parameters["triton_final_response"].bool_param
        if final or (not empty_final and len(got) == len(values)):
            break
    client.stop_stream()
    client.close()
    return got


def test_repeat_int32_sends_one_response_per_element(examples: RunningServer) -> None:
    """Triton's decoupled repeat example: many responses to one request, in order."""
    got = _stream(examples, [4, 2, 0, 1], empty_final=False)
    assert [int(r.as_numpy("OUT")[0]) for r in got] == [4, 2, 0, 1]
    assert [int(r.as_numpy("IDX")[0]) for r in got] == [0, 1, 2, 3]
    flags = [r.get_response().parameters["triton_final_response"].bool_param for r in got]
    assert flags == [False, False, False, True]


def test_repeat_int32_empty_final_response(examples: RunningServer) -> None:
    """Asked for, the end comes as an empty response flagged final; an empty IN gets only it."""
    got = _stream(examples, [7, 8], empty_final=True)
    assert [int(r.as_numpy("OUT")[0]) for r in got[:2]] == [7, 8]
    assert len(got) == 3 and not got[2].get_response().outputs
    none = _stream(examples, [], empty_final=True)
    assert len(none) == 1 and not none[0].get_response().outputs


def test_repeat_int32_state_input_is_the_models_own(examples: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(examples.grpc_url)
    inputs = _repeat_inputs([1])
    pos = grpcclient.InferInput("POS", [1], "INT32")
    pos.set_data_from_numpy(np.zeros(1, dtype=np.int32))
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer("repeat_int32", [*inputs, pos])
    _, error = answers.get(timeout=30)
    client.stop_stream()
    client.close()
    assert error is not None and "the model's own state" in str(error)
