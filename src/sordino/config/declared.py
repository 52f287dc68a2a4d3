"""An input or output as a Triton ``config.pbtxt`` declares it, and Triton's rules for a
``reshape`` (``backends/reshape.py`` applies one)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pydantic import Field, field_validator

from sordino.config.base import Section

__all__ = ["DeclaredTensor", "check_reshape"]


class DeclaredTensor(Section):
    """An input or output as a Triton ``config.pbtxt`` declares it: checked against the
    model when it loads (``backends/onnx_pbtxt.py``)."""

    name: str
    data_type: str = Field(pattern=r"^TYPE_[A-Z0-9]+$")
    dims: tuple[int, ...] = ()
    """Without the batch dimension when ``max_batch_size`` is above 0; -1: any size."""
    reshape: tuple[int, ...] | None = None
    """The shape the model itself takes or gives, when it is not ``dims`` (Triton's
    ``reshape { shape: [...] }``; also written ``reshape: {shape: [...]}``): clients send
    and read ``dims``, the model ``reshape``, the same elements in the same order.
    Without the batch dimension when ``max_batch_size`` is above 0; ``[]`` for a model
    that batches and takes (or gives) only the batch dimension."""

    @field_validator("reshape", mode="before")
    @classmethod
    def _triton_form(cls, value: object) -> object:
        if isinstance(value, Mapping):  # Triton's JSON and pbtxt: {shape: [...]}
            unknown = sorted(set(value) - {"shape"})
            if unknown:
                raise ValueError(f"reshape takes only shape (got {unknown})")
            return value.get("shape", ())
        return value


def _trunks(shape: Sequence[int]) -> list[int]:
    """The element counts between variable (``-1``) dimensions."""
    counts, current = [], 1
    for dim in shape:
        if dim == -1:
            counts.append(current)
            current = 1
        else:
            current *= dim
    counts.append(current)
    return counts


def check_reshape(where: str, dims: Sequence[int], shape: Sequence[int], *, batching: bool) -> None:
    """Refuse a ``reshape`` Triton refuses (``ValueError`` saying what to change):
    sizes of at least 1 or ``-1``; as many elements on both sides, between variable
    dimensions too; an empty reshape only of one element, for a model that batches."""
    if not shape and not batching:
        raise ValueError(
            f"{where}: an empty reshape needs max_batch_size above 0 (the model would take "
            "a scalar, which is not supported); give the shape"
        )
    for label, values in (("dims", dims), ("reshape", shape)):
        bad = [d for d in values if d < 1 and d != -1]
        if bad:
            raise ValueError(
                f"{where}: {label} {list(values)}: each size must be at least 1, or -1 for "
                "a dimension of any size"
            )
    if not shape:  # Triton's special case: an empty reshape of one element
        if -1 in dims or math.prod(dims) != 1:
            raise ValueError(
                f"{where}: dims {list(dims)} and an empty reshape: an empty reshape holds "
                "one element, so dims must be [1]"
            )
        return
    if _trunks(dims) != _trunks(shape):
        raise ValueError(
            f"{where}: dims {list(dims)} and reshape {list(shape)} do not hold the same "
            "elements (each run of sizes between -1s must hold as many on both sides)"
        )
