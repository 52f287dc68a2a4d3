"""The KServe v2 codec: JSON and binary request bodies in, response bodies out."""

from __future__ import annotations

import struct
import time
from typing import Any

import numpy as np
import orjson
import pytest

from sordino.datatypes import from_numpy_dtype
from sordino.errors import InferenceFailed, InvalidRequest, MalformedBody, TensorError
from sordino.inference import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    RequestedOutput,
    TensorSpec,
)
from sordino.protocol.codec import HEADER_CONTENT_LENGTH, decode_infer_request, parse_header_length
from sordino.protocol.encode import encode_error, encode_infer_response, encode_json

# datatype -> (JSON data, numpy dtype); values probe each type's edges.
JSON_CASES: dict[str, tuple[list[Any], Any]] = {
    "BOOL": ([True, False, True, True], np.bool_),
    "UINT8": ([0, 1, 254, 255], np.uint8),
    "UINT16": ([0, 1, 2, 65535], np.uint16),
    "UINT32": ([0, 1, 2, 2**32 - 1], np.uint32),
    "UINT64": ([0, 1, 2**63, 2**64 - 1], np.uint64),
    "INT8": ([-128, -1, 0, 127], np.int8),
    "INT16": ([-(2**15), -1, 0, 2**15 - 1], np.int16),
    "INT32": ([-(2**31), -1, 0, 2**31 - 1], np.int32),
    "INT64": ([-(2**63), -1, 0, 2**63 - 1], np.int64),
    "FP16": ([0.5, -1.5, 2.0, 65504.0], np.float16),
    "FP32": ([0.25, -1.5, 3.0, 16777216.0], np.float32),
    "FP64": ([0.1, -1e300, 1e-300, 2.0], np.float64),
    "BYTES": (["héllo", "", "a b", "日本"], np.object_),
}


def decode(body: bytes, header_length: int | None = None) -> InferRequest:
    return decode_infer_request(body, model="m", version="1", header_length=header_length)


def json_request(*inputs: dict[str, Any], **extra: Any) -> InferRequest:
    return decode(orjson.dumps({"inputs": list(inputs), **extra}))


def tensor(name: str, datatype: str, shape: list[Any], data: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def raw_bytes(datatype: str, array: np.ndarray[Any, Any]) -> bytes:
    """Serialize like tritonclient does, independently of sordino."""
    if datatype == "BYTES":
        items = [x if isinstance(x, bytes) else x.encode() for x in array.ravel().tolist()]
        return b"".join(struct.pack("<I", len(x)) + x for x in items)
    return array.astype(array.dtype.newbyteorder("<")).tobytes()


def binary_body(*parts: tuple[dict[str, Any], bytes], **extra: Any) -> tuple[bytes, int]:
    """Build a JSON header plus concatenated raw input bytes, as tritonclient does."""
    header = orjson.dumps({"inputs": [spec for spec, _ in parts], **extra})
    return header + b"".join(raw for _, raw in parts), len(header)


def binary_input(
    name: str, datatype: str, array: np.ndarray[Any, Any]
) -> tuple[dict[str, Any], bytes]:
    raw = raw_bytes(datatype, array)
    spec = {
        "name": name,
        "datatype": datatype,
        "shape": list(array.shape),
        "parameters": {"binary_data_size": len(raw)},
    }
    return spec, raw


def response(**outputs: np.ndarray[Any, Any]) -> InferResponse:
    return InferResponse(
        model="m",
        version="1",
        outputs=dict(outputs),
        output_datatypes={name: from_numpy_dtype(arr.dtype) for name, arr in outputs.items()},
    )


def request_for(outputs: list[RequestedOutput] | None = None, **parameters: Any) -> InferRequest:
    return InferRequest(model="m", inputs={}, outputs=outputs, parameters=parameters)


def split_binary(body: bytes, headers: dict[str, str]) -> tuple[dict[str, Any], bytes]:
    length = int(headers[HEADER_CONTENT_LENGTH])
    return orjson.loads(body[:length]), body[length:]


# --- JSON inputs -------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(JSON_CASES))
def test_json_input_decodes_every_datatype(datatype: str) -> None:
    """JSON data of each datatype becomes an array of its numpy dtype and values."""
    data, dtype = JSON_CASES[datatype]
    request = json_request(tensor("x", datatype, [2, 2], data))
    array = request.inputs["x"]
    assert array.dtype == np.dtype(dtype)
    assert array.shape == (2, 2)
    expected = [s.encode() for s in data] if datatype == "BYTES" else data
    assert array.ravel().tolist() == expected


@pytest.mark.parametrize("datatype", list(JSON_CASES))
def test_json_round_trip_every_datatype(datatype: str) -> None:
    """A JSON input sent back as a JSON output carries the same data."""
    data, _ = JSON_CASES[datatype]
    request = json_request(tensor("x", datatype, [4], data))
    body, headers = encode_infer_response(response(y=request.inputs["x"]), request)
    assert headers == {"Content-Type": "application/json"}
    (output,) = orjson.loads(body)["outputs"]
    assert output == {"name": "y", "datatype": datatype, "shape": [4], "data": data}


def test_json_input_accepts_nested_lists() -> None:
    """Nested row-major lists give the same array as the flat list."""
    request = json_request(tensor("x", "FP32", [2, 3], [[1, 2, 3], [4, 5, 6]]))
    np.testing.assert_array_equal(request.inputs["x"], np.arange(1, 7).reshape(2, 3))


def test_json_bytes_input_accepts_nested_lists() -> None:
    """Nested lists of strings flatten in row-major order."""
    request = json_request(tensor("s", "BYTES", [2, 1], [["a"], ["b"]]))
    assert request.inputs["s"].tolist() == [[b"a"], [b"b"]]


def test_json_uint64_mixing_small_and_huge_values_stays_exact() -> None:
    """[1, 2**64 - 1] is not routed through float64 and keeps every bit."""
    request = json_request(tensor("x", "UINT64", [2], [1, 2**64 - 1]))
    assert request.inputs["x"].tolist() == [1, 2**64 - 1]


def test_json_fp_input_accepts_integers() -> None:
    """Integers are valid FP data."""
    assert json_request(tensor("x", "FP64", [2], [1, 2])).inputs["x"].dtype == np.float64


def test_json_scalar_shape_takes_one_element() -> None:
    """Shape [] holds exactly one element."""
    assert json_request(tensor("x", "INT64", [], [7])).inputs["x"].shape == ()


def test_json_empty_tensor_has_target_dtype() -> None:
    """A zero-element tensor gets the declared dtype, not numpy's float64 default."""
    array = json_request(tensor("x", "INT8", [0, 3], [])).inputs["x"]
    assert array.shape == (0, 3)
    assert array.dtype == np.int8


def test_json_count_mismatch_names_both_counts() -> None:
    """An element count that does not match the shape names the input and both numbers."""
    with pytest.raises(TensorError, match=r"'x' has shape \[2, 3\] \(6 elements\).*holds 5"):
        json_request(tensor("x", "FP32", [2, 3], [1, 2, 3, 4, 5]))


def test_json_ragged_nested_list_is_rejected() -> None:
    """Nested lists of unequal length are a TensorError naming the input."""
    with pytest.raises(TensorError, match=r"'x'.*ragged"):
        json_request(tensor("x", "FP32", [3], [[1, 2], [3]]))


def test_json_string_in_numeric_slot_is_rejected() -> None:
    """A string in FP32 data names the input, the datatype and the element."""
    with pytest.raises(
        TensorError, match=r"input 'x' has datatype FP32 but element 1 is the string"
    ):
        json_request(tensor("x", "FP32", [2], [1.0, "2"]))


def test_json_number_in_bytes_slot_is_rejected() -> None:
    """A number in BYTES data names the input and the datatype."""
    with pytest.raises(
        TensorError, match="input 's' has datatype BYTES but element 0 is the number"
    ):
        json_request(tensor("s", "BYTES", [1], [5]))


def test_json_float_in_int_slot_is_rejected() -> None:
    """A float in INT32 data is rejected, as Triton does."""
    with pytest.raises(TensorError, match=r"'x' has datatype INT32 but element 1 is 2.5, not an"):
        json_request(tensor("x", "INT32", [2], [1, 2.5]))


@pytest.mark.parametrize(
    ("datatype", "value"),
    [("UINT8", 300), ("UINT64", -1), ("INT64", 2**63), ("UINT64", 2**64), ("INT8", -129)],
)
def test_json_integer_out_of_range_is_rejected(datatype: str, value: int) -> None:
    """An integer the datatype cannot hold is a TensorError, never wrapped around."""
    # Written by hand: orjson cannot dump integers beyond 64 bits.
    body = (
        f'{{"inputs": [{{"name": "x", "datatype": "{datatype}", "shape": [2], '
        f'"data": [0, {value}]}}]}}'
    ).encode()
    with pytest.raises(TensorError, match=rf"'x' has datatype {datatype} .* out of range"):
        decode(body)


@pytest.mark.parametrize(("datatype", "value"), [("FP16", 70000), ("FP32", 1e39)])
def test_json_float_out_of_range_is_rejected(datatype: str, value: float) -> None:
    """A number that would overflow to infinity is a TensorError."""
    with pytest.raises(TensorError, match=rf"'x' has datatype {datatype} but element 1 .*out of"):
        json_request(tensor("x", datatype, [2], [1, value]))


def test_json_booleans_in_int_slot_are_rejected() -> None:
    """true/false are not integers."""
    with pytest.raises(TensorError, match="'x' has datatype INT32 but element 0 is the boolean"):
        json_request(tensor("x", "INT32", [2], [True, False]))


def test_json_integers_in_bool_slot_are_rejected() -> None:
    """0/1 are not booleans."""
    with pytest.raises(TensorError, match=r"'b' has datatype BOOL but element 0 .*true or false"):
        json_request(tensor("b", "BOOL", [2], [0, 1]))


def test_json_null_element_is_rejected() -> None:
    """null is no number."""
    with pytest.raises(TensorError, match="'x' has datatype FP32 but element 1 is null"):
        json_request(tensor("x", "FP32", [2], [1, None]))


def test_json_data_must_be_a_list() -> None:
    """A bare scalar as data is rejected with a hint."""
    with pytest.raises(TensorError, match="input 'x': 'data' must be a list"):
        json_request(tensor("x", "FP32", [1], 1.0))


# --- binary inputs -----------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(JSON_CASES))
def test_binary_input_decodes_every_datatype(datatype: str) -> None:
    """Binary data of each datatype decodes to the array that was sent."""
    data, dtype = JSON_CASES[datatype]
    array = np.array(data if datatype != "BYTES" else [s.encode() for s in data], dtype=dtype)
    body, length = binary_body(binary_input("x", datatype, array.reshape(2, 2)))
    decoded = decode(body, length).inputs["x"]
    assert decoded.dtype == np.dtype(dtype)
    assert decoded.shape == (2, 2)
    assert decoded.ravel().tolist() == array.tolist()


def test_binary_input_is_a_zero_copy_view_on_the_body() -> None:
    """Fixed-size binary inputs are read-only views, not copies."""
    body, length = binary_body(binary_input("x", "FP32", np.ones((4, 8), np.float32)))
    decoded = decode(body, length).inputs["x"]
    assert not decoded.flags.owndata
    assert not decoded.flags.writeable


def test_binary_inputs_take_their_bytes_in_input_order() -> None:
    """Binary inputs split the trailing bytes in order; JSON inputs in between take none."""
    a = np.arange(3, dtype=np.int64)
    b = np.array([b"xy", b"z"], dtype=object)
    body, length = binary_body(
        binary_input("a", "INT64", a),
        (tensor("j", "FP32", [1], [0.5]), b""),
        binary_input("b", "BYTES", b),
    )
    request = decode(body, length)
    assert request.inputs["a"].tolist() == [0, 1, 2]
    assert request.inputs["j"].tolist() == [0.5]
    assert request.inputs["b"].tolist() == [b"xy", b"z"]


def test_binary_bytes_input_with_no_elements() -> None:
    """A zero-element BYTES input has binary_data_size 0."""
    body, length = binary_body(binary_input("s", "BYTES", np.empty((0,), dtype=object)))
    assert decode(body, length).inputs["s"].shape == (0,)


def test_binary_size_must_match_shape_and_datatype() -> None:
    """binary_data_size that disagrees with shape × element size names both."""
    spec = {"name": "x", "datatype": "FP32", "shape": [3], "parameters": {"binary_data_size": 8}}
    body, length = binary_body((spec, b"\x00" * 8))
    with pytest.raises(TensorError, match=r"'x' has shape \[3\] \(3 FP32 elements, 12 bytes\).*8"):
        decode(body, length)


def test_binary_bytes_input_must_hold_exactly_count_elements() -> None:
    """BYTES binary data with too few elements names the input."""
    spec = {"name": "s", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 5}}
    body, length = binary_body((spec, struct.pack("<I", 1) + b"a"))
    with pytest.raises(TensorError, match="input 's': BYTES data ends after 1 of 2"):
        decode(body, length)


def test_binary_bool_bytes_must_be_zero_or_one() -> None:
    """A BOOL byte other than 0 or 1 is rejected."""
    spec = {"name": "b", "datatype": "BOOL", "shape": [2], "parameters": {"binary_data_size": 2}}
    body, length = binary_body((spec, b"\x01\x07"))
    with pytest.raises(TensorError, match=r"'b' is BOOL but byte 1 .* is 7"):
        decode(body, length)


def test_binary_sizes_must_cover_the_whole_body() -> None:
    """Extra bytes after the declared binary data are bad framing."""
    body, length = binary_body(binary_input("x", "INT8", np.zeros(4, np.int8)))
    with pytest.raises(MalformedBody, match=r"holds 5 bytes .*\('x': 4\) add up to 4"):
        decode(body + b"!", length)


def test_binary_sizes_beyond_the_body_are_rejected() -> None:
    """A body shorter than the declared binary data is bad framing."""
    body, length = binary_body(binary_input("x", "INT8", np.zeros(4, np.int8)))
    with pytest.raises(MalformedBody, match="holds 3 bytes"):
        decode(body[:-1], length)


def test_a_repeated_binary_header_gives_each_request_its_own_parts() -> None:
    """The JSON header of a binary body is read once and kept (clients repeat it): each
    request still gets its own tensors, parameters and outputs, which the service may
    change without touching the next request's."""
    outputs = [{"name": "y", "parameters": {"binary_data": True}}]
    first_body, length = binary_body(
        binary_input("x", "INT32", np.arange(3, dtype=np.int32)),
        parameters={"priority": 2},
        outputs=outputs,
    )
    second_body, again = binary_body(
        binary_input("x", "INT32", np.arange(10, 13, dtype=np.int32)),
        parameters={"priority": 2},
        outputs=outputs,
    )
    assert first_body[:length] == second_body[:again]
    first, second = decode(first_body, length), decode(second_body, again)
    assert first.inputs["x"].tolist() == [0, 1, 2]
    assert second.inputs["x"].tolist() == [10, 11, 12]
    first.parameters["tenant"] = "a"
    first.input_datatypes["extra"] = "BOOL"
    assert first.outputs is not None
    first.outputs.clear()
    assert second.parameters == {"priority": 2}
    assert second.input_datatypes == {"x": "INT32"}
    assert second.outputs == [RequestedOutput(name="y", binary=True)]
    assert decode(first_body, length).parameters == {"priority": 2}


def test_a_repeated_binary_header_is_checked_against_each_body() -> None:
    """A header read before is still checked against each body: its framing, and its
    shapes against the body's size; a wrong header is refused every time it comes."""
    body, length = binary_body(binary_input("x", "INT8", np.zeros(4, np.int8)))
    assert decode(body, length).inputs["x"].shape == (4,)
    with pytest.raises(MalformedBody, match=r"holds 5 bytes .*\('x': 4\) add up to 4"):
        decode(body + b"!", length)
    with pytest.raises(MalformedBody, match="holds 3 bytes"):
        decode(body[:-1], length)
    bad = orjson.dumps({"inputs": [{"name": "x", "datatype": "INT8", "shape": [4]}]})
    for _ in range(2):
        with pytest.raises(TensorError, match=r"neither 'data' nor parameters\.binary_data_size"):
            decode(bad + b"\x00" * 4, len(bad))


def test_a_binary_header_reports_its_inputs_before_its_outputs() -> None:
    """With both wrong, the inputs' error is the one reported, the first time and the
    next (the header is not kept half read); the outputs' error once the inputs are right."""
    spec = {"name": "x", "datatype": "FP32", "shape": [3], "parameters": {"binary_data_size": 8}}
    body, length = binary_body((spec, b"\x00" * 8), outputs=[{"name": ""}])
    for _ in range(2):
        with pytest.raises(TensorError, match=r"'x' has shape \[3\]"):
            decode(body, length)
    body, length = binary_body(
        binary_input("x", "INT8", np.zeros(2, np.int8)), outputs=[{"name": ""}]
    )
    for _ in range(2):
        with pytest.raises(TensorError, match="outputs\\[0\\] has no 'name'"):
            decode(body, length)


def test_binary_data_without_header_length_is_rejected() -> None:
    """binary_data_size without Inference-Header-Content-Length says to set the header."""
    spec = {"name": "x", "datatype": "INT8", "shape": [1], "parameters": {"binary_data_size": 1}}
    with pytest.raises(MalformedBody, match=f"'x': 1.*no {HEADER_CONTENT_LENGTH} header"):
        decode(orjson.dumps({"inputs": [spec]}))


@pytest.mark.parametrize("length", [-1, 10_000])
def test_header_length_outside_the_body_is_rejected(length: int) -> None:
    """A header length that is negative or past the end of the body is MalformedBody."""
    body, _ = binary_body(binary_input("x", "INT8", np.zeros(4, np.int8)))
    with pytest.raises(MalformedBody, match=f"{HEADER_CONTENT_LENGTH} is {length}"):
        decode(body, length)


def test_header_length_that_cuts_the_json_is_rejected() -> None:
    """A header length that splits the JSON reports invalid JSON in that many bytes."""
    body, length = binary_body(binary_input("x", "INT8", np.zeros(4, np.int8)))
    with pytest.raises(MalformedBody, match=f"first {length - 1} bytes .* not valid JSON"):
        decode(body, length - 1)


def test_parse_header_length_reads_an_integer() -> None:
    """The header value is parsed as a byte count; absent is None."""
    assert (parse_header_length("42"), parse_header_length(None)) == (42, None)


@pytest.mark.parametrize("value", ["abc", "-3", "", "1_000"])
def test_parse_header_length_rejects_non_counts(value: str) -> None:
    """A header value that is no byte count is MalformedBody."""
    with pytest.raises(MalformedBody, match=HEADER_CONTENT_LENGTH):
        parse_header_length(value)


# --- request structure -------------------------------------------------------------------


def test_request_keeps_id_parameters_datatypes_and_headers() -> None:
    """id, request parameters (verbatim), input datatypes and headers are carried over."""
    params = {"priority": 2, "tag": {"team": "a"}, "binary_data_output": True}
    body = orjson.dumps(
        {"id": "r1", "parameters": params, "inputs": [tensor("x", "INT32", [1], [1])]}
    )
    request = decode_infer_request(
        body, model="m", version="3", header_length=None, headers={"x-tenant": "t"}
    )
    assert (request.model, request.version, request.id) == ("m", "3", "r1")
    assert request.parameters == params
    assert request.input_datatypes == {"x": "INT32"}
    assert request.headers == {"x-tenant": "t"}
    assert request.outputs is None


def test_requested_outputs_keep_binary_flag_and_other_parameters() -> None:
    """binary_data becomes RequestedOutput.binary; other output parameters are kept."""
    outputs = [
        {"name": "a", "parameters": {"binary_data": True, "custom": 1}},
        {"name": "b", "parameters": {"binary_data": False}},
        {"name": "c"},
    ]
    request = json_request(tensor("x", "INT32", [1], [1]), outputs=outputs)
    assert request.outputs == [
        RequestedOutput("a", True, {"custom": 1}),
        RequestedOutput("b", False, {}),
        RequestedOutput("c", None, {}),
    ]


def test_empty_outputs_list_means_every_output() -> None:
    """ "outputs": [] asks for nothing in particular: every output is returned."""
    assert json_request(tensor("x", "INT32", [1], [1]), outputs=[]).outputs is None


@pytest.mark.parametrize("count", [0, -1, "3", True, 2.5])
def test_classification_count_is_checked(count: object) -> None:
    """The classification count must be a positive integer."""
    outputs = [{"name": "p", "parameters": {"classification": count}}]
    with pytest.raises(InvalidRequest, match="'p': classification is"):
        json_request(tensor("x", "INT32", [1], [1]), outputs=outputs)


def test_shared_memory_input_is_left_to_the_server() -> None:
    """An input in a shared memory region is recorded, to be read from the region."""
    spec = {"name": "x", "datatype": "INT8", "shape": [4], "parameters": {}}
    spec["parameters"] = {
        "shared_memory_region": "r",
        "shared_memory_byte_size": 4,
        "shared_memory_offset": 8,
    }
    request = json_request(spec)
    assert "x" not in request.inputs and request.input_datatypes == {"x": "INT8"}
    (shared,) = request.shared_inputs
    assert (shared.region, shared.byte_size, shared.offset, shared.shape) == ("r", 4, 8, (4,))


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"shared_memory_region": "r"}, "shared_memory_byte_size is None"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": -1}, "non-negative"),
        ({"shared_memory_region": 3, "shared_memory_byte_size": 1}, "registered region"),
        ({"shared_memory_byte_size": 4}, "no shared_memory_region"),
    ],
)
def test_shared_memory_parameters_are_checked(parameters: dict[str, Any], message: str) -> None:
    spec = {"name": "x", "datatype": "INT8", "shape": [4], "parameters": parameters}
    with pytest.raises(InvalidRequest, match=message):
        json_request(spec)


def test_shared_memory_input_with_data_is_refused() -> None:
    spec = tensor("x", "INT8", [1], [1])
    spec["parameters"] = {"shared_memory_region": "r", "shared_memory_byte_size": 1}
    with pytest.raises(TensorError, match="send its values one way only"):
        json_request(spec)


def test_invalid_json_is_malformed() -> None:
    """A body that is not JSON is MalformedBody."""
    with pytest.raises(MalformedBody, match="the request body is not valid JSON"):
        decode(b"{inputs:")


def test_json_that_is_not_an_object_is_malformed() -> None:
    """A JSON list body is MalformedBody."""
    with pytest.raises(MalformedBody, match=r"must be a JSON object.*got a list"):
        decode(b"[]")


def test_missing_inputs_is_malformed() -> None:
    """A request without 'inputs' is MalformedBody showing the expected form."""
    with pytest.raises(MalformedBody, match="no 'inputs' list"):
        decode(b'{"id": "a"}')


@pytest.mark.parametrize(
    ("entry", "error", "message"),
    [
        ("nope", InvalidRequest, r"inputs\[0\] must be a JSON object"),
        (
            {"datatype": "FP32", "shape": [1], "data": [1]},
            TensorError,
            r"inputs\[0\] has no 'name'",
        ),
        (tensor("x", "FLOAT", [1], [1]), TensorError, "'x' has datatype 'FLOAT'; use one of BOOL"),
        (tensor("x", "FP32", [-1], []), TensorError, "'x' has shape .* non-negative integers"),
        (tensor("x", "FP32", [1.0], [1]), TensorError, "'x' has shape"),
        (tensor("x", "FP32", [True], [1]), TensorError, "'x' has shape"),
        ({"name": "x", "datatype": "FP32", "shape": [1]}, TensorError, "'x' has neither 'data'"),
    ],
)
def test_bad_input_entry_is_rejected(entry: Any, error: type[Exception], message: str) -> None:
    """Each malformed input entry raises its error class, naming the input when it can."""
    with pytest.raises(error, match=message):
        decode(orjson.dumps({"inputs": [entry]}))


def test_input_with_data_and_binary_size_is_rejected() -> None:
    """An input sent both ways is ambiguous."""
    spec = tensor("x", "INT8", [1], [1]) | {"parameters": {"binary_data_size": 1}}
    body, length = binary_body((spec, b"\x01"))
    with pytest.raises(TensorError, match=r"'x' has both 'data' and parameters.binary_data_size"):
        decode(body, length)


def test_negative_binary_size_is_rejected() -> None:
    """binary_data_size must be a non-negative count."""
    spec = {"name": "x", "datatype": "INT8", "shape": [0], "parameters": {"binary_data_size": -1}}
    with pytest.raises(TensorError, match="'x' has binary_data_size -1"):
        decode(orjson.dumps({"inputs": [spec]}))


def test_duplicate_input_names_are_rejected() -> None:
    """Each input may appear once."""
    with pytest.raises(TensorError, match="input 'x' appears more than once"):
        json_request(tensor("x", "INT8", [1], [1]), tensor("x", "INT8", [1], [2]))


def test_duplicate_output_names_are_rejected() -> None:
    """Each output may be requested once."""
    with pytest.raises(TensorError, match="output 'y' is requested more than once"):
        json_request(tensor("x", "INT8", [1], [1]), outputs=[{"name": "y"}, {"name": "y"}])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"id": 5}, "'id' must be a string"),
        ({"parameters": [1]}, "'parameters' of the request must be a JSON object"),
        ({"parameters": {"binary_data_output": "yes"}}, "'binary_data_output' must be true"),
        ({"outputs": {"name": "y"}}, "'outputs' must be a list"),
        ({"outputs": [{"name": "y", "parameters": {"binary_data": 1}}]}, "'y': 'binary_data'"),
    ],
)
def test_bad_request_fields_are_invalid(extra: dict[str, Any], message: str) -> None:
    """Wrongly typed request fields are InvalidRequest saying what is expected."""
    with pytest.raises(InvalidRequest, match=message):
        json_request(tensor("x", "INT8", [1], [1]), **extra)


# --- responses ---------------------------------------------------------------------------


def test_json_response_layout() -> None:
    """A JSON response names the model and each output's datatype, shape and flat data."""
    body, headers = encode_infer_response(
        response(y=np.array([[1, 2], [3, 4]], np.int32)), request_for()
    )
    assert headers == {"Content-Type": "application/json"}
    assert orjson.loads(body) == {
        "model_name": "m",
        "model_version": "1",
        "outputs": [{"name": "y", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]}],
    }


def test_response_echoes_request_id() -> None:
    """The id appears only when the request had one."""
    request = request_for()
    request.id = "abc"
    body, _ = encode_infer_response(response(y=np.zeros(1, np.int8)), request)
    assert orjson.loads(body)["id"] == "abc"


def test_response_parameters_appear_when_set() -> None:
    """Response parameters are written only when there are some."""
    resp = response(y=np.zeros(1, np.int8))
    resp.parameters = {"queue_ms": 3}
    body, _ = encode_infer_response(resp, request_for())
    assert orjson.loads(body)["parameters"] == {"queue_ms": 3}


def test_response_follows_requested_output_order() -> None:
    """Outputs come in the order the request listed them."""
    resp = response(a=np.zeros(1, np.int8), b=np.ones(1, np.int8))
    body, _ = encode_infer_response(resp, request_for([RequestedOutput("b")]))
    assert [o["name"] for o in orjson.loads(body)["outputs"]] == ["b"]


def test_response_without_requested_outputs_keeps_response_order() -> None:
    """With no outputs requested, every output is sent in the response's order."""
    resp = response(b=np.zeros(1, np.int8), a=np.ones(1, np.int8))
    body, _ = encode_infer_response(resp, request_for())
    assert [o["name"] for o in orjson.loads(body)["outputs"]] == ["b", "a"]


def test_binary_output_appends_raw_bytes() -> None:
    """A binary output carries binary_data_size and its little-endian bytes follow the JSON."""
    values = np.array([[1.5, -2.0]], np.float32)
    body, headers = encode_infer_response(
        response(y=values), request_for([RequestedOutput("y", binary=True)])
    )
    assert headers["Content-Type"] == "application/octet-stream"
    header, tail = split_binary(body, headers)
    assert header["outputs"] == [
        {"name": "y", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}}
    ]
    assert tail == values.astype("<f4").tobytes()


def test_mixed_binary_and_json_outputs() -> None:
    """Binary outputs' bytes follow in output order; JSON outputs carry data inline."""
    resp = response(
        a=np.array([1, 2], np.int16), b=np.array([3.0], np.float64), c=np.array([True, False])
    )
    outputs = [RequestedOutput("c", True), RequestedOutput("b", False), RequestedOutput("a", True)]
    body, headers = encode_infer_response(resp, request_for(outputs))
    header, tail = split_binary(body, headers)
    assert header["outputs"][1]["data"] == [3.0]
    assert tail == b"\x01\x00" + np.array([1, 2], "<i2").tobytes()


def test_binary_data_output_applies_to_every_output_when_none_requested() -> None:
    """binary_data_output makes every output binary when the request lists none."""
    resp = response(a=np.zeros(2, np.uint8), b=np.ones(1, np.uint8))
    body, headers = encode_infer_response(resp, request_for(binary_data_output=True))
    header, tail = split_binary(body, headers)
    assert [o["parameters"]["binary_data_size"] for o in header["outputs"]] == [2, 1]
    assert tail == b"\x00\x00\x01"


def test_binary_data_output_yields_to_explicit_binary_false() -> None:
    """An output that says binary_data: false stays JSON under binary_data_output."""
    resp = response(a=np.zeros(1, np.uint8), b=np.ones(1, np.uint8))
    outputs = [RequestedOutput("a", False), RequestedOutput("b")]
    body, headers = encode_infer_response(resp, request_for(outputs, binary_data_output=True))
    header, tail = split_binary(body, headers)
    assert header["outputs"][0]["data"] == [0]
    assert tail == b"\x01"


def test_fp16_output_is_json_numbers() -> None:
    """FP16 outputs are written as JSON numbers."""
    body, _ = encode_infer_response(response(y=np.array([0.5, 2], np.float16)), request_for())
    assert orjson.loads(body)["outputs"][0]["data"] == [0.5, 2.0]


def test_bool_output_is_json_booleans() -> None:
    """BOOL outputs are written as true/false."""
    body, _ = encode_infer_response(response(y=np.array([True, False])), request_for())
    assert b'"data":[true,false]' in body


def test_bytes_output_accepts_str_elements() -> None:
    """onnxruntime's str outputs are written as JSON strings."""
    body, _ = encode_infer_response(response(y=np.array(["a", b"b"], object)), request_for())
    assert orjson.loads(body)["outputs"][0]["data"] == ["a", "b"]


def test_bytes_output_of_str_elements_as_binary() -> None:
    """str elements are UTF-8 encoded in the binary BYTES layout."""
    body, headers = encode_infer_response(
        response(y=np.array(["é"], object)), request_for(binary_data_output=True)
    )
    _, tail = split_binary(body, headers)
    assert tail == struct.pack("<I", 2) + "é".encode()


def test_non_utf8_bytes_output_as_json_asks_for_binary() -> None:
    """A non-UTF-8 BYTES output cannot be JSON; the error says to request binary_data."""
    with pytest.raises(InvalidRequest, match=r"output 'y' element 1 .*\"binary_data\": true"):
        encode_infer_response(response(y=np.array([b"ok", b"\xff"], object)), request_for())


def test_non_contiguous_output_is_written_row_major() -> None:
    """A transposed output is written in row-major order of its logical shape."""
    values = np.arange(6, dtype=np.int32).reshape(2, 3).T
    json_body, _ = encode_infer_response(response(y=values), request_for())
    assert orjson.loads(json_body)["outputs"][0]["data"] == values.ravel().tolist()
    body, headers = encode_infer_response(response(y=values), request_for(binary_data_output=True))
    assert split_binary(body, headers)[1] == values.ravel().astype("<i4").tobytes()


def test_big_endian_output_is_sent_little_endian() -> None:
    """Binary outputs are little-endian whatever the array's byte order."""
    values = np.array([1.0, 2.0], dtype=">f8")
    body, headers = encode_infer_response(response(y=values), request_for(binary_data_output=True))
    assert split_binary(body, headers)[1] == np.array([1.0, 2.0], "<f8").tobytes()


def test_an_output_the_model_did_not_return_is_left_out() -> None:
    """A requested output the model did not return is left out, as Triton answers (a
    Python model may return only some); the answer is JSON when no binary one is left."""
    asked = [RequestedOutput("z", binary=True), RequestedOutput("y", binary=False)]
    body, headers = encode_infer_response(response(y=np.zeros(1)), request_for(asked))
    assert headers == {"Content-Type": "application/json"}
    assert [o["name"] for o in orjson.loads(body)["outputs"]] == ["y"]


def test_output_dtype_contradicting_its_datatype_is_an_inference_failure() -> None:
    """An output array whose dtype is not its declared datatype is never cast silently."""
    resp = response(y=np.zeros(1, np.float64))
    resp.output_datatypes["y"] = "FP32"
    with pytest.raises(InferenceFailed, match=r"'y' as FP64 .* declares it FP32"):
        encode_infer_response(resp, request_for())


def test_encode_error_body() -> None:
    """Errors are {"error": message}."""
    assert orjson.loads(encode_error("no such model 'x'")) == {"error": "no such model 'x'"}


def test_encode_json_serializes_numpy() -> None:
    """encode_json writes numpy arrays and scalars natively."""
    assert encode_json({"a": np.array([1, 2], np.int32), "b": np.float32(0.5)}) == (
        b'{"a":[1,2],"b":0.5}'
    )


# --- cross-checks with tritonclient ------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("datatype", list(JSON_CASES))
def test_tritonclient_request_body_decodes(datatype: str, binary: bool) -> None:
    """tritonclient's own request body, binary or JSON, decodes to the array it sent."""
    http = pytest.importorskip("tritonclient.http")
    data, dtype = JSON_CASES[datatype]
    values = np.array([s.encode() for s in data] if datatype == "BYTES" else data, dtype=dtype)
    values = values.reshape(2, 2)
    infer_input = http.InferInput("x", [2, 2], datatype)
    infer_input.set_data_from_numpy(values, binary_data=binary)
    body, length = http.InferenceServerClient.generate_request_body([infer_input])
    decoded = decode(body, length).inputs["x"]
    assert decoded.dtype == values.dtype
    assert decoded.tolist() == values.tolist()


def test_tritonclient_parses_binary_response() -> None:
    """tritonclient reads sordino's mixed binary response back to the same arrays."""
    http = pytest.importorskip("tritonclient.http")
    resp = response(
        p=np.arange(6, dtype=np.float32).reshape(2, 3), s=np.array([b"\x00\xff"], object)
    )
    outputs = [RequestedOutput("p", True), RequestedOutput("s", True)]
    body, headers = encode_infer_response(resp, request_for(outputs))
    result = http.InferenceServerClient.parse_response_body(
        body, header_length=int(headers[HEADER_CONTENT_LENGTH])
    )
    np.testing.assert_array_equal(result.as_numpy("p"), resp.outputs["p"])
    assert result.as_numpy("s").tolist() == [b"\x00\xff"]


DIGITS = ModelMetadata(
    name="digits-classifier",
    version="1",
    platform="onnxruntime_onnx",
    inputs=(TensorSpec("pixels", "FP32", (-1, 64)),),
    outputs=(TensorSpec("probabilities", "FP32", (-1, 10)),),
    batched=True,
)


def test_declared_shapes_are_checked_against_the_model_before_any_data() -> None:
    """10,000 huge dimensions: refused by rank at once, the data never looked at (a JSON
    of 40,000 is larger than any request to the model needs: refused by its size)."""
    body = orjson.dumps({"inputs": [tensor("pixels", "FP32", [2**62] * 10_000, "not data")]})
    started = time.perf_counter()
    with pytest.raises(TensorError, match="10000 dimensions but model 'digits-classifier'"):
        decode_infer_request(
            body, model="m", version=None, header_length=None, metadata=DIGITS, max_batch_size=64
        )
    assert time.perf_counter() - started < 0.5


def test_declared_shapes_are_bounded_by_the_body_without_a_model() -> None:
    spec = {"name": "s", "datatype": "BYTES", "shape": [1, 2**28]}
    body, length = binary_body(({**spec, "parameters": {"binary_data_size": 4}}, b"\0" * 4))
    with pytest.raises(TensorError, match="dimension 1 is 268435456"):
        decode(body, length)


def test_a_deeply_nested_id_is_named_not_written_out() -> None:
    body = b'{"id": ' + b"[" * 1000 + b"]" * 1000 + b', "inputs": []}'
    with pytest.raises(InvalidRequest, match="'id' must be a string, got a list"):
        decode(body)


def test_shape_error_shows_the_offending_dimension() -> None:
    with pytest.raises(TensorError, match=r"dimension 2 is 'x'"):
        json_request(tensor("x", "FP32", [1, 2, "x"], [1.0, 2.0]))


def test_parse_header_length_refuses_thousands_of_digits() -> None:
    with pytest.raises(MalformedBody, match=HEADER_CONTENT_LENGTH):
        parse_header_length("9" * 5000)
