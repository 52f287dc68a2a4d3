"""Datatype names, their numpy/ONNX/Triton counterparts, and the BYTES binary layout."""

from __future__ import annotations

import struct
import time
import tracemalloc
from typing import Any

import numpy as np
import pytest

from sordino.datatypes import (
    DATATYPES,
    MAX_RANK,
    brief_repr,
    deserialize_bytes_tensor,
    element_count,
    element_size,
    format_shape,
    from_numpy_dtype,
    from_onnx_type,
    serialize_bytes_tensor,
    tensor_from_binary,
    tensor_from_json,
    to_numpy_dtype,
    to_triton_type,
)
from sordino.errors import ModelLoadError, TensorError

NUMPY: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}
FIXED = [name for name in NUMPY if name != "BYTES"]


def packed(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def test_datatypes_lists_every_kserve_name() -> None:
    """DATATYPES holds exactly the thirteen KServe v2 names sordino serves."""
    assert set(DATATYPES) == set(NUMPY)


@pytest.mark.parametrize("datatype", list(NUMPY))
def test_to_numpy_dtype_maps_each_datatype(datatype: str) -> None:
    """Each datatype name maps to its numpy dtype; BYTES is object."""
    assert to_numpy_dtype(datatype) == np.dtype(NUMPY[datatype])


def test_to_numpy_dtype_rejects_unknown_name_listing_valid_ones() -> None:
    """An unknown name is a TensorError that lists the valid names."""
    with pytest.raises(TensorError, match=r"'FLOAT32'.*FP32.*BYTES"):
        to_numpy_dtype("FLOAT32")


@pytest.mark.parametrize("datatype", FIXED)
def test_from_numpy_dtype_inverts_to_numpy_dtype(datatype: str) -> None:
    """from_numpy_dtype gives back the name for every fixed-size dtype."""
    assert from_numpy_dtype(to_numpy_dtype(datatype)) == datatype


@pytest.mark.parametrize("dtype", [np.object_, np.dtype("U5"), np.dtype("S3"), str, bytes])
def test_from_numpy_dtype_maps_strings_and_objects_to_bytes(dtype: Any) -> None:
    """Object, str and bytes dtypes are all BYTES."""
    assert from_numpy_dtype(dtype) == "BYTES"


def test_from_numpy_dtype_ignores_byte_order() -> None:
    """A big-endian float32 is still FP32."""
    assert from_numpy_dtype(np.dtype(">f4")) == "FP32"


def test_from_numpy_dtype_rejects_complex() -> None:
    """A dtype the protocol cannot carry is a TensorError naming it."""
    with pytest.raises(TensorError, match="complex128"):
        from_numpy_dtype(np.complex128)


@pytest.mark.parametrize(
    ("onnx_type", "datatype"),
    [
        ("tensor(float)", "FP32"),
        ("tensor(float16)", "FP16"),
        ("tensor(double)", "FP64"),
        ("tensor(bool)", "BOOL"),
        ("tensor(int8)", "INT8"),
        ("tensor(int16)", "INT16"),
        ("tensor(int32)", "INT32"),
        ("tensor(int64)", "INT64"),
        ("tensor(uint8)", "UINT8"),
        ("tensor(uint16)", "UINT16"),
        ("tensor(uint32)", "UINT32"),
        ("tensor(uint64)", "UINT64"),
        ("tensor(string)", "BYTES"),
    ],
)
def test_from_onnx_type_maps_each_tensor_type(onnx_type: str, datatype: str) -> None:
    """onnxruntime NodeArg.type strings map to KServe names."""
    assert from_onnx_type(onnx_type) == datatype


@pytest.mark.parametrize("onnx_type", ["tensor(bfloat16)", "seq(tensor(float))"])
def test_from_onnx_type_rejects_unsupported_type_naming_it(onnx_type: str) -> None:
    """An unsupported ONNX type is a ModelLoadError that names it."""
    with pytest.raises(ModelLoadError, match=onnx_type.replace("(", r"\(").replace(")", r"\)")):
        from_onnx_type(onnx_type)


def test_to_triton_type_prefixes_type() -> None:
    """FP32 is TYPE_FP32 in a Triton model config."""
    assert to_triton_type("FP32") == "TYPE_FP32"


def test_to_triton_type_calls_bytes_string() -> None:
    """BYTES is TYPE_STRING in a Triton model config."""
    assert to_triton_type("BYTES") == "TYPE_STRING"


def test_to_triton_type_rejects_unknown_name() -> None:
    """An unknown name is a TensorError."""
    with pytest.raises(TensorError):
        to_triton_type("FP8")


@pytest.mark.parametrize("datatype", FIXED)
def test_element_size_is_numpy_itemsize(datatype: str) -> None:
    """Fixed-size datatypes report their element size in bytes."""
    assert element_size(datatype) == np.dtype(NUMPY[datatype]).itemsize


def test_element_size_of_bytes_is_none() -> None:
    """BYTES elements have no fixed size."""
    assert element_size("BYTES") is None


def test_serialize_bytes_tensor_prefixes_each_element_with_its_length() -> None:
    """Each element is a little-endian uint32 length followed by its bytes."""
    arr = np.array([b"ab", b"", b"xyz"], dtype=object)
    assert serialize_bytes_tensor(arr) == b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x03\x00\x00\x00xyz"


def test_serialize_bytes_tensor_encodes_str_as_utf8() -> None:
    """str elements (onnxruntime string outputs) are UTF-8 encoded."""
    arr = np.array(["é"], dtype=object)
    assert serialize_bytes_tensor(arr) == packed("é".encode())


def test_serialize_bytes_tensor_walks_row_major() -> None:
    """A 2-D tensor is serialized in row-major order, even when transposed in memory."""
    arr = np.array([[b"a", b"c"], [b"b", b"d"]], dtype=object).T
    assert serialize_bytes_tensor(arr) == packed(b"a", b"b", b"c", b"d")


def test_serialize_bytes_tensor_accepts_numpy_str_arrays() -> None:
    """A numpy unicode array serializes like its str elements."""
    assert serialize_bytes_tensor(np.array(["hi", "yo"])) == packed(b"hi", b"yo")


def test_serialize_bytes_tensor_of_empty_tensor_is_empty() -> None:
    """No elements, no bytes."""
    assert serialize_bytes_tensor(np.empty((0, 3), dtype=object)) == b""


def test_serialize_bytes_tensor_rejects_other_objects() -> None:
    """An element that is neither bytes nor str is a TensorError naming its index."""
    with pytest.raises(TensorError, match="element 1 is a int"):
        serialize_bytes_tensor(np.array([b"a", 3], dtype=object))


def test_serialize_bytes_tensor_matches_tritonclient() -> None:
    """The layout is byte-for-byte what tritonclient produces."""
    utils = pytest.importorskip("tritonclient.utils")
    arr = np.array([[b"\x00\xff", "naïve"], [b"", b"tail\x00"]], dtype=object)
    assert serialize_bytes_tensor(arr) == utils.serialize_byte_tensor(arr).item()


def test_deserialize_bytes_tensor_inverts_serialize() -> None:
    """Deserializing gives back the elements, as bytes, in a 1-D object array."""
    arr = np.array([b"a", b"", b"\x00\x01"], dtype=object)
    out = deserialize_bytes_tensor(serialize_bytes_tensor(arr), 3)
    assert out.dtype == np.object_
    assert out.tolist() == [b"a", b"", b"\x00\x01"]


def test_deserialize_bytes_tensor_with_no_elements() -> None:
    """An empty buffer holds zero elements."""
    assert deserialize_bytes_tensor(b"", 0).shape == (0,)


def test_deserialize_bytes_tensor_rejects_truncated_length_prefix() -> None:
    """A length prefix cut short is reported with its element and offset."""
    with pytest.raises(TensorError, match="element 1 needs a 4-byte length at offset 5"):
        deserialize_bytes_tensor(packed(b"a") + b"\x01\x00", 2)


def test_deserialize_bytes_tensor_rejects_length_past_the_end() -> None:
    """A length running past the end of the buffer is reported."""
    with pytest.raises(TensorError, match="element 0 declares 9 bytes"):
        deserialize_bytes_tensor(struct.pack("<I", 9) + b"abc", 1)


def test_deserialize_bytes_tensor_rejects_too_few_elements() -> None:
    """A buffer with fewer elements than asked for is reported."""
    with pytest.raises(TensorError, match="ends after 1 of 2 elements"):
        deserialize_bytes_tensor(packed(b"a"), 2)


def test_deserialize_bytes_tensor_rejects_trailing_bytes() -> None:
    """Bytes left after the last element are reported."""
    with pytest.raises(TensorError, match="5 bytes after its 1 elements"):
        deserialize_bytes_tensor(packed(b"a", b"b"), 1)


def test_tensor_from_json_reshapes_flat_data() -> None:
    """Flat JSON data is reshaped to the declared shape."""
    out = tensor_from_json("x", "INT32", (2, 2), [1, 2, 3, 4])
    np.testing.assert_array_equal(out, np.array([[1, 2], [3, 4]], dtype=np.int32))


def test_tensor_from_binary_is_a_read_only_view() -> None:
    """Binary data becomes a view on the buffer, not a copy."""
    buf = np.arange(4, dtype="<i4").tobytes()
    out = tensor_from_binary("x", "INT32", (2, 2), memoryview(buf))
    assert not out.flags.writeable
    assert not out.flags.owndata
    np.testing.assert_array_equal(out, [[0, 1], [2, 3]])


def test_element_count_stops_past_its_bound() -> None:
    """40,000 huge dimensions cost no big-integer arithmetic: the count stops at the bound."""
    started = time.perf_counter()
    assert element_count([2**62] * 40_000, most=100) == 101
    assert element_count([2**62] * 40_000 + [0], most=100) == 0
    assert element_count([2, 3, 4]) == 24
    assert time.perf_counter() - started < 0.5


def test_format_shape_elides_long_shapes() -> None:
    assert format_shape([1, 64]) == "[1, 64]"
    text = format_shape([2**62] * 40_000)
    assert "40000 dimensions" in text and len(text) < 300


def test_brief_repr_never_writes_out_big_or_deep_values() -> None:
    deep: list[Any] = []
    for _ in range(5000):
        deep = [deep]
    assert brief_repr(deep) == "a list of 1 items"
    assert len(brief_repr("x" * 10_000)) < 50
    assert "30 digits" in brief_repr(10**5000)


def test_deserialize_bytes_tensor_allocates_nothing_for_a_declared_count() -> None:
    """A 4-byte buffer declaring 2**28 elements is refused without a 2 GB array."""
    tracemalloc.start()
    try:
        started = time.perf_counter()
        with pytest.raises(TensorError, match="ends after 1 of 268435456"):
            deserialize_bytes_tensor(struct.pack("<I", 0), 2**28)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert time.perf_counter() - started < 0.5


def test_binary_bytes_count_beyond_the_data_is_refused_before_parsing() -> None:
    with pytest.raises(TensorError, match=r"'s' has shape .*\(268435456 elements\) but its BYTES"):
        tensor_from_binary("s", "BYTES", (2**28, 1), struct.pack("<I", 0))


@pytest.mark.parametrize("shape", [(2**62,) * 40, (1,) * (MAX_RANK + 1)])
def test_too_many_dimensions_are_refused(shape: tuple[int, ...]) -> None:
    with pytest.raises(TensorError, match=f"at most {MAX_RANK}"):
        tensor_from_json("x", "FP32", shape, [1.0])
    with pytest.raises(TensorError, match=f"at most {MAX_RANK}"):
        tensor_from_binary("x", "FP32", shape, b"\0" * 4)


@pytest.mark.parametrize("datatype", ["FP32", "BYTES"])
def test_empty_tensor_with_impossible_dimensions_is_refused(datatype: str) -> None:
    """No elements, but dimensions numpy cannot hold: a TensorError, not numpy's ValueError."""
    with pytest.raises(TensorError, match="no elements"):
        tensor_from_json("x", datatype, (0, 2**62, 2**62), [])
    with pytest.raises(TensorError, match="no elements"):
        tensor_from_binary("x", datatype, (0, 2**63 - 1, 4), b"")


def test_huge_count_mismatch_is_reported_not_raised_while_formatting() -> None:
    with pytest.raises(TensorError, match=r"\(30 dimensions\) \(more than \d+ elements\)"):
        tensor_from_json("x", "FP32", (2**62,) * 30, [1.0])
