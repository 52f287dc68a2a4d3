"""A model's ``model_warmup`` samples made into requests, checked against its inputs.

:func:`warmup_requests` turns each :class:`~sordino.config.warmup.WarmupSample` into
the inputs of one request (``batch_size`` rows of the row it describes), checking
them as Triton does when the model loads: every input the model requires is given
and no other, with the model's datatype and a shape its own fits; ``batch_size`` is
at most the model's ``max_batch_size`` (0 or 1 for a model that does not batch).
The loader runs each ``count`` times on each instance before the model serves
(``server/loader.py``). Every mistake is a :class:`ModelLoadError` naming the model,
the sample and what to fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sordino.config.warmup import WarmupInput, WarmupSample
from sordino.datatypes import deserialize_bytes_tensor, from_triton_type, to_numpy_dtype
from sordino.errors import ModelLoadError, TensorError
from sordino.inference import ModelMetadata, Tensor, TensorSpec
from sordino.server.data_files import raw_array, read_data_file

__all__ = ["WarmupRequest", "warmup_requests"]


@dataclass(frozen=True, slots=True)
class WarmupRequest:
    """One sample's inputs and how many times each instance runs them."""

    name: str
    inputs: dict[str, Tensor]
    runs: int


def warmup_requests(
    samples: Sequence[WarmupSample],
    metadata: ModelMetadata,
    *,
    max_batch_size: int,
    folder: Path,
) -> list[WarmupRequest]:
    """The requests ``samples`` describe for the model ``metadata`` describes (its
    files in ``folder``, whose ``warmup/`` holds the samples' data files)."""
    requests = []
    for sample in samples:
        where = f"model {metadata.name}: model_warmup {sample.name!r}"
        rows = _rows(sample, metadata, max_batch_size, where)
        given = set(sample.inputs)
        missing = [s.name for s in metadata.inputs if not s.optional and s.name not in given]
        if missing:
            raise ModelLoadError(f"{where} lacks input {', '.join(missing)}; give every input")
        inputs: dict[str, Tensor] = {}
        for name, value in sample.inputs.items():
            spec = metadata.input(name)
            if spec is None:
                known = ", ".join(s.name for s in metadata.inputs)
                raise ModelLoadError(
                    f"{where}: the model has no input {name!r} (inputs: {known}); remove it"
                )
            row = _row(value, spec, metadata.batched, folder, f"{where}, input {name}")
            inputs[name] = np.stack([row] * rows) if metadata.batched else row
        requests.append(WarmupRequest(sample.name, inputs, max(sample.count, 1)))
    return requests


def _rows(sample: WarmupSample, metadata: ModelMetadata, max_batch_size: int, where: str) -> int:
    if not metadata.batched:
        if sample.batch_size > 1:
            raise ModelLoadError(
                f"{where}: batch_size {sample.batch_size}, but the model does not batch; set 1"
            )
        return 1
    if sample.batch_size < 1 or (max_batch_size and sample.batch_size > max_batch_size):
        raise ModelLoadError(
            f"{where}: batch_size {sample.batch_size}; give 1 to the model's "
            f"max_batch_size ({max_batch_size})"
        )
    return sample.batch_size


def _row(value: WarmupInput, spec: TensorSpec, batched: bool, folder: Path, where: str) -> Tensor:
    """One row of the input (the whole input for a model that does not batch)."""
    datatype = from_triton_type(value.data_type)
    if datatype != spec.datatype:
        raise ModelLoadError(
            f"{where}: data_type {value.data_type}, but the model's input is {spec.datatype}"
        )
    declared = spec.item_shape if batched else spec.shape
    dims = value.dims
    fits = len(dims) == len(declared) and all(
        w in (-1, d) for d, w in zip(dims, declared, strict=True)
    )
    if not fits:
        raise ModelLoadError(f"{where}: dims {list(dims)} do not fit the model's {list(declared)}")
    count = int(np.prod(dims, dtype=np.int64)) if dims else 1
    if datatype == "BYTES":
        if value.input_data_file is not None:
            data = _read(folder, value.input_data_file, where)
            try:
                return deserialize_bytes_tensor(data, count).reshape(dims)
            except TensorError as exc:
                raise ModelLoadError(f"{where}: {value.input_data_file}: {exc}") from None
        if value.random_data:
            digits = np.random.default_rng(0).integers(0, 10, count)
            return np.array([str(d).encode() for d in digits], dtype=object).reshape(dims)
        return np.full(dims, b"0", dtype=object)
    dtype = to_numpy_dtype(datatype)
    if value.input_data_file is not None:
        data = _read(folder, value.input_data_file, where)
        return raw_array(data, spec.datatype, dims, value.input_data_file, where)
    if value.random_data:
        rng = np.random.default_rng(0)
        if dtype.kind == "f":
            return rng.standard_normal(dims).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, dims).astype(dtype)
        return rng.integers(0, 100, dims).astype(dtype)
    return np.zeros(dims, dtype=dtype)


def _read(folder: Path, name: str, where: str) -> bytes:
    """The data file ``name`` of the model folder's ``warmup/``."""
    return read_data_file(folder, "warmup", name, "input_data_file", where)
