"""Triton's generate extension: flat JSON in, flat JSON out, one object per response.

``POST /v2/models/{m}/generate`` and ``.../generate_stream`` take a JSON object whose
keys are the model's input names (plus the optional ``id`` and ``parameters``). Each
value is a scalar or a (nested) list; the input's shape is one batch row of the
model's declared shape, with a variable dimension sized to fit the values. A response
is ``{"model_name", "model_version", "id"?, <output>: <value>, ...}`` where a
one-element output is a scalar and any other a flat list; BYTES are UTF-8 strings.
The streaming form sends each response as a Server-Sent Event, ``data: <json>``.

An iterative (generative) model answers the same way: its outputs named in
``base64_outputs`` (the PNG) are base64 strings, and the response's ``parameters``
(``steps_used``, and ``step``/``steps`` on a progress event) are sent as
``"parameters"``.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Collection
from typing import Any

import numpy as np
import orjson

from sordino.datatypes import brief_repr, tensor_from_json
from sordino.errors import InvalidRequest, MalformedBody, TensorError
from sordino.inference import InferRequest, InferResponse, ModelMetadata, Tensor, TensorSpec
from sordino.protocol.codec import loads_json
from sordino.protocol.encode import encode_json, non_finite_json
from sordino.protocol.validate import refuse_declined

__all__ = ["decode_generate_request", "encode_generate_response", "sse_event"]

_RESERVED = ("id", "parameters")


def decode_generate_request(
    body: bytes, metadata: ModelMetadata, *, model: str, version: str | None
) -> InferRequest:
    """Decode a generate body for the model ``metadata`` describes.

    Raises MalformedBody for a body that is not a JSON object, TensorError for a key
    that is not an input of the model or values that do not fit it, and
    InvalidRequest for a malformed ``id`` or ``parameters``.
    """
    try:
        document = loads_json(body or b"{}")
    except orjson.JSONDecodeError as exc:
        raise MalformedBody(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise MalformedBody(
            'the generate request must be a JSON object such as {"<input name>": <value>}'
        )
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest(f"the request 'id' must be a string, got {brief_repr(request_id)}")
    parameters = document.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidRequest("'parameters' must be a JSON object")
    inputs: dict[str, Tensor] = {}
    datatypes: dict[str, str] = {}
    for key, value in document.items():
        if key in _RESERVED:
            continue
        spec = metadata.input(key)
        if spec is None:
            refuse_declined(metadata, key)
            names = ", ".join(repr(s.name) for s in metadata.inputs)
            raise TensorError(
                f"model {metadata.name!r} has no input {key!r}; its inputs are {names}"
            )
        inputs[key] = _tensor(spec, value, metadata.batched)
        datatypes[key] = spec.datatype
    return InferRequest(
        model=model,
        inputs=inputs,
        version=version,
        id=request_id,
        parameters=parameters,
        input_datatypes=datatypes,
    )


def _tensor(spec: TensorSpec, value: object, batched: bool) -> Tensor:
    values = value if isinstance(value, list) else [value]
    count = int(np.asarray(values, dtype=object).size) if values else 0
    dims = list(spec.item_shape if batched else spec.shape)
    fixed = math.prod(d for d in dims if d >= 0)
    variable = [axis for axis, d in enumerate(dims) if d < 0]
    for axis in variable:
        dims[axis] = 1
    if variable:
        if fixed == 0 or count % fixed:
            raise TensorError(
                f"input {spec.name!r} takes shape {list(spec.shape)} but got {count} values, "
                f"not a multiple of {fixed}"
            )
        dims[variable[-1]] = count // fixed
    shape = (1, *dims) if batched else tuple(dims)
    return tensor_from_json(spec.name, spec.datatype, shape, values)


def encode_generate_response(
    response: InferResponse, base64_outputs: Collection[str] = ()
) -> dict[str, Any]:
    """Return the flat JSON object for one response (``base64_outputs``: binary BYTES)."""
    document: dict[str, Any] = {"model_name": response.model, "model_version": response.version}
    if response.id is not None:
        document["id"] = response.id
    for name, array in response.outputs.items():
        if array.dtype.kind == "f" and not np.isfinite(array).all():  # NaN as Triton writes it
            values = np.ascontiguousarray(array.reshape(-1), dtype=np.float64)  # as tolist()
            document[name] = non_finite_json(values, alone=True)
            continue
        flat = array.reshape(-1).tolist()
        if name in base64_outputs:
            flat = [base64.b64encode(item).decode("ascii") for item in flat]
        elif array.dtype == np.object_:
            flat = [_text(name, item) for item in flat]
        document[name] = flat[0] if len(flat) == 1 else flat
    if response.parameters:
        document["parameters"] = response.parameters
    return document


def _text(name: str, item: object) -> str:
    if isinstance(item, bytes):
        try:
            return item.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest(
                f"output {name!r} is not valid UTF-8 and cannot be sent as generate JSON; "
                "use the infer endpoint with binary outputs"
            ) from None
    return str(item)


def sse_event(document: object) -> bytes:
    """Return one Server-Sent Event carrying ``document`` as JSON."""
    return b"data: " + encode_json(document) + b"\n\n"
