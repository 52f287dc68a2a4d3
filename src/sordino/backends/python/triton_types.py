"""The data-type helpers of ``triton_python_backend_utils``, as Triton's Python backend
(r24.10, Triton 2.51) gives them: the table of configuration type names, the
converters between numpy types and Triton's data-type codes (``TRITONSERVER_DataType``:
1 for BOOL up to 13 for BYTES), and the length-prefixed serialization of a BYTES
tensor (each element a little-endian 4-byte length, then its bytes). Importable from
``triton_python_backend_utils`` under the same names.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from sordino.datatypes import serialize_bytes_tensor

__all__ = [
    "TRITON_STRING_TO_NUMPY",
    "deserialize_bytes_tensor",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
]

TRITON_STRING_TO_NUMPY: dict[str, type] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
"""A configuration's data type name -> its numpy type."""

_CODES: tuple[type, ...] = (
    np.bool_,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.float16,
    np.float32,
    np.float64,
    np.object_,
)
"""Triton's data-type codes, from 1: the numpy type of each."""

_LENGTH = struct.Struct("<I")


def triton_string_to_numpy(triton_type_string: str) -> type:
    """The numpy type of a configuration's data type name (``"TYPE_FP32"`` ->
    ``np.float32``); KeyError for a name that is none, as on Triton."""
    try:
        return TRITON_STRING_TO_NUMPY[triton_type_string]
    except KeyError:
        known = ", ".join(TRITON_STRING_TO_NUMPY)
        raise KeyError(f"unknown Triton data type {triton_type_string!r}; known: {known}") from None


def triton_to_numpy_type(data_type: int) -> type | None:
    """The numpy type of Triton's data-type code (11 -> ``np.float32``), else None."""
    return _CODES[data_type - 1] if isinstance(data_type, int) and 1 <= data_type <= 13 else None


def numpy_to_triton_type(data_type: Any) -> int | None:
    """Triton's data-type code of a numpy type (``np.float32`` -> 11), else None;
    ``np.object_`` and ``np.bytes_`` are BYTES (13)."""
    if data_type is np.bytes_ or data_type is np.object_:
        return 13
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in "OS":
        return 13
    for code, numpy_type in enumerate(_CODES[:-1], start=1):
        if dtype == np.dtype(numpy_type):
            return code
    return None


def serialize_byte_tensor(input_tensor: np.ndarray[Any, Any]) -> Any:
    """A BYTES tensor (``np.object_`` or ``np.bytes_``) as its elements, in C order, each
    a 4-byte little-endian length and the bytes (``str`` elements as UTF-8); ``()`` for
    an empty tensor and None for any other dtype, as Triton's."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    elements = np.empty(input_tensor.size, dtype=np.object_)
    # Triton writes any other element as its str(); sordino's writer takes bytes and str.
    elements[:] = [x if isinstance(x, bytes | str) else str(x) for x in input_tensor.ravel()]
    return serialize_bytes_tensor(elements)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray[Any, Any]:
    """The 1-D ``np.object_`` array of the elements :func:`serialize_byte_tensor` wrote."""
    view = memoryview(encoded_tensor)
    elements = []
    offset = 0
    while offset < len(view):
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += _LENGTH.size
        if offset + length > len(view):
            raise ValueError(
                f"a BYTES element of {length} bytes runs past the end of the encoded tensor "
                f"({len(view)} bytes)"
            )
        elements.append(bytes(view[offset : offset + length]))
        offset += length
    array = np.empty(len(elements), dtype=np.object_)
    array[:] = elements
    return array
