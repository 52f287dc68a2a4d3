"""The KServe v2 wire codec: inference bodies to records and back.

A request body is a JSON header, optionally followed by raw tensor bytes (Triton's
binary tensor data extension). When binary data follows, the client says where the
JSON ends with the ``Inference-Header-Content-Length`` header; each binary input
declares ``parameters.binary_data_size`` and the inputs' bytes follow the JSON in
input order, with nothing left over. Responses use the same framing for outputs the
client asked to get as binary.

Binary inputs become zero-copy, read-only numpy views on the request body; JSON
inputs become new arrays. Every error names the tensor and says what is accepted.
The classification and shared-memory parameters are checked in ``extensions.py``;
answers are encoded in ``encode.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import orjson

from sordino.datatypes import (
    DATATYPES,
    brief_repr,
    format_shape,
    tensor_from_binary,
    tensor_from_json,
)
from sordino.errors import InvalidRequest, MalformedBody, TensorError
from sordino.inference import InferRequest, ModelMetadata, RequestedOutput, SharedInput, Tensor
from sordino.memo import Memo
from sordino.protocol.extensions import refuse_output_extensions, shared_memory_parameters
from sordino.protocol.validate import (
    JSON_ROOM,
    check_declared_shape,
    check_json_size,
    refuse_json_over,
)

__all__ = ["HEADER_CONTENT_LENGTH", "decode_infer_request", "parse_header_length"]

HEADER_CONTENT_LENGTH = "Inference-Header-Content-Length"
"""The HTTP header that gives the byte length of the JSON part of a binary body."""


@dataclass(frozen=True, slots=True)
class _InputHeader:
    """One entry of the JSON ``inputs`` list, checked but not yet turned into an array."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Any
    binary_size: int | None
    shared: tuple[str, int, int] | None = None
    """(region, byte size, offset) for an input in a shared-memory region."""


def parse_header_length(value: str | None) -> int | None:
    """Return the ``Inference-Header-Content-Length`` header as an int, or None if absent.

    Raises MalformedBody when the value is not a non-negative integer.
    """
    if value is None:
        return None
    text = value.strip()
    # 18 digits keep int() cheap and within any body size sordino could accept.
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise MalformedBody(
            f"{HEADER_CONTENT_LENGTH} is {brief_repr(value)}; it must be the byte length of "
            "the JSON header at the start of the body"
        )
    return int(text)


def decode_infer_request(
    body: bytes,
    *,
    model: str,
    version: str | None,
    header_length: int | None,
    headers: Mapping[str, str] | None = None,
    metadata: ModelMetadata | None = None,
    max_batch_size: int = 0,
    json_values: int | None = None,
) -> InferRequest:
    """Decode an inference request body into an :class:`InferRequest`.

    ``header_length`` is the ``Inference-Header-Content-Length`` value: the JSON
    header is that many leading bytes and binary input data follows; None means the
    whole body is JSON. Raises MalformedBody for unparsable JSON or framing,
    TensorError for a tensor that is inconsistent in itself (datatype, shape, element
    count, values), InvalidRequest for other schema errors and Unsupported for
    extensions sordino does not implement.

    With the model's ``metadata`` (and its ``max_batch_size``), each input's declared
    shape is checked against the model and the body's size before any tensor is built
    (:func:`~sordino.protocol.validate.check_declared_shape`); the full check against
    the model is :func:`~sordino.protocol.validate.validate_request`'s job. A JSON part
    larger than any request to the model needs (its metadata's, or ``json_values``
    where a front end has only that) is refused before it is parsed.
    """
    if metadata is not None or json_values is not None:
        json_size = len(body) if header_length is None else min(header_length, len(body))
        if metadata is not None:  # before parsing: a JSON far larger than the model takes
            check_json_size(metadata, max_batch_size, json_size)
        elif json_size > JSON_ROOM:
            refuse_json_over(json_size, model, json_values)
    if header_length is not None and 0 <= header_length <= min(len(body), _MEMO_HEADER_BYTES):
        # A client sends the same JSON header request after request: read it once.
        parsed = _BINARY_HEADERS[bytes(memoryview(body)[:header_length])]
    else:
        parsed = _read_header(_parse_header(body, header_length))
    json_end = len(body) if header_length is None else header_length
    specs = parsed.specs
    for spec in specs:
        check_declared_shape(
            spec.name,
            spec.shape,
            room=max(len(body), spec.shared[1] if spec.shared else 0),
            metadata=metadata,
            max_batch_size=max_batch_size,
        )
    if parsed.binary_bytes != len(body) - json_end:
        _framing_error(specs, len(body) - json_end, header_length)

    inputs: dict[str, Tensor] = {}
    shared: list[SharedInput] = []
    offset = json_end
    for spec in specs:
        if spec.shared is not None:
            region, size, start = spec.shared
            shared.append(SharedInput(spec.name, spec.datatype, spec.shape, region, size, start))
        elif spec.binary_size is None:
            inputs[spec.name] = tensor_from_json(spec.name, spec.datatype, spec.shape, spec.data)
        else:
            end = offset + spec.binary_size
            view = memoryview(body)[offset:end]
            inputs[spec.name] = tensor_from_binary(spec.name, spec.datatype, spec.shape, view)
            offset = end

    if parsed.outputs_ok:
        outputs = None if parsed.outputs is None else list(parsed.outputs)
    else:
        outputs = _parse_outputs(parsed.raw_outputs)  # raises what is wrong with them
    return InferRequest(
        model=model,
        inputs=inputs,
        version=version,
        id=parsed.id,
        outputs=outputs,
        # The service writes into these: each request its own.
        parameters=dict(parsed.parameters),
        input_datatypes={spec.name: spec.datatype for spec in specs},
        headers=dict(headers) if headers else {},
        shared_inputs=shared,
    )


@dataclass(frozen=True, slots=True)
class _Header:
    """What a request's JSON header says, checked: all of the request but its tensors."""

    id: str | None
    parameters: dict[str, Any]
    """Never handed out: each request gets a copy (the service writes into its own)."""
    specs: tuple[_InputHeader, ...]
    outputs: tuple[RequestedOutput, ...] | None
    raw_outputs: object
    outputs_ok: bool
    """False: ``raw_outputs`` is wrong, reported after the inputs' errors (as read)."""
    binary_bytes: int
    """The bytes of binary input data the header declares (after the JSON)."""


def _read_header(header: dict[str, Any]) -> _Header:
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest(f"the request 'id' must be a string, got {_json_kind(request_id)}")
    parameters = _parameters(header.get("parameters"), "the request")
    if not isinstance(parameters.get("binary_data_output", False), bool):
        raise InvalidRequest("request parameter 'binary_data_output' must be true or false")
    specs = tuple(_parse_inputs(header["inputs"]))
    binary_bytes = sum(spec.binary_size or 0 for spec in specs)
    raw_outputs = header.get("outputs")
    try:
        outputs = _parse_outputs(raw_outputs)
    except (InvalidRequest, TensorError):
        return _Header(request_id, parameters, specs, None, raw_outputs, False, binary_bytes)
    return _Header(
        request_id,
        parameters,
        specs,
        None if outputs is None else tuple(outputs),
        raw_outputs,
        True,
        binary_bytes,
    )


def _binary_header(text: bytes) -> _Header:
    where = f"the first {len(text)} bytes of the body ({HEADER_CONTENT_LENGTH})"
    return _read_header(_header_object(text, where))


_MEMO_HEADER_BYTES = 4096
"""The longest JSON header of a binary body kept in ``_BINARY_HEADERS`` (one with
``data`` inline may be long; those are read afresh)."""

_BINARY_HEADERS: Memo[bytes, _Header] = Memo(_binary_header, 256)
"""A binary body's JSON header as read, by its bytes: a client's requests repeat it
(the tensors' bytes follow it). A header that is wrong raises and is not kept."""


def _parse_header(body: bytes, header_length: int | None) -> dict[str, Any]:
    if header_length is None:
        where = "the request body"
        text: bytes | memoryview = body
    else:
        if header_length < 0 or header_length > len(body):
            raise MalformedBody(
                f"{HEADER_CONTENT_LENGTH} is {header_length} but the body is {len(body)} bytes; "
                "it must be the byte length of the JSON header at the start of the body"
            )
        where = f"the first {header_length} bytes of the body ({HEADER_CONTENT_LENGTH})"
        text = memoryview(body)[:header_length]
    return _header_object(text, where)


def _header_object(text: bytes | memoryview, where: str) -> dict[str, Any]:
    try:
        header = loads_json(text)
    except orjson.JSONDecodeError as exc:
        raise MalformedBody(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise MalformedBody(
            f"the request must be a JSON object with an 'inputs' list, got {_json_kind(header)}"
        )
    if not isinstance(header.get("inputs"), list):
        raise MalformedBody(
            "the request has no 'inputs' list; send "
            '{"inputs": [{"name": ..., "shape": [...], "datatype": ..., "data": [...]}]}'
        )
    return header


def loads_json(text: bytes | memoryview) -> Any:
    """``text`` read as JSON by orjson; where it fails on ``NaN``, ``Infinity`` or
    ``-Infinity`` (not JSON, but what Triton reads and writes for such floats, and what
    Python's ``json`` writes), read by Python's ``json``, which takes them. Raises
    orjson's error otherwise."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        raw = bytes(text)
        if b"NaN" not in raw and b"Infinity" not in raw:
            raise
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            pass
        raise


def _parameters(raw: object, owner: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidRequest(
            f"'parameters' of {owner} must be a JSON object, got {_json_kind(raw)}"
        )
    return raw


def _parse_inputs(raw_inputs: list[Any]) -> list[_InputHeader]:
    specs: list[_InputHeader] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_inputs):
        if not isinstance(raw, dict):
            raise InvalidRequest(
                f"inputs[{index}] must be a JSON object with name, shape, datatype and data"
            )
        spec = _parse_input(index, raw)
        if spec.name in seen:
            raise TensorError(f"input {spec.name!r} appears more than once; send each input once")
        seen.add(spec.name)
        specs.append(spec)
    return specs


def _parse_input(index: int, raw: dict[str, Any]) -> _InputHeader:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise TensorError(f"inputs[{index}] has no 'name'; give every input its tensor name")
    datatype = raw.get("datatype")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise TensorError(
            f"input {name!r} has datatype {brief_repr(datatype)}; use one of {', '.join(DATATYPES)}"
        )
    shape = raw.get("shape")
    if not isinstance(shape, list):
        raise TensorError(
            f"input {name!r} has shape {_json_kind(shape)}; the shape must be a list of "
            "non-negative integers"
        )
    for axis, dim in enumerate(shape):
        if type(dim) is not int or dim < 0:
            raise TensorError(
                f"input {name!r} has shape {format_shape(shape)}: dimension {axis} is "
                f"{brief_repr(dim)}; the shape must be a list of non-negative integers"
            )
    parameters = _parameters(raw.get("parameters"), f"input {name!r}")
    size = parameters.get("binary_data_size")
    data = raw.get("data")
    shared = shared_memory_parameters(f"input {name!r}", parameters)
    if shared is not None:
        if size is not None or data is not None:
            raise TensorError(
                f"input {name!r} names shared memory region {brief_repr(shared[0])} and also has "
                "'data' or binary_data_size; send its values one way only"
            )
        return _InputHeader(name, datatype, tuple(shape), None, None, shared)
    if size is None and data is None:
        raise TensorError(
            f"input {name!r} has neither 'data' nor parameters.binary_data_size; "
            "send its values in 'data' or as binary data"
        )
    if size is not None and data is not None:
        raise TensorError(
            f"input {name!r} has both 'data' and parameters.binary_data_size; "
            "send its values one way only"
        )
    if size is not None and (type(size) is not int or size < 0):
        raise TensorError(
            f"input {name!r} has binary_data_size {brief_repr(size)}; it must be a "
            "non-negative byte count"
        )
    return _InputHeader(name, datatype, tuple(shape), data, size)


def _framing_error(
    specs: Sequence[_InputHeader], available: int, header_length: int | None
) -> NoReturn:
    """Raise: the body's ``available`` bytes after the JSON are not what ``specs`` declare."""
    binary = [spec for spec in specs if spec.binary_size is not None]
    needed = sum(spec.binary_size or 0 for spec in binary)
    sizes = ", ".join(f"{spec.name!r}: {spec.binary_size}" for spec in binary) or "none"
    if header_length is None:
        raise MalformedBody(
            f"binary input data is declared ({sizes}) but the request has no "
            f"{HEADER_CONTENT_LENGTH} header; set it to the byte length of the JSON header"
        )
    raise MalformedBody(
        f"the body holds {available} bytes after the {header_length}-byte JSON header but the "
        f"inputs' binary_data_size values ({sizes}) add up to {needed}; they must match exactly"
    )


def _parse_outputs(raw: object) -> list[RequestedOutput] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InvalidRequest(
            f"'outputs' must be a list of {{\"name\": ...}} objects, got {_json_kind(raw)}"
        )
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            raise InvalidRequest(f"outputs[{index}] must be a JSON object with a 'name'")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise TensorError(f"outputs[{index}] has no 'name'; name the output you want")
        if name in seen:
            raise TensorError(f"output {name!r} is requested more than once; list it once")
        seen.add(name)
        parameters = dict(_parameters(item.get("parameters"), f"output {name!r}"))
        binary = parameters.pop("binary_data", None)
        if binary is not None and not isinstance(binary, bool):
            raise InvalidRequest(f"output {name!r}: 'binary_data' must be true or false")
        refuse_output_extensions(name, parameters)
        outputs.append(RequestedOutput(name=name, binary=binary, parameters=parameters))
    # An empty list asks for nothing in particular, which the protocol reads as "all".
    return outputs or None


def _json_kind(value: object) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return "null" if value is None else f"the value {brief_repr(value)}"
