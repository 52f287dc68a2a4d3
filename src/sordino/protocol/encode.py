"""The KServe v2 wire codec's other half: responses and errors to bodies.

An answer is a JSON document, followed by raw tensor bytes for the outputs the client
asked to get as binary (Triton's binary tensor data extension, framed as requests are:
``codec.py``). Outputs placed in a client's shared-memory region are written there and
only described in the document.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from sordino.datatypes import from_numpy_dtype, serialize_bytes_tensor
from sordino.errors import InferenceFailed, InvalidRequest, TensorError
from sordino.inference import InferRequest, InferResponse, Tensor
from sordino.protocol.codec import HEADER_CONTENT_LENGTH
from sordino.protocol.extensions import shared_memory_entry, wants_shared_memory

__all__ = [
    "encode_error",
    "encode_infer_response",
    "encode_json",
    "non_finite_json",
    "output_datatype",
]


def encode_infer_response(
    response: InferResponse, request: InferRequest
) -> tuple[bytes, dict[str, str]]:
    """Encode ``response`` for ``request``; return the body and the headers to add.

    Outputs come in the order the request listed them, or the response's order when
    it listed none. An output is binary when its RequestedOutput says so, or when it
    does not say and the request parameter ``binary_data_output`` is true. With any
    binary output the headers carry ``Inference-Header-Content-Length``. An output
    the model did not return is left out, even one the request names, as Triton
    answers (a Python model may answer only some; ``requested_output_names()`` says
    which were asked for). Raises InvalidRequest for a BYTES output that is not UTF-8
    but was asked for as JSON, and InferenceFailed when the model returned an array
    whose dtype contradicts its declared datatype.
    """
    default_binary = bool(request.parameters.get("binary_data_output", False))
    shared: dict[str, dict[str, Any]] = {}
    if request.outputs is None:
        wanted = [(name, default_binary) for name in response.outputs]
    else:
        wanted = [
            (out.name, default_binary if out.binary is None else out.binary)
            for out in request.outputs
        ]
        shared = {out.name: out.parameters for out in request.outputs if wants_shared_memory(out)}

    entries: list[dict[str, Any]] = []
    chunks: list[bytes | memoryview] = []
    produced = response.outputs
    for name, binary in wanted:
        array = produced.get(name)
        if array is None:
            continue
        datatype = output_datatype(response, name, array)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if name in shared:
            # Written into the client's region by the server; the entry says where.
            entry["parameters"] = shared_memory_entry(shared[name], array)
        elif binary:
            chunk = _binary_output(name, datatype, array)
            entry["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        else:
            entry["data"] = _json_output(name, datatype, array)
        entries.append(entry)

    document: dict[str, Any] = {"model_name": response.model, "model_version": response.version}
    if request.id is not None:
        document["id"] = request.id
    if response.parameters:
        document["parameters"] = response.parameters
    document["outputs"] = entries
    header = encode_json(document)
    if not chunks:
        return header, {"Content-Type": "application/json"}
    headers = {
        HEADER_CONTENT_LENGTH: str(len(header)),
        "Content-Type": "application/octet-stream",
    }
    return b"".join([header, *chunks]), headers


def output_datatype(response: InferResponse, name: str, array: Tensor) -> str:
    """Return the datatype of output ``name``; raise InferenceFailed if it contradicts the model."""
    try:
        actual = from_numpy_dtype(array.dtype)
    except TensorError as exc:
        raise InferenceFailed(f"model {response.model!r} output {name!r}: {exc.message}") from None
    declared = response.output_datatypes.get(name, actual)
    if declared != actual:
        raise InferenceFailed(
            f"model {response.model!r} returned output {name!r} as {actual} "
            f"(numpy {array.dtype}) but declares it {declared}"
        )
    return declared


def _binary_output(name: str, datatype: str, array: Tensor) -> bytes | memoryview:
    if datatype == "BYTES":
        try:
            return serialize_bytes_tensor(array)
        except TensorError as exc:
            raise InferenceFailed(f"output {name!r}: {exc.message}") from None
    little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    # A byte view, not tobytes(): the final join is then the only copy.
    return little.reshape(-1).view(np.uint8).data


def _json_output(name: str, datatype: str, array: Tensor) -> object:
    flat = array.reshape(-1)
    if datatype != "BYTES":
        # orjson writes numeric arrays itself when they are native-endian and contiguous.
        values = np.ascontiguousarray(flat, dtype=flat.dtype.newbyteorder("="))
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            return non_finite_json(values)
        return values
    strings: list[str] = []
    for index, item in enumerate(flat.tolist()):
        if isinstance(item, str):
            strings.append(item)
            continue
        try:
            strings.append(item.decode("utf-8"))
        except UnicodeDecodeError:
            raise InvalidRequest(
                f"output {name!r} element {index} is not valid UTF-8 and cannot be sent as "
                'JSON; request the output with "binary_data": true'
            ) from None
        except AttributeError:
            raise InferenceFailed(
                f"output {name!r} element {index} is a {type(item).__name__}; "
                "BYTES outputs must hold bytes or str"
            ) from None
    return strings


def non_finite_json(values: np.ndarray[Any, Any], *, alone: bool = False) -> orjson.Fragment:
    """The JSON list of the floats ``values`` (one dimension), some NaN or infinite,
    written as Triton writes them: ``NaN``, ``Infinity``, ``-Infinity`` (JSON has no such
    numbers, but Python's ``json``, and so ``tritonclient``, reads them); orjson would
    write ``null``, losing which it was. The finite ones are written as orjson writes
    them (float32's shortest form). ``alone``: one value is written as itself, not as a
    list of one."""
    tokens = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].split(b",")
    for index in np.flatnonzero(~np.isfinite(values)).tolist():
        value = values[index]
        tokens[index] = b"NaN" if np.isnan(value) else b"Infinity" if value > 0 else b"-Infinity"
    if alone and len(tokens) == 1:
        return orjson.Fragment(tokens[0])
    return orjson.Fragment(b"[" + b",".join(tokens) + b"]")


def encode_error(message: str) -> bytes:
    """Return the KServe v2 error body ``{"error": message}``."""
    return orjson.dumps({"error": message})


def encode_json(obj: object) -> bytes:
    """Serialize ``obj`` as JSON with orjson; numpy arrays and scalars are written natively."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
