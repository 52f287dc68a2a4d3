"""Bad input over gRPC gets the right status and a message naming the problem; streams survive."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from sordino.protocol.pb import kserve_v2_pb2 as pb
from sordino.testing import RunningServer

INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


@pytest.fixture(scope="module")
def channel(server: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_url) as chan:
        yield chan


def _pixels(**overrides: Any) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="digits-classifier")
    tensor = request.inputs.add(name="pixels", datatype="FP32", shape=[1, 64])
    tensor.contents.fp32_contents.extend([1.0] * 64)
    for key, value in overrides.items():
        setattr(request, key, value)
    return request


def _raw_pixels(payload: bytes, datatype: str = "FP32") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="digits-classifier")
    request.inputs.add(name="pixels", datatype=datatype, shape=[1, 64])
    request.raw_input_contents.append(payload)
    return request


def _call(channel: grpc.Channel, payload: bytes) -> grpc.RpcError:
    infer = channel.unary_unary(INFER, response_deserializer=pb.ModelInferResponse.FromString)
    with pytest.raises(grpc.RpcError) as info:
        infer(payload, timeout=30)
    error = info.value
    assert isinstance(error, grpc.RpcError)
    return error


def _wrong_contents_field() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="digits-classifier")
    tensor = request.inputs.add(name="pixels", datatype="FP32", shape=[1, 64])
    tensor.contents.int_contents.extend([1] * 64)
    return request


def _too_few_values() -> pb.ModelInferRequest:
    request = _pixels()
    del request.inputs[0].contents.fp32_contents[10:]
    return request


def _two_raw_entries() -> pb.ModelInferRequest:
    request = _raw_pixels(np.ones(64, np.float32).tobytes())
    request.raw_input_contents.append(b"extra")
    return request


def _shared_memory() -> pb.ModelInferRequest:
    request = _pixels()
    request.inputs[0].parameters["shared_memory_region"].string_param = "region0"
    return request


def _bad_priority() -> pb.ModelInferRequest:
    request = _pixels()
    request.parameters["priority"].int64_param = 9
    return request


CASES: list[tuple[str, bytes, grpc.StatusCode, str]] = [
    ("garbage bytes", b"\xff\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT, "ModelInferRequest"),
    (
        "unknown model",
        _pixels(model_name="no-such-model").SerializeToString(),
        grpc.StatusCode.NOT_FOUND,
        "no-such-model",
    ),
    (
        "unknown version",
        _pixels(model_version="9").SerializeToString(),
        grpc.StatusCode.NOT_FOUND,
        "version",
    ),
    (
        # The unknown model wins over what is wrong with the message, as in Triton.
        "unknown model without inputs",
        pb.ModelInferRequest(model_name="no-such-model").SerializeToString(),
        grpc.StatusCode.NOT_FOUND,
        "no-such-model",
    ),
    (
        "wrong raw content length",
        _raw_pixels(b"\0" * 100).SerializeToString(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "raw_input_contents[0] holds 100 bytes",
    ),
    (
        "raw entries not one per input",
        _two_raw_entries().SerializeToString(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "one entry per input",
    ),
    (
        "datatype the model does not take",
        _raw_pixels(np.ones(64, np.int32).tobytes(), "INT32").SerializeToString(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "expects FP32",
    ),
    (
        "values in the wrong contents field",
        _wrong_contents_field().SerializeToString(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "contents.fp32_contents",
    ),
    (
        "value count does not fit the shape",
        _too_few_values().SerializeToString(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "holds 10 values",
    ),
    (
        "unknown datatype",
        _raw_pixels(b"", "FLOAT").SerializeToString(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "FLOAT",
    ),
    (
        "bad priority",
        _bad_priority().SerializeToString(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "priority",
    ),
    (
        "shared memory region without a byte size",
        _shared_memory().SerializeToString(),
        grpc.StatusCode.INVALID_ARGUMENT,
        "shared_memory_byte_size",
    ),
]


@pytest.mark.parametrize(
    ("payload", "code", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_gets_status_and_message(
    channel: grpc.Channel, payload: bytes, code: grpc.StatusCode, fragment: str
) -> None:
    error = _call(channel, payload)
    assert error.code() == code, error.details()
    assert fragment in (error.details() or "")


def test_plain_infer_on_a_streaming_model_points_to_streaming(channel: grpc.Channel) -> None:
    request = pb.ModelInferRequest(model_name="countdown")
    request.inputs.add(name="COUNT", datatype="INT32", shape=[1, 1]).contents.int_contents.append(2)
    error = _call(channel, request.SerializeToString())
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "ModelStreamInfer" in (error.details() or "")


def test_server_keeps_serving_after_bad_input(channel: grpc.Channel) -> None:
    _call(channel, b"\x0a\xff")
    infer = channel.unary_unary(INFER, response_deserializer=pb.ModelInferResponse.FromString)
    response = infer(_pixels().SerializeToString(), timeout=30)
    assert response.model_name == "digits-classifier"
    assert len(response.raw_output_contents[0]) == 10 * 4


def test_garbage_on_a_stream_errors_on_that_stream_only(channel: grpc.Channel) -> None:
    good = pb.ModelInferRequest(model_name="countdown", id="good")
    good.inputs.add(name="COUNT", datatype="INT32", shape=[1, 1]).contents.int_contents.append(1)
    outgoing: queue.Queue[bytes | None] = queue.Queue()

    def requests() -> Iterator[bytes]:
        while (item := outgoing.get(timeout=30)) is not None:
            yield item

    stream = channel.stream_stream(
        STREAM, response_deserializer=pb.ModelStreamInferResponse.FromString
    )
    other = channel.stream_stream(
        STREAM, response_deserializer=pb.ModelStreamInferResponse.FromString
    )
    responses = stream(requests(), timeout=60)
    outgoing.put(b"\xff\xff\xff")
    first = next(responses)
    assert "ModelInferRequest" in first.error_message
    # The same stream still serves, and so does another one.
    outgoing.put(good.SerializeToString())
    second = next(responses)
    assert second.error_message == "" and second.infer_response.id == "good"
    bad_tensor = pb.ModelInferRequest(model_name="countdown", id="bad")
    bad_tensor.inputs.add(name="COUNT", datatype="FP32", shape=[1, 1])
    outgoing.put(bad_tensor.SerializeToString())
    third = next(responses)
    assert third.infer_response.id == "bad" and "COUNT" in third.error_message
    outgoing.put(pb.ModelInferRequest(model_name="no-such-model", id="lost").SerializeToString())
    fourth = next(responses)  # the unknown model wins over the missing inputs
    assert fourth.infer_response.id == "lost"
    assert "unknown model 'no-such-model'" in fourth.error_message
    outgoing.put(None)
    assert list(responses) == []
    elsewhere = list(other(iter([good.SerializeToString()]), timeout=60))
    assert [r.error_message for r in elsewhere] == [""]
