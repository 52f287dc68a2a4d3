"""The KServe v2 gRPC codec: ``ModelInferRequest`` messages to records and back.

An input's values travel either typed, in the ``contents`` field that matches its
datatype (``fp32_contents`` for FP32, ``int_contents`` for INT8/INT16/INT32, ...), or
raw, as one ``raw_input_contents`` entry per input in input order (little-endian
elements; BYTES elements as a 4-byte little-endian length and the bytes). A request
uses one way for all its inputs. FP16 has no typed field and travels only raw.
Responses always carry raw output contents, as Triton's do.

The other messages (metadata, configuration, statistics) are the protobuf form of the
JSON documents the HTTP endpoints send; :func:`message_from_json` converts them, so
both protocols answer from the same source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from sordino.datatypes import (
    DATATYPES,
    brief_repr,
    element_count,
    format_shape,
    serialize_bytes_tensor,
    tensor_from_binary,
    to_numpy_dtype,
)
from sordino.errors import InferenceFailed, InvalidRequest, MalformedBody, TensorError
from sordino.inference import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    RequestedOutput,
    SharedInput,
    Tensor,
)
from sordino.protocol.encode import output_datatype
from sordino.protocol.extensions import (
    refuse_output_extensions,
    shared_memory_entry,
    shared_memory_parameters,
    wants_shared_memory,
)
from sordino.protocol.pb import kserve_v2_pb2 as pb
from sordino.protocol.validate import check_declared_shape

__all__ = [
    "CONTENTS_FIELD",
    "decode_infer_request",
    "decode_parameters",
    "encode_infer_response",
    "encode_parameters",
    "message_from_json",
    "parse_message",
]

CONTENTS_FIELD: dict[str, str | None] = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP16": None,
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
"""The typed ``InferTensorContents`` field of each datatype (None: raw only)."""

_ALL_FIELDS = sorted({field for field in CONTENTS_FIELD.values() if field is not None})

_M = TypeVar("_M", bound=Message)


def parse_message(kind: type[_M], data: bytes) -> _M:
    """Parse serialized ``data`` as a ``kind`` message; raise MalformedBody if it is not one."""
    try:
        return kind.FromString(data)
    except DecodeError as exc:
        raise MalformedBody(
            f"the request is not a valid inference.{kind.__name__} protobuf message ({exc})"
        ) from None


def message_from_json(document: dict[str, Any], kind: type[_M]) -> _M:
    """Build a ``kind`` message from its JSON form (the HTTP endpoints' documents).

    Keys the message does not declare are skipped, so an HTTP document may carry
    more than its gRPC counterpart.
    """
    return json_format.ParseDict(document, kind(), ignore_unknown_fields=True)


def decode_parameters(parameters: Mapping[str, pb.InferParameter], owner: str) -> dict[str, Any]:
    """Return a parameters map as plain Python values; an unset value is an error."""
    values: dict[str, Any] = {}
    if not len(parameters):  # the usual case, without building the items view
        return values
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        if choice is None:
            raise InvalidRequest(f"parameter {key!r} of {owner} has no value")
        values[key] = getattr(parameter, choice)
    return values


def encode_parameters(values: Mapping[str, Any], target: Any) -> None:
    """Write plain values into a protobuf ``map<string, InferParameter>`` field."""
    for key, value in values.items():
        parameter = target[key]
        if isinstance(value, bool):
            parameter.bool_param = value
        elif isinstance(value, int):
            if value >= 1 << 63:
                parameter.uint64_param = value
            else:
                parameter.int64_param = value
        elif isinstance(value, float):
            parameter.double_param = value
        else:
            parameter.string_param = str(value)


def decode_infer_request(
    message: pb.ModelInferRequest,
    *,
    metadata: ModelMetadata | None = None,
    max_batch_size: int = 0,
) -> InferRequest:
    """Decode a ``ModelInferRequest`` into an :class:`InferRequest`.

    Raises TensorError for a tensor inconsistent in itself (datatype, shape, value
    count, values in the wrong contents field, raw size), MalformedBody when
    ``raw_input_contents`` does not hold one entry per input, InvalidRequest for
    other mistakes and Unsupported for extensions sordino does not implement.

    With the model's ``metadata`` (and its ``max_batch_size``), each input's declared
    shape is checked against the model and the message's size before any tensor is
    built (:func:`~sordino.protocol.validate.check_declared_shape`); the full check
    against the model is ``validate_request``'s job.
    """
    if not message.model_name:
        raise InvalidRequest("model_name is empty; name the model to run")
    if not message.inputs:
        raise InvalidRequest("the request has no inputs; send every input the model takes")
    raw = message.raw_input_contents
    room = message.ByteSize()
    headers = [_check_input_header(index, tensor) for index, tensor in enumerate(message.inputs)]
    # Inputs in shared memory have no raw_input_contents entry (as Triton's clients send).
    in_message = sum(1 for header in headers if header[3] is None)
    if raw and len(raw) != in_message:
        raise MalformedBody(
            f"raw_input_contents has {len(raw)} entries but the request has "
            f"{in_message} inputs; send one entry per input, in the order of inputs (an "
            "input in shared memory has none)"
        )
    for name, _, shape, shared_at in headers:
        check_declared_shape(
            name,
            shape,
            room=max(room, shared_at[1] if shared_at else 0),
            metadata=metadata,
            max_batch_size=max_batch_size,
        )
    inputs: dict[str, Tensor] = {}
    datatypes: dict[str, str] = {}
    shared: list[SharedInput] = []
    raw_index = 0
    for tensor, (name, datatype, shape, shared_at) in zip(message.inputs, headers, strict=True):
        if name in datatypes:
            raise TensorError(f"input {name!r} appears more than once; send each input once")
        datatypes[name] = datatype
        if shared_at is not None:
            if _filled_fields(tensor):
                raise TensorError(
                    f"input {name!r} names shared memory region {shared_at[0]!r} and also has "
                    "contents; send its values one way only"
                )
            region, size, offset = shared_at
            shared.append(SharedInput(name, datatype, shape, region, size, offset))
        elif raw:
            if _filled_fields(tensor):
                raise TensorError(
                    f"input {name!r} has values in contents and the request uses "
                    "raw_input_contents; send all inputs one way"
                )
            inputs[name] = _from_raw(raw_index, name, datatype, shape, raw[raw_index])
            raw_index += 1
        else:
            inputs[name] = _from_contents(name, datatype, shape, tensor)
    return InferRequest(
        model=message.model_name,
        inputs=inputs,
        version=message.model_version or None,
        id=message.id or None,
        outputs=_requested_outputs(message.outputs),
        parameters=decode_parameters(message.parameters, "the request"),
        input_datatypes=datatypes,
        shared_inputs=shared,
    )


def _check_input_header(
    index: int, tensor: pb.ModelInferRequest.InferInputTensor
) -> tuple[str, str, tuple[int, ...], tuple[str, int, int] | None]:
    name = tensor.name
    if not name:
        raise TensorError(f"inputs[{index}] has no name; give every input its tensor name")
    if tensor.datatype not in DATATYPES:
        raise TensorError(
            f"input {name!r} has datatype {brief_repr(tensor.datatype)}; use one of "
            f"{', '.join(DATATYPES)}"
        )
    shape = tuple(tensor.shape)
    if any(dim < 0 for dim in shape):
        raise TensorError(
            f"input {name!r} has shape {format_shape(shape)}; dimensions must be non-negative"
        )
    parameters = decode_parameters(tensor.parameters, f"input {name!r}")
    shared = shared_memory_parameters(f"input {name!r}", parameters)
    return name, tensor.datatype, shape, shared


def _filled_fields(tensor: pb.ModelInferRequest.InferInputTensor) -> list[str]:
    if not tensor.HasField("contents"):
        return []
    return [field for field in _ALL_FIELDS if len(getattr(tensor.contents, field))]


def _from_raw(index: int, name: str, datatype: str, shape: tuple[int, ...], data: bytes) -> Tensor:
    if datatype != "BYTES":
        count = element_count(shape)
        expected = count * to_numpy_dtype(datatype).itemsize
        if len(data) != expected:
            raise TensorError(
                f"input {name!r} has shape {format_shape(shape)} ({count} {datatype} elements, "
                f"{expected} bytes) but raw_input_contents[{index}] holds {len(data)} bytes"
            )
    return tensor_from_binary(name, datatype, shape, data)


def _from_contents(
    name: str, datatype: str, shape: tuple[int, ...], tensor: pb.ModelInferRequest.InferInputTensor
) -> Tensor:
    expected = CONTENTS_FIELD[datatype]
    filled = _filled_fields(tensor)
    wrong = [field for field in filled if field != expected]
    if wrong:
        where = (
            "it travels only in raw_input_contents"
            if expected is None
            else f"{datatype} values go in contents.{expected}"
        )
        raise TensorError(
            f"input {name!r} has datatype {datatype} but its values are in "
            f"contents.{wrong[0]}; {where}"
        )
    values = getattr(tensor.contents, expected) if expected is not None else ()
    count = element_count(shape)
    if count == 0 and not values:
        # No values to read: the datatype's empty tensor, shape checked as for raw data.
        return tensor_from_binary(name, datatype, shape, b"")
    if expected is None:
        raise TensorError(
            f"input {name!r} is {datatype}, which has no typed contents field; send it in "
            "raw_input_contents"
        )
    if len(values) != count:
        raise TensorError(
            f"input {name!r} has shape {format_shape(shape)} ({count} elements) but "
            f"contents.{expected} holds {len(values)} values"
        )
    target = to_numpy_dtype(datatype)
    if datatype == "BYTES":
        array = np.empty(count, dtype=np.object_)
        array[:] = list(values)
        return array.reshape(shape)
    wide = np.array(values, dtype=_container_dtype(expected))
    if target.kind in "iu" and target.itemsize < wide.dtype.itemsize and count:
        info = np.iinfo(target)
        bad = np.flatnonzero((wide < info.min) | (wide > info.max))
        if bad.size:
            index = int(bad[0])
            raise TensorError(
                f"input {name!r} has datatype {datatype} but element {index} is "
                f"{int(wide[index])}, out of range [{info.min}, {info.max}]"
            )
    with np.errstate(over="ignore"):
        return wide.astype(target).reshape(shape)


def _container_dtype(field: str) -> np.dtype[Any]:
    return np.dtype(
        {
            "bool_contents": np.bool_,
            "int_contents": np.int32,
            "int64_contents": np.int64,
            "uint_contents": np.uint32,
            "uint64_contents": np.uint64,
            "fp32_contents": np.float32,
            "fp64_contents": np.float64,
        }[field]
    )


def _requested_outputs(
    outputs: Sequence[pb.ModelInferRequest.InferRequestedOutputTensor],
) -> list[RequestedOutput] | None:
    if not len(outputs):  # the usual case
        return None
    requested: list[RequestedOutput] = []
    seen: set[str] = set()
    for index, output in enumerate(outputs):
        name = output.name
        if not name:
            raise TensorError(f"outputs[{index}] has no name; name the output you want")
        if name in seen:
            raise TensorError(f"output {name!r} is requested more than once; list it once")
        seen.add(name)
        parameters = decode_parameters(output.parameters, f"output {name!r}")
        parameters.pop("binary_data", None)  # HTTP's choice; gRPC outputs are always raw
        refuse_output_extensions(name, parameters)
        requested.append(RequestedOutput(name=name, parameters=parameters))
    return requested or None


def encode_infer_response(response: InferResponse, request: InferRequest) -> pb.ModelInferResponse:
    """Encode ``response`` as a ``ModelInferResponse`` with raw output contents.

    Outputs come in the order the request listed them, or the model's order; one the
    model did not return is left out, as Triton answers. Raises InferenceFailed when
    the model returned an array whose dtype contradicts its declared datatype.
    """
    message = pb.ModelInferResponse(
        model_name=response.model, model_version=response.version, id=request.id or ""
    )
    wanted = [o.name for o in request.outputs] if request.outputs else list(response.outputs)
    shared = {o.name: o.parameters for o in request.outputs or () if wants_shared_memory(o)}
    produced = response.outputs
    for name in wanted:
        array = produced.get(name)
        if array is None:
            continue
        datatype = output_datatype(response, name, array)
        # The values go in raw_output_contents, in the same order as outputs.
        entry = message.outputs.add(name=name, datatype=datatype, shape=array.shape)
        if name in shared:
            # Written into the client's region; an empty entry keeps raw contents in step.
            encode_parameters(shared_memory_entry(shared[name], array), entry.parameters)
            message.raw_output_contents.append(b"")
            continue
        message.raw_output_contents.append(_raw_bytes(name, datatype, array))
    encode_parameters(response.parameters, message.parameters)
    return message


def _raw_bytes(name: str, datatype: str, array: Tensor) -> bytes:
    if datatype == "BYTES":
        try:
            return serialize_bytes_tensor(array)
        except TensorError as exc:
            raise InferenceFailed(f"output {name!r}: {exc.message}") from None
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
