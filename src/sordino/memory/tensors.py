"""Tensor handles: a tensor's place in the arena, small enough to send between processes.

Numeric tensors are stored raw, C order; a worker maps them in place with
:func:`view_tensor`. ``BYTES`` tensors are stored in the KServe binary layout (each
element a 4-byte little-endian length and its bytes) and parsed on read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sordino.datatypes import deserialize_bytes_tensor, serialize_bytes_tensor
from sordino.memory.allocator import Block

__all__ = ["BYTES", "TensorHandle", "tensor_nbytes", "view_tensor", "write_tensor"]

BYTES = "bytes"
"""The ``dtype`` of a handle whose elements are length-prefixed byte strings."""


@dataclass(frozen=True, slots=True)
class TensorHandle:
    """Where a tensor lies in the arena: ``nbytes`` at ``offset``, with its dtype and shape.

    ``dtype`` is a numpy dtype string (``"<f4"``) or :data:`BYTES`. ``capacity`` is the
    size of the block reserved there, which may be larger than ``nbytes``.
    """

    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    capacity: int = 0

    @classmethod
    def space(cls, block: Block) -> TensorHandle:
        """A handle for an empty block the receiver may write a tensor into."""
        return cls(block.offset, 0, "", (), block.size)


def _is_bytes(array: npt.NDArray[Any]) -> bool:
    return array.dtype == np.object_ or array.dtype.kind in ("S", "U")


def tensor_nbytes(array: npt.NDArray[Any]) -> int:
    """Bytes ``array`` takes in the arena (BYTES tensors in their serialized layout)."""
    if _is_bytes(array):
        return len(serialize_bytes_tensor(np.asarray(array, dtype=object)))
    return int(array.nbytes)


def write_tensor(buffer: memoryview, offset: int, capacity: int, array: Any) -> TensorHandle:
    """Copy ``array`` into ``buffer`` at ``offset`` (at most ``capacity`` bytes)."""
    array = np.asarray(array)
    if _is_bytes(array):
        data = serialize_bytes_tensor(np.asarray(array, dtype=object))
        if len(data) > capacity:
            raise ValueError(f"tensor of {len(data)} bytes does not fit in {capacity}")
        buffer[offset : offset + len(data)] = data
        return TensorHandle(offset, len(data), BYTES, tuple(array.shape), capacity)
    if array.nbytes > capacity:
        raise ValueError(f"tensor of {array.nbytes} bytes does not fit in {capacity}")
    target: npt.NDArray[Any] = np.ndarray(array.shape, array.dtype, buffer, offset)
    target[...] = array
    return TensorHandle(offset, int(array.nbytes), array.dtype.str, tuple(array.shape), capacity)


def view_tensor(buffer: memoryview, handle: TensorHandle) -> npt.NDArray[Any]:
    """Return the tensor at ``handle``: a view into the arena for numeric tensors."""
    if handle.dtype == BYTES:
        count = math.prod(handle.shape)
        data = buffer[handle.offset : handle.offset + handle.nbytes]
        return deserialize_bytes_tensor(data, count).reshape(handle.shape)
    return np.ndarray(handle.shape, np.dtype(handle.dtype), buffer, handle.offset)
