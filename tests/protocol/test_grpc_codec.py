"""The gRPC codec: typed and raw tensors of every datatype, and each malformed case."""

from __future__ import annotations

import numpy as np
import pytest

from sordino.datatypes import DATATYPES, serialize_bytes_tensor, to_numpy_dtype
from sordino.errors import InvalidRequest, MalformedBody, TensorError
from sordino.inference import InferResponse, ModelMetadata, RequestedOutput, TensorSpec
from sordino.protocol.grpc_codec import (
    CONTENTS_FIELD,
    decode_infer_request,
    decode_parameters,
    encode_infer_response,
    parse_message,
)
from sordino.protocol.pb import kserve_v2_pb2 as pb


def _sample(datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([[b"a", b""], [b"\xff\x00", b"long text"]], dtype=object)
    if datatype == "BOOL":
        return np.array([[True, False], [False, True]])
    return np.arange(4).reshape(2, 2).astype(to_numpy_dtype(datatype))


def _request(datatype: str, array: np.ndarray, raw: bool) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m", id="7")
    tensor = message.inputs.add(name="x", datatype=datatype, shape=array.shape)
    if raw:
        data = (
            serialize_bytes_tensor(array)
            if datatype == "BYTES"
            else np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
        )
        message.raw_input_contents.append(data)
    else:
        field = CONTENTS_FIELD[datatype]
        assert field is not None
        getattr(tensor.contents, field).extend(array.reshape(-1).tolist())
    return message


@pytest.mark.parametrize("datatype", DATATYPES)
def test_raw_roundtrip_every_datatype(datatype: str) -> None:
    array = _sample(datatype)
    request = decode_infer_request(_request(datatype, array, raw=True))
    assert request.input_datatypes == {"x": datatype} and request.id == "7"
    np.testing.assert_array_equal(request.inputs["x"], array)
    response = InferResponse("m", "1", {"y": array}, {"y": datatype})
    encoded = encode_infer_response(response, request)
    assert encoded.outputs[0].datatype == datatype
    assert list(encoded.outputs[0].shape) == [2, 2]
    assert encoded.raw_output_contents[0] == _request(datatype, array, True).raw_input_contents[0]


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if CONTENTS_FIELD[d] is not None])
def test_typed_contents_every_datatype(datatype: str) -> None:
    array = _sample(datatype)
    decoded = decode_infer_request(_request(datatype, array, raw=False)).inputs["x"]
    assert decoded.dtype == to_numpy_dtype(datatype)
    np.testing.assert_array_equal(decoded, array)


def test_fp16_has_no_typed_field() -> None:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="FP16", shape=[1])
    with pytest.raises(TensorError, match="raw_input_contents"):
        decode_infer_request(message)


def test_narrow_integers_are_range_checked() -> None:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="INT8", shape=[2]).contents.int_contents.extend([1, 300])
    with pytest.raises(TensorError, match=r"element 1 is 300, out of range \[-128, 127\]"):
        decode_infer_request(message)


def test_values_and_raw_together_are_refused() -> None:
    message = _request("INT32", _sample("INT32"), raw=True)
    message.inputs[0].contents.int_contents.extend([1, 2, 3, 4])
    with pytest.raises(TensorError, match="one way"):
        decode_infer_request(message)


def test_request_shape_errors() -> None:
    with pytest.raises(MalformedBody, match="ModelInferRequest"):
        parse_message(pb.ModelInferRequest, b"\xff")
    empty = pb.ModelInferRequest(model_name="m")
    with pytest.raises(Exception, match="no inputs"):
        decode_infer_request(empty)
    twice = _request("INT32", _sample("INT32"), raw=False)
    twice.inputs.append(twice.inputs[0])
    with pytest.raises(TensorError, match="more than once"):
        decode_infer_request(twice)


def test_parameters_and_requested_outputs() -> None:
    message = _request("INT32", _sample("INT32"), raw=False)
    message.parameters["priority"].uint64_param = 1
    message.parameters["tag"].string_param = "premium"
    message.parameters["flag"].bool_param = True
    message.outputs.add(name="y")
    request = decode_infer_request(message)
    assert request.parameters == {"priority": 1, "tag": "premium", "flag": True}
    assert request.outputs == [RequestedOutput(name="y")]
    classify = _request("INT32", _sample("INT32"), raw=False)
    classify.outputs.add(name="y").parameters["classification"].int64_param = 3
    assert decode_infer_request(classify).outputs == [
        RequestedOutput(name="y", parameters={"classification": 3})
    ]
    classify.outputs[0].parameters["classification"].int64_param = 0
    with pytest.raises(InvalidRequest, match="classification is 0"):
        decode_infer_request(classify)
    unset = pb.ModelInferRequest()
    unset.parameters["p"].CopyFrom(pb.InferParameter())
    with pytest.raises(Exception, match="no value"):
        decode_parameters(unset.parameters, "the request")


def test_many_huge_dimensions_are_reported_without_formatting_huge_counts() -> None:
    """Without a model at hand the count is still bounded: no 4,300-digit integer to print."""
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="FP32", shape=[2**62] * 30)
    message.raw_input_contents.append(b"\0" * 4)
    with pytest.raises(TensorError, match="dimension 0 is 4611686018427387904"):
        decode_infer_request(message)
    message.inputs[0].shape.extend([2] * 5000)
    with pytest.raises(TensorError, match="5030 dimensions but a tensor has at most 32"):
        decode_infer_request(message)


def test_declared_shapes_are_checked_against_the_model() -> None:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="FP32", shape=[2**62] * 40_000)
    metadata = ModelMetadata(
        name="m",
        version="1",
        platform="onnxruntime_onnx",
        inputs=(TensorSpec("x", "FP32", (-1, 4)),),
        outputs=(),
        batched=True,
    )
    with pytest.raises(TensorError, match="40000 dimensions but model 'm' expects rank 2"):
        decode_infer_request(message, metadata=metadata, max_batch_size=8)


def test_empty_tensor_with_impossible_dimensions_is_refused() -> None:
    """No values and a zero dimension, but dimensions no message of this size could fill."""
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="FP16", shape=[0, 2**40, 2**40])
    with pytest.raises(TensorError, match="dimension 1 is 1099511627776, more than a 29-byte"):
        decode_infer_request(message)
