"""``pb_utils.Tensor``: a named tensor of a Triton Python model (``triton_python_backend_utils``
re-exports it), an input a request carries or an output a model makes, over a numpy array.

As Triton's: numpy strings are kept as ``object`` arrays, and a ``BYTES`` tensor made of
other objects holds their ``str()`` (Triton serializes it as it is made); DLPack both ways
on the CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sordino.backends.python.triton_errors import TritonModelException
from sordino.backends.python.triton_types import numpy_to_triton_type

__all__ = ["Tensor", "private_inputs"]


def private_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch's input arrays as the model's own copies (one copy of each input a
    batch): a model may write into its inputs (``x /= 255``), as on Triton, whose stub
    has its own copy, and what it writes must reach nobody else — the arena's blocks are
    read again after it: by a pipeline's other steps, and by the batch's second run when
    its worker was lost."""
    return {
        name: array.copy() if type(array) is np.ndarray else array for name, array in batch.items()
    }


class Tensor:
    """A named tensor: an input of a request, or an output a model gives."""

    def __init__(self, name: str, data: Any) -> None:
        array = data if type(data) is np.ndarray else np.asarray(data)
        kind = array.dtype.kind
        if kind in "SU":
            array = array.astype(np.object_)
        elif kind == "O" and not all(isinstance(x, bytes | str) for x in array.flat):
            # Triton serializes a BYTES tensor as it is made: any other element, its str().
            made = np.empty(array.size, dtype=np.object_)
            made[:] = [x if isinstance(x, bytes | str) else str(x) for x in array.flat]
            array = made.reshape(array.shape)
        self._name = name
        self._array = array

    @classmethod
    def _of(cls, name: str, array: np.ndarray[Any, Any]) -> Tensor:
        """A tensor over ``array`` as it is (an input the backend gives ``execute``: an
        ndarray whose dtype is never a numpy string kind), as ``Tensor(name, array)``."""
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray[Any, Any]:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int | None:
        """Triton's data-type code (``TRITONSERVER_DataType``: 11 for FP32, 13 BYTES)."""
        return numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule over the data (strings have none); a copy's for a read-only
        array (``np.frombuffer`` of bytes), which numpy will not export, as Triton does."""
        array = self._array
        if array.dtype == np.object_:
            raise TritonModelException(f"tensor {self._name}: a string tensor has no DLPack form")
        return (array if array.flags.writeable else array.copy()).__dlpack__()

    @staticmethod
    def from_dlpack(name: str, dlpack: Any) -> Tensor:
        """A tensor over a DLPack producer (an object with ``__dlpack__``) or capsule."""
        source = dlpack if hasattr(dlpack, "__dlpack__") else _Capsule(dlpack)
        return Tensor(name, np.from_dlpack(source))


class _Capsule:
    """A bare DLPack capsule as numpy's ``from_dlpack`` takes producers (CPU only)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)
