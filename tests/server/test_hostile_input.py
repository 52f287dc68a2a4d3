"""Hostile input over HTTP and gRPC: refused fast, without stalling anyone, never a 500.

The two stall cases of issue 20: a shape of 40,000 huge dimensions (840 KB of JSON,
whose element count once cost seconds of big-integer arithmetic and then failed to
print), and a 112-byte BYTES request declaring 2**28 elements (once a 2 GB array).
Both, for a model that exists and one that does not, are answered with a 4xx in well
under a second while a normal request running beside them is not held up.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import httpx
import orjson
import pytest

from sordino.protocol.pb import kserve_v2_pb2 as pb
from sordino.testing import RunningServer

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
BOUND_S = 1.0  # generous: the fixed server answers these in milliseconds
HUGE_SHAPE = [2**62 + i for i in range(40_000)]
PIXELS = {"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}


def _http_many_dims(model: str) -> tuple[str, bytes, dict[str, str]]:
    body = orjson.dumps(
        {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": HUGE_SHAPE, "data": [1.0]}]}
    )
    return model, body, {}


def _http_bytes_count(model: str, shape: list[int]) -> tuple[str, bytes, dict[str, str]]:
    spec = {"name": "text", "datatype": "BYTES", "shape": shape}
    header = orjson.dumps({"inputs": [{**spec, "parameters": {"binary_data_size": 4}}]})
    length = {"Inference-Header-Content-Length": str(len(header))}
    return model, header + struct.pack("<I", 0), length


HTTP_CASES = {
    # 800 KB of JSON header: more than any request to the digits classifier needs (413,
    # before it is parsed); to a model that takes any amount it is parsed and 400.
    "40,000 dimensions": (_http_many_dims("digits-classifier"), 413),
    "40,000 dimensions, unknown model": (_http_many_dims("no-such-model"), 404),
    "2**28 BYTES batch": (_http_bytes_count("text-normalizer", [2**28, 1]), 400),
    "2**28 BYTES elements": (_http_bytes_count("text-normalizer", [1, 2**28]), 400),
    "2**28 BYTES, unknown model": (_http_bytes_count("no-such-model", [2**28, 1]), 404),
}


def _grpc_many_dims(model: str) -> bytes:
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name="pixels", datatype="FP32", shape=HUGE_SHAPE)
    message.raw_input_contents.append(b"\0" * 4)
    return message.SerializeToString()


def _grpc_bytes_count(model: str, shape: list[int]) -> bytes:
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name="text", datatype="BYTES", shape=shape)
    message.raw_input_contents.append(struct.pack("<I", 0))
    return message.SerializeToString()


INVALID, NOT_FOUND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
GRPC_CASES = {
    "40,000 dimensions": (_grpc_many_dims("digits-classifier"), INVALID),
    "40,000 dimensions, unknown model": (_grpc_many_dims("no-such-model"), NOT_FOUND),
    "2**28 BYTES batch": (_grpc_bytes_count("text-normalizer", [2**28, 1]), INVALID),
    "2**28 BYTES elements": (_grpc_bytes_count("text-normalizer", [1, 2**28]), INVALID),
    "2**28 BYTES, unknown model": (_grpc_bytes_count("no-such-model", [2**28, 1]), NOT_FOUND),
}


@pytest.fixture(scope="module")
def channel(server: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_url) as chan:
        yield chan


def _beside(hostile: Callable[[], float], normal: Callable[[], None]) -> list[float]:
    """Run ``hostile`` three times at once while timing normal requests; return their times."""
    with ThreadPoolExecutor(3) as pool:
        refusals = [pool.submit(hostile) for _ in range(3)]
        latencies = []
        while not all(f.done() for f in refusals) or not latencies:
            started = time.perf_counter()
            normal()
            latencies.append(time.perf_counter() - started)
        for refusal in refusals:
            assert refusal.result() < BOUND_S
    return latencies


@pytest.mark.parametrize(("case", "status"), HTTP_CASES.values(), ids=list(HTTP_CASES))
def test_http_stall_cases_are_refused_fast_and_stall_nobody(
    server: RunningServer, case: tuple[str, bytes, dict[str, str]], status: int
) -> None:
    model, body, headers = case
    with (
        httpx.Client(base_url=server.url, timeout=60) as hostile,
        httpx.Client(base_url=server.url, timeout=60) as normal,
    ):

        def refuse() -> float:
            started = time.perf_counter()
            response = hostile.post(f"/v2/models/{model}/infer", content=body, headers=headers)
            assert response.status_code == status, response.text
            assert response.json()["error"]
            return time.perf_counter() - started

        def infer() -> None:
            response = normal.post("/v2/models/digits-classifier/infer", json={"inputs": [PIXELS]})
            assert response.status_code == 200

        infer()  # warm the connection and the model
        assert max(_beside(refuse, infer)) < BOUND_S


@pytest.mark.parametrize(("payload", "code"), GRPC_CASES.values(), ids=list(GRPC_CASES))
def test_grpc_stall_cases_are_refused_fast_and_stall_nobody(
    channel: grpc.Channel, payload: bytes, code: grpc.StatusCode
) -> None:
    infer = channel.unary_unary(INFER, response_deserializer=pb.ModelInferResponse.FromString)
    normal = pb.ModelInferRequest(model_name="digits-classifier")
    tensor = normal.inputs.add(name="pixels", datatype="FP32", shape=[1, 64])
    tensor.contents.fp32_contents.extend([1.0] * 64)

    def refuse() -> float:
        started = time.perf_counter()
        with pytest.raises(grpc.RpcError) as info:
            infer(payload, timeout=60)
        assert info.value.code() == code, info.value.details()
        return time.perf_counter() - started

    def run() -> None:
        infer(normal.SerializeToString(), timeout=60)

    run()
    assert max(_beside(refuse, run)) < BOUND_S


HUGE_PRIORITIES = ["9" * 5000, "-" + "9" * 5000, "0" * 5000 + "7", "²"]


@pytest.mark.parametrize("priority", HUGE_PRIORITIES, ids=["digits", "negative", "zeros", "²"])
def test_http_priority_string_beyond_int_limits_is_a_400(
    server: RunningServer, priority: str
) -> None:
    body = {"inputs": [PIXELS], "parameters": {"priority": priority}}
    response = httpx.post(f"{server.url}/v2/models/digits-classifier/infer", json=body, timeout=30)
    assert response.status_code == 400
    assert "priorit" in response.json()["error"]


@pytest.mark.parametrize("priority", HUGE_PRIORITIES, ids=["digits", "negative", "zeros", "²"])
def test_grpc_priority_string_beyond_int_limits_is_invalid_argument(
    channel: grpc.Channel, priority: str
) -> None:
    message = pb.ModelInferRequest(model_name="digits-classifier")
    tensor = message.inputs.add(name="pixels", datatype="FP32", shape=[1, 64])
    tensor.contents.fp32_contents.extend([1.0] * 64)
    message.parameters["priority"].string_param = priority
    infer = channel.unary_unary(INFER, response_deserializer=pb.ModelInferResponse.FromString)
    with pytest.raises(grpc.RpcError) as info:
        infer(message.SerializeToString(), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "priorit" in (info.value.details() or "")


def test_http_header_length_of_thousands_of_digits_is_a_400(server: RunningServer) -> None:
    response = httpx.post(
        f"{server.url}/v2/models/digits-classifier/infer",
        content=orjson.dumps({"inputs": [PIXELS]}),
        headers={"Inference-Header-Content-Length": "9" * 5000},
        timeout=30,
    )
    assert response.status_code == 400
    assert "Inference-Header-Content-Length" in response.json()["error"]


def test_grpc_error_details_are_cut_to_fit_the_trailer(channel: grpc.Channel) -> None:
    """A 100,000-character model name is echoed cut short, not as an oversized trailer."""
    infer = channel.unary_unary(INFER, response_deserializer=pb.ModelInferResponse.FromString)
    message = pb.ModelInferRequest(model_name="é" * 100_000)
    with pytest.raises(grpc.RpcError) as info:
        infer(message.SerializeToString(), timeout=30)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert (info.value.details() or "").endswith("(message cut)")


# --- ModelStreamInfer: every request ends with its own response or error ----------------


def _countdown(request_id: str, count: int) -> bytes:
    message = pb.ModelInferRequest(model_name="countdown", id=request_id)
    tensor = message.inputs.add(name="COUNT", datatype="INT32", shape=[1, 1])
    tensor.contents.int_contents.append(count)
    return message.SerializeToString()


def test_stream_request_that_fails_unexpectedly_ends_alone(
    channel: grpc.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug hit by one request answers that request with an error; the stream goes on."""
    import sordino.server.grpc as grpc_server

    decode = grpc_server.decode_infer_request

    def failing(message: pb.ModelInferRequest, **kwargs: Any) -> Any:
        if message.id == "boom":
            raise RuntimeError("an unexpected bug")
        return decode(message, **kwargs)

    monkeypatch.setattr(grpc_server, "decode_infer_request", failing)
    requests = [
        _countdown("a", 3),
        _countdown("boom", 1),
        b"\xff\xff\xff",
        _countdown("b", 2),
        _countdown("c", 0),
    ]
    stream = channel.stream_stream(
        STREAM, response_deserializer=pb.ModelStreamInferResponse.FromString
    )
    responses = list(stream(iter(requests), timeout=60))  # raises unless the stream ends OK
    errors = {r.infer_response.id: r.error_message for r in responses if r.error_message}
    finals = [
        r.infer_response.id
        for r in responses
        if not r.error_message and r.infer_response.parameters["triton_final_response"].bool_param
    ]
    assert sorted(finals) == ["a", "b", "c"]
    assert errors["boom"] == "internal error: RuntimeError: an unexpected bug"
    assert "ModelInferRequest" in errors[""]
    assert len(errors) == 2
