"""The extension parameters of inputs and outputs: classification and shared memory.

Shared on both wires (``codec.py`` for HTTP/JSON, ``grpc_codec.py``): an input or
output that names a ``shared_memory_region`` is read from or written into that
registered region (:func:`shared_memory_parameters`, :func:`shared_memory_entry`); an
output's ``classification`` asks for the top classes instead of the tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sordino.datatypes import brief_repr, serialize_bytes_tensor
from sordino.errors import InvalidRequest
from sordino.inference import RequestedOutput, Tensor

__all__ = [
    "output_byte_size",
    "refuse_output_extensions",
    "shared_memory_entry",
    "shared_memory_parameters",
    "wants_shared_memory",
]


def refuse_output_extensions(name: str, parameters: Mapping[str, Any]) -> None:
    """Check an output's extension parameters (classification, shared memory)."""
    if "classification" in parameters:
        count = parameters["classification"]
        if type(count) is not int or count < 1:
            raise InvalidRequest(
                f"output {name!r}: classification is {brief_repr(count)}; it must be a "
                "positive number of classes"
            )
        if "shared_memory_region" in parameters:
            raise InvalidRequest(
                f"output {name!r}: a classification output cannot be written into shared "
                "memory; ask for one or the other"
            )
    shared_memory_parameters(f"output {name!r}", parameters)


def shared_memory_parameters(
    owner: str, parameters: Mapping[str, Any]
) -> tuple[str, int, int] | None:
    """Return ``(region, byte_size, offset)`` when ``parameters`` name a shared-memory region.

    Raises InvalidRequest for a region without a byte size, or a size or offset that is
    not a non-negative integer.
    """
    region = parameters.get("shared_memory_region")
    if region is None:
        for key in ("shared_memory_byte_size", "shared_memory_offset"):
            if key in parameters:
                raise InvalidRequest(
                    f"{owner} has {key} but no shared_memory_region; name the region too"
                )
        return None
    if not isinstance(region, str) or not region:
        raise InvalidRequest(
            f"{owner}: shared_memory_region is {brief_repr(region)}; give the name of a "
            "registered region"
        )
    size = parameters.get("shared_memory_byte_size")
    offset = parameters.get("shared_memory_offset", 0)
    for key, value in (("shared_memory_byte_size", size), ("shared_memory_offset", offset)):
        if type(value) is not int or value < 0:
            raise InvalidRequest(
                f"{owner}: {key} is {brief_repr(value)}; it must be a non-negative byte count"
            )
    assert isinstance(size, int) and isinstance(offset, int)
    return region, size, offset


def shared_memory_entry(parameters: Mapping[str, Any], array: Tensor) -> dict[str, Any]:
    """The parameters of a response entry for an output written into a region."""
    entry: dict[str, Any] = {
        "shared_memory_region": parameters["shared_memory_region"],
        "shared_memory_byte_size": output_byte_size(array),
    }
    offset = parameters.get("shared_memory_offset", 0)
    if offset:
        entry["shared_memory_offset"] = offset
    return entry


def output_byte_size(array: Tensor) -> int:
    """The bytes ``array`` takes on the wire (BYTES: Triton's length-prefixed layout)."""
    if array.dtype == np.object_:
        return len(serialize_bytes_tensor(array))
    return int(array.nbytes)


def wants_shared_memory(output: RequestedOutput) -> bool:
    """True when ``output`` is to be written into a shared-memory region, not the response."""
    return "shared_memory_region" in output.parameters
