"""A Python model's inputs and outputs, read from its configuration as Triton gives it
(``config.pbtxt`` or ``auto_complete_config``): names, Triton types, dims, ``reshape``
and ``optional``; the fields sordino does not do are refused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sordino.config.declared import check_reshape
from sordino.datatypes import from_triton_type
from sordino.errors import ModelLoadError
from sordino.inference import TensorSpec

__all__ = ["tensor_specs"]


def _datatype(triton_type: object, where: str) -> str:
    text = str(triton_type)
    if not text.startswith("TYPE_"):
        raise ModelLoadError(f"{where}: data_type {text!r} is not a Triton type (TYPE_FP32, ...)")
    return from_triton_type(text)


_UNSUPPORTED = ("allow_ragged_batch", "is_shape_tensor", "is_non_linear_format_io")
"""Tensor fields sordino does not do: refused when true."""


def tensor_specs(
    entries: Sequence[dict[str, Any]], batched: bool, where: str
) -> tuple[TensorSpec, ...]:
    """The inputs or outputs of a Python model's configuration (Triton's JSON form)."""
    specs = []
    for entry in entries:
        name = entry.get("name")
        if not name:
            raise ModelLoadError(f"{where}: every input and output needs a name")
        dims = [int(d) for d in entry.get("dims", ())]
        reshape = None
        if entry.get("reshape") is not None:
            reshape = tuple(int(d) for d in entry["reshape"].get("shape", ()))
            try:
                check_reshape(f"{where}: {name}", dims, reshape, batching=batched)
            except ValueError as exc:
                raise ModelLoadError(str(exc)) from None
        for field in _UNSUPPORTED:
            if entry.get(field) is True:
                raise ModelLoadError(
                    f"{where}: {name}: {field} is not supported by sordino; remove it"
                )
        shape = tuple([-1, *dims] if batched else dims)
        datatype = _datatype(entry.get("data_type"), where)
        optional = entry.get("optional") is True
        specs.append(TensorSpec(str(name), datatype, shape, optional, reshape))
    return tuple(specs)
