"""KServe v2 tensor datatypes: their numpy, ONNX and Triton names, and their wire forms.

The protocol speaks datatype names (``FP32``, ``INT64``, ``BYTES``, ...); the rest
of sordino holds numpy arrays. This module is the one place that maps between the
two, and it knows how each datatype's values travel: as JSON lists
(:func:`tensor_from_json`) and as Triton binary data (:func:`tensor_from_binary`).
Fixed-size datatypes are raw little-endian elements; a ``BYTES`` element is a 4-byte
little-endian ``uint32`` length followed by that many bytes, elements in row-major
order. ``BYTES`` tensors are numpy ``object`` arrays holding ``bytes``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from sordino.errors import ModelLoadError, TensorError

__all__ = [
    "DATATYPES",
    "MAX_RANK",
    "brief_repr",
    "deserialize_bytes_tensor",
    "element_count",
    "element_size",
    "format_shape",
    "from_numpy_dtype",
    "from_onnx_type",
    "serialize_bytes_tensor",
    "tensor_from_binary",
    "tensor_from_json",
    "to_numpy_dtype",
    "to_triton_type",
]

_NUMPY_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}

DATATYPES: tuple[str, ...] = tuple(_NUMPY_DTYPES)
"""Every datatype name sordino accepts, in the order the KServe v2 spec lists them."""

# Keyed by (kind, itemsize) so byte order does not matter: '>f4' is still FP32.
_DATATYPE_BY_KIND: dict[tuple[str, int], str] = {
    (dtype.kind, dtype.itemsize): name for name, dtype in _NUMPY_DTYPES.items() if name != "BYTES"
}

_ONNX_TYPES: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}

_LENGTH = struct.Struct("<I")

MAX_RANK = 32
"""The most dimensions a tensor may have (numpy 1.x's limit; models use far fewer)."""

_SHOWN_DIMS = 8
_COUNT_CAP = 1 << 62


def element_count(shape: Sequence[int], most: int = _COUNT_CAP) -> int:
    """Return the number of elements of ``shape``, or ``most + 1`` if it has more than ``most``.

    The product stops growing once it passes ``most`` (by default 2**62), so a long
    list of huge dimensions costs no big-integer arithmetic and the result is always
    small enough to print; a zero dimension makes the count 0. Dimensions must be
    non-negative.
    """
    if 0 in shape:
        return 0
    count = 1
    for dim in shape:
        count *= dim
        if count > most:
            return most + 1
    return count


def format_shape(shape: Sequence[object]) -> str:
    """Return ``shape`` as ``[a, b, c]`` for a message, the middle elided when it is long."""
    if len(shape) <= _SHOWN_DIMS:
        return "[" + ", ".join(brief_repr(dim) for dim in shape) + "]"
    head = ", ".join(brief_repr(dim) for dim in shape[: _SHOWN_DIMS - 1])
    return f"[{head}, ... {brief_repr(shape[-1])}] ({len(shape)} dimensions)"


def brief_repr(value: object) -> str:
    """Return a short repr of a value a client sent, for an error message.

    Strings are cut to 40 characters, huge integers and containers are named rather
    than written out (a deeply nested list would exhaust ``repr``'s recursion).
    """
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        return f"an object with {len(value)} keys"
    if isinstance(value, str | bytes):
        return repr(value) if len(value) <= 40 else repr(value[:37]) + "..."
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return "a number of more than 30 digits"
    if isinstance(value, bool | int | float) or value is None:
        return repr(value)
    return f"a {type(value).__name__}"


def _check_rank(name: str, shape: Sequence[int]) -> None:
    if len(shape) > MAX_RANK:
        raise TensorError(
            f"input {name!r} has {len(shape)} dimensions; a tensor may have at most {MAX_RANK}"
        )


def _count_text(count: int) -> str:
    return str(count) if count <= _COUNT_CAP else f"more than {_COUNT_CAP}"


def _reshape(name: str, array: npt.NDArray[Any], shape: tuple[int, ...]) -> npt.NDArray[Any]:
    """Reshape ``array`` (of the right size); an empty one may still have impossible dims."""
    try:
        return array.reshape(shape)
    except (ValueError, OverflowError):
        raise TensorError(
            f"input {name!r} has shape {format_shape(shape)}: it holds no elements but its "
            "other dimensions are too large for any tensor; send sizes the data can fill"
        ) from None


def _check_datatype(datatype: str) -> None:
    if datatype not in _NUMPY_DTYPES:
        raise TensorError(f"unknown datatype {datatype!r}; use one of {', '.join(DATATYPES)}")


def to_numpy_dtype(datatype: str) -> np.dtype[Any]:
    """Return the numpy dtype that holds ``datatype`` (``object`` for ``BYTES``).

    Raises TensorError for a name that is not a KServe v2 datatype.
    """
    dtype = _NUMPY_DTYPES.get(datatype)
    if dtype is None:
        _check_datatype(datatype)  # raises, naming the datatypes there are
    assert dtype is not None
    return dtype


def from_numpy_dtype(dtype: npt.DTypeLike) -> str:
    """Return the datatype name for numpy ``dtype``, whatever its byte order.

    ``object``, ``str`` and ``bytes`` dtypes are ``BYTES``. Raises TensorError for a
    dtype the protocol cannot carry (complex, datetime, ...).
    """
    resolved = np.dtype(dtype)
    if resolved.kind in ("O", "U", "S"):
        return "BYTES"
    name = _DATATYPE_BY_KIND.get((resolved.kind, resolved.itemsize))
    if name is None:
        raise TensorError(
            f"numpy dtype {resolved} has no KServe v2 datatype; use one of {', '.join(DATATYPES)}"
        )
    return name


def from_onnx_type(onnx_type: str) -> str:
    """Return the datatype name for an onnxruntime ``NodeArg.type`` such as ``tensor(float)``.

    Raises ModelLoadError naming the type when sordino cannot serve it (``bfloat16``,
    sequences, maps, ...).
    """
    name = _ONNX_TYPES.get(onnx_type)
    if name is None:
        raise ModelLoadError(
            f"ONNX type {onnx_type!r} is not supported; supported types are "
            f"{', '.join(_ONNX_TYPES)}"
        )
    return name


def to_triton_type(datatype: str) -> str:
    """Return the Triton model-config type: ``TYPE_FP32`` for FP32, ``TYPE_STRING`` for BYTES."""
    _check_datatype(datatype)
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def from_triton_type(triton_type: str) -> str:
    """Return the KServe datatype of a Triton model-config type (``TYPE_STRING`` is
    ``BYTES``), the inverse of :func:`to_triton_type`; the name is not checked here."""
    name = triton_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def element_size(datatype: str) -> int | None:
    """Return the size in bytes of one element, or None for ``BYTES`` (variable size)."""
    _check_datatype(datatype)
    if datatype == "BYTES":
        return None
    return _NUMPY_DTYPES[datatype].itemsize


def serialize_bytes_tensor(arr: npt.NDArray[Any]) -> bytes:
    """Return ``arr`` in Triton's BYTES binary layout, elements in row-major order.

    Elements may be ``bytes`` or ``str`` (encoded as UTF-8), so onnxruntime's string
    outputs serialize as they are. Raises TensorError for any other element type or
    an element longer than 4 GiB - 1.
    """
    parts: list[bytes] = []
    for index, item in enumerate(arr.ravel(order="C").tolist()):
        if isinstance(item, bytes):
            data = item
        elif isinstance(item, str):
            data = item.encode("utf-8")
        else:
            raise TensorError(
                f"BYTES element {index} is a {type(item).__name__}; only bytes and str can be sent"
            )
        if len(data) > 0xFFFFFFFF:
            raise TensorError(f"BYTES element {index} is {len(data)} bytes; the limit is 4 GiB - 1")
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes_tensor(
    buf: bytes | bytearray | memoryview, count: int
) -> npt.NDArray[np.object_]:
    """Parse Triton's BYTES binary layout into a 1-D ``object`` array of ``count`` bytes.

    ``buf`` must hold exactly ``count`` elements: a truncated length prefix, a length
    that runs past the end, too few elements or trailing bytes raise TensorError
    saying which element and offset is wrong. Nothing is allocated for elements the
    buffer does not hold, whatever ``count`` says.
    """
    view = memoryview(buf).cast("B")
    size = len(view)
    items: list[bytes] = []
    offset = 0
    for index in range(count):
        if offset + 4 > size:
            raise TensorError(
                f"BYTES data ends after {index} of {count} elements: element {index} needs a "
                f"4-byte length at offset {offset} but only {size - offset} bytes remain"
            )
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > size:
            raise TensorError(
                f"BYTES element {index} declares {length} bytes at offset {offset} but only "
                f"{size - offset} bytes remain; each element is a 4-byte little-endian length "
                "followed by that many bytes"
            )
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if offset != size:
        raise TensorError(
            f"BYTES data holds {size - offset} bytes after its {count} elements; send exactly "
            f"{count} length-prefixed elements"
        )
    out = np.empty(count, dtype=np.object_)
    out[:] = items
    return out


def tensor_from_binary(
    name: str, datatype: str, shape: tuple[int, ...], data: bytes | memoryview
) -> npt.NDArray[Any]:
    """Build input ``name``'s array from its binary ``data``, reshaped to ``shape``.

    Fixed-size datatypes are little-endian and become a zero-copy, read-only view on
    ``data``; ``data`` must be exactly product(shape) × element size bytes, and BOOL
    bytes must be 0 or 1. BYTES data is Triton's length-prefixed layout and must hold
    exactly product(shape) elements. Raises TensorError naming the input otherwise.
    """
    _check_rank(name, shape)
    if datatype == "BYTES":
        # Each element takes at least its 4-byte length: more than len(data) is impossible.
        count = element_count(shape)
        if count > len(data):
            raise TensorError(
                f"input {name!r} has shape {format_shape(shape)} ({_count_text(count)} "
                f"elements) but its BYTES data is {len(data)} bytes; each element takes at "
                "least 4 bytes (its length)"
            )
        try:
            return _reshape(name, deserialize_bytes_tensor(data, count), shape)
        except TensorError as exc:
            raise TensorError(f"input {name!r}: {exc.message}") from None
    count = element_count(shape)
    expected = count * to_numpy_dtype(datatype).itemsize
    if len(data) != expected:
        raise TensorError(
            f"input {name!r} has shape {format_shape(shape)} ({_count_text(count)} {datatype} "
            f"elements, {_count_text(expected)} bytes) but its binary_data_size is {len(data)}"
        )
    array = np.frombuffer(data, dtype=to_numpy_dtype(datatype).newbyteorder("<"), count=count)
    if datatype == "BOOL" and count:
        raw = array.view(np.uint8)
        if int(raw.max()) > 1:
            index = int(np.argmax(raw > 1))
            raise TensorError(
                f"input {name!r} is BOOL but byte {index} of its binary data is "
                f"{int(raw[index])}; each BOOL element is one byte, 0 or 1"
            )
    return _reshape(name, array, shape)


# Which numpy kinds ``np.asarray`` may produce from JSON for each target kind.
_JSON_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}


def tensor_from_json(
    name: str, datatype: str, shape: tuple[int, ...], data: object
) -> npt.NDArray[Any]:
    """Build input ``name``'s array from its JSON ``data``, reshaped to ``shape``.

    ``data`` is a flat or nested (row-major) list holding product(shape) values:
    true/false for BOOL, integers within range for INT*/UINT*, numbers within range
    for FP*, strings for BYTES (stored UTF-8 encoded). Anything else raises
    TensorError naming the input, the datatype and the first offending element.
    Numbers mixed with true/false in one list are read as numbers, as numpy does.
    """
    if not isinstance(data, list):
        raise TensorError(
            f"input {name!r}: 'data' must be a list (flat or nested row-major), "
            f"got {_json_kind(data)}"
        )
    _check_rank(name, shape)
    if datatype == "BYTES":
        return _bytes_from_json(name, shape, data)
    target = to_numpy_dtype(datatype)
    if data and not isinstance(data[0], list):
        # A flat list's count, checked before numpy reads it: 16 million values sent for
        # 64 took numpy a second of the serving loop before the count was looked at.
        _check_count(name, shape, len(data))
    try:
        array = np.asarray(data)
    except ValueError:
        raise TensorError(
            f"input {name!r}: 'data' is a ragged or too deeply nested list; nested lists "
            "must be rectangular, or send the values as one flat list"
        ) from None
    count = _check_count(name, shape, array.size)
    if count == 0:
        return _reshape(name, np.empty(0, dtype=target), shape)
    if array.dtype.kind in _JSON_KINDS[target.kind] and _fits(array, target):
        with np.errstate(over="ignore"):
            result = array.astype(target)
    else:
        # Slow path, for errors and for lists numpy types loosely (e.g. [1, 2**64 - 1] is
        # read as float64): check each element exactly, then build from the checked list.
        flat = _flatten(data)
        for index, item in enumerate(flat):
            problem = _element_problem(datatype, target, item)
            if problem is not None:
                raise TensorError(
                    f"input {name!r} has datatype {datatype} but element {index} is {problem}"
                )
        with np.errstate(over="ignore"):
            result = np.array(flat, dtype=target)
    if target.kind == "f" and target.itemsize < 8 and np.isinf(result).any():
        # Infinity sent as such is a value (Triton's JSON reads it); a finite number too
        # large for the datatype is not.
        sent = np.asarray(data if array.dtype.kind == "f" else _flatten(data), dtype=np.float64)
        overflow = np.isinf(result.reshape(-1)) & np.isfinite(sent.reshape(-1))
        if not overflow.any():
            return result.reshape(shape)
        index = int(np.argmax(overflow))
        raise TensorError(
            f"input {name!r} has datatype {datatype} but element {index} is "
            f"{_flatten(data)[index]!r}, out of range (largest {np.finfo(target).max})"
        )
    return result.reshape(shape)


def _bytes_from_json(name: str, shape: tuple[int, ...], data: list[Any]) -> npt.NDArray[Any]:
    flat = _flatten(data)
    count = _check_count(name, shape, len(flat))
    result = np.empty(count, dtype=np.object_)
    for index, item in enumerate(flat):
        if not isinstance(item, str):
            raise TensorError(
                f"input {name!r} has datatype BYTES but element {index} is {_json_kind(item)}; "
                "send strings, or raw bytes as binary data"
            )
        try:
            result[index] = item.encode("utf-8")
        except UnicodeEncodeError:
            raise TensorError(
                f"input {name!r} element {index} is not encodable as UTF-8 (a lone surrogate?); "
                "send raw bytes as binary data"
            ) from None
    return _reshape(name, result, shape)


def _check_count(name: str, shape: tuple[int, ...], got: int) -> int:
    """Return the element count of ``shape``; raise TensorError unless it is ``got``."""
    count = element_count(shape)
    if got != count:
        raise TensorError(
            f"input {name!r} has shape {format_shape(shape)} ({_count_text(count)} elements) "
            f"but its data holds {got} elements"
        )
    return count


def _fits(array: npt.NDArray[Any], target: np.dtype[Any]) -> bool:
    if target.kind not in "iu":
        return True
    info = np.iinfo(target)
    return int(array.min()) >= info.min and int(array.max()) <= info.max


def _element_problem(datatype: str, target: np.dtype[Any], item: object) -> str | None:
    if target.kind == "b":
        return None if isinstance(item, bool) else f"{_json_kind(item)}; send true or false"
    if isinstance(item, bool) or not isinstance(item, int | float):
        return f"{_json_kind(item)}; send numbers"
    if target.kind in "iu":
        info = np.iinfo(target)
        in_range = info.min <= item <= info.max
        # orjson reads integers beyond 64 bits as floats: call those out of range, too.
        if isinstance(item, float) and (in_range or not item.is_integer()):
            return f"{item!r}, not an integer"
        return None if in_range else f"{item}, out of range [{info.min}, {info.max}]"
    try:
        float(item)
    except OverflowError:
        return f"{item}, out of range (largest {np.finfo(target).max})"
    return None


def _flatten(data: list[Any]) -> list[Any]:
    """Return the leaves of a nested list in row-major order, without recursion."""
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            flat.append(item)
        else:
            stack.pop()
    return flat


def _json_kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {brief_repr(value)}"
    return "a list" if isinstance(value, list) else "an object"
