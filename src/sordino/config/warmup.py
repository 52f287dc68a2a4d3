"""A model's ``model_warmup``: samples run through each instance before the model serves.

Written as in Triton's ``config.pbtxt`` (``model_warmup [ { ... } ]``), or in YAML::

    model_warmup:
      - name: zeros
        batch_size: 4                     # rows; the inputs below are one row, repeated
        count: 2                          # runs of this sample (0 or 1: once)
        inputs:
          INPUT0: {data_type: TYPE_FP32, dims: [16], zero_data: true}
          INPUT1: {data_type: TYPE_FP32, dims: [16], random_data: true}
          TEXT: {data_type: TYPE_STRING, dims: [1], input_data_file: text.bin}

Each input gives exactly one of ``zero_data``, ``random_data`` or
``input_data_file``, a file of the model folder's ``warmup/`` holding the raw row in
row-major order (a string element is a 4-byte little-endian length, then its
bytes). The samples are checked against the model's inputs when it loads
(``execution/warmup.py``); a sample that fails fails the load, as on Triton.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from sordino.config.base import Section

__all__ = ["WarmupInput", "WarmupSample"]


class WarmupInput(Section):
    """One input of a warm-up sample: its datatype, one row's shape and its data."""

    data_type: str = Field(pattern=r"^TYPE_[A-Z0-9]+$")
    """Triton's name (``TYPE_FP32``, ``TYPE_STRING``, ...)."""
    dims: tuple[int, ...] = ()
    """One row's shape (no batch dimension); every dimension given (no -1)."""
    zero_data: bool = False
    random_data: bool = False
    input_data_file: str | None = None
    """A file name in the model folder's ``warmup/``."""

    @model_validator(mode="after")
    def _one_source(self) -> WarmupInput:
        given = [self.zero_data, self.random_data, self.input_data_file is not None]
        if sum(given) != 1:
            raise ValueError(
                "give exactly one of zero_data: true, random_data: true or input_data_file"
            )
        if any(d < 0 for d in self.dims):
            raise ValueError(f"dims {list(self.dims)}: give every dimension (no -1)")
        return self


class WarmupSample(Section):
    """One warm-up request, run ``count`` times (at least once) on each instance."""

    name: str = Field(min_length=1)
    batch_size: int = Field(default=1, ge=0)
    """Rows (0 or 1 for a model that does not batch)."""
    inputs: dict[str, WarmupInput] = Field(min_length=1)
    count: int = Field(default=0, ge=0)
    """Runs of the sample; 0 is one, as Triton reads it."""
