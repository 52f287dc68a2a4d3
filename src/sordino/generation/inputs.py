"""The scalar inputs of a generation request, checked: each mistake a 400 saying what to fix."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sordino.errors import InvalidRequest, TensorError
from sordino.inference import Tensor

__all__ = ["one_float", "one_int", "one_text"]

_INT_TYPES = ("INT64", "INT32", "INT16", "INT8", "UINT64", "UINT32", "UINT16", "UINT8")


def _one(array: Tensor, name: str) -> Any:
    values = np.asarray(array).reshape(-1)
    if values.size != 1:
        raise TensorError(f"input {name!r} takes one value, got {values.size}")
    return values[0]


def one_text(array: Tensor) -> str:
    value = _one(array, "prompt")
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise TensorError("input 'prompt' is not valid UTF-8 text") from None
    if not isinstance(value, str):
        raise TensorError(f"input 'prompt' must be text (BYTES), got {np.asarray(array).dtype}")
    if not value.strip():
        raise InvalidRequest("the prompt is empty; say which digit to draw, e.g. 'a handwritten 7'")
    return value


def one_int(array: Tensor, name: str, datatype: str | None, low: int, high: int) -> int:
    kind = np.asarray(array).dtype.kind
    if (datatype is not None and datatype not in _INT_TYPES) or kind not in "iu":
        shown = datatype or str(np.asarray(array).dtype)
        raise TensorError(f"input {name!r} must be an integer (INT64 or INT32), got {shown}")
    value = int(_one(array, name))
    if not low <= value <= high:
        if name == "steps":
            raise InvalidRequest(
                f"steps must be between {low} and {high} for this model, got {value}"
            )
        raise InvalidRequest(f"{name} must be between {low} and {high}, got {value}")
    return value


def one_float(array: Tensor, name: str, low: float, high: float) -> float:
    if np.asarray(array).dtype.kind not in "fiu":
        raise TensorError(f"input {name!r} must be a number (FP32), got {np.asarray(array).dtype}")
    value = float(_one(array, name))
    if not (low <= value <= high) or math.isnan(value):
        raise InvalidRequest(f"{name} must be between {low:g} and {high:g}, got {value:g}")
    return value
