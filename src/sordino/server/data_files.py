"""Data files of a model's folder: ``warmup/`` (``model_warmup``'s ``input_data_file``,
``server/warmup.py``) and ``initial_state/`` (a sequence state's ``initial_state {
data_file }``, ``server/sequences.py``), read as Triton reads them: a tensor's raw
elements in row-major order, little-endian."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sordino.datatypes import to_numpy_dtype
from sordino.errors import ModelLoadError

__all__ = ["raw_array", "read_data_file"]


def read_data_file(folder: Path, kind: str, name: str, field: str, where: str) -> bytes:
    """The data file ``name`` of the model folder's ``kind/`` (``field`` names it);
    never a file outside the model folder (a path, or a symbolic link that leads out, is
    refused)."""
    path = folder / kind / name
    inside = path.resolve().is_relative_to(folder.resolve())
    if Path(name).name != name or not path.is_file() or not inside:
        raise ModelLoadError(f"{where}: {field} {name!r} is not a file in {folder / kind}")
    return path.read_bytes()


def raw_array(data: bytes, datatype: str, dims: Sequence[int], name: str, where: str) -> np.ndarray:
    """``data``, the file ``name``, as a numeric tensor of ``datatype`` and ``dims``: its
    raw little-endian elements, as many as ``dims`` holds (ModelLoadError otherwise)."""
    dtype = np.dtype(to_numpy_dtype(datatype))
    count = int(np.prod(dims, dtype=np.int64)) if dims else 1
    if len(data) != count * dtype.itemsize:
        raise ModelLoadError(
            f"{where}: {name} holds {len(data)} bytes, but "
            f"{count} {datatype} elements take {count * dtype.itemsize}"
        )
    return np.frombuffer(data, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(dims)
