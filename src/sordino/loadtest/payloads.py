"""Request bodies in KServe v2's binary tensor extension, built before the run starts.

From the model's metadata (``GET /v2/models/NAME``) each input gets a random tensor of
its datatype and shape: the batch dimension (a leading ``-1``) is the request's row
count and any other ``-1`` is 1. A model with example inputs gets those instead: a
sordino generator (its configuration's platform ``sordino_iterative``) its example
prompts, which random text would not be. Or the tensors come from a file in perf_analyzer's
input-data format (``--data file.json``)::

    {"data": [{"INPUT0": [1, 2, 3, 4]},
              {"INPUT0": {"content": [1, 2, 3, 4], "shape": [2, 2]}},
              {"INPUT0": {"b64": "AAAAAA=="}}]}

Bodies are bytes prepared once per traffic class (a few different ones each, sent in
turn), so the sender spends no CPU making tensors while it runs. The same body works
against any KServe v2 server with the binary extension (sordino, Triton, KServe).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sordino.datatypes import serialize_bytes_tensor, to_numpy_dtype
from sordino.errors import ConfigError

__all__ = [
    "EXAMPLE_PROMPTS",
    "GENERATOR_PLATFORM",
    "InputSpec",
    "Payload",
    "build_payloads",
    "build_stream_payloads",
    "example_payloads",
    "read_data_file",
]

_VARIANTS = 8  # different random bodies per class, sent in turn


@dataclass(frozen=True, slots=True)
class InputSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]

    @classmethod
    def from_metadata(cls, entry: dict[str, Any]) -> InputSpec:
        return cls(
            str(entry["name"]), str(entry["datatype"]), tuple(int(d) for d in entry["shape"])
        )


@dataclass(frozen=True, slots=True)
class Payload:
    """One request body and the headers that go with it."""

    body: bytes
    header_length: int | None
    """The JSON header's length in a binary body; None for a JSON body (generate)."""

    @property
    def headers(self) -> dict[str, str]:
        if self.header_length is None:
            return {"Content-Type": "application/json"}
        return {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(self.header_length),
        }


def _shape(spec: InputSpec, rows: int) -> tuple[int, ...]:
    dims = list(spec.shape)
    if dims and dims[0] < 0:
        dims[0] = rows
    return tuple(1 if d < 0 else d for d in dims)


GENERATOR_PLATFORM = "sordino_iterative"
"""The platform a sordino generator (digits-diffusion) reports in its model configuration."""

EXAMPLE_PROMPTS = (
    "a handwritten 7", "seven", "7", "draw a three", "a handwritten 0", "nine", "draw a 4",
    "a handwritten five",
)  # fmt: skip
"""Prompts the built-in digit generator takes: what ``sordino stress-test`` sends a
generator by default. Kept here, on the client's side of the layers (the load test
speaks HTTP and imports no serving code); a test checks the generator's own prompt
parser takes each of them."""


def example_payloads(inputs: list[InputSpec]) -> list[Payload] | None:
    """Bodies from a generator's example prompts (``prompt`` alone; the server picks
    seed, steps and guidance), or None when the model takes no ``prompt`` text.

    Random text is no prompt: a generator refuses it (400), so a load test of random
    bodies would measure refusals, not generation.
    """
    spec = next((s for s in inputs if s.name == "prompt" and s.datatype == "BYTES"), None)
    if spec is None:
        return None
    return [
        _encode({"prompt": ("BYTES", np.array([text.encode()], dtype=object))})
        for text in EXAMPLE_PROMPTS
    ]


def _random(spec: InputSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if spec.datatype == "BYTES":
        count = int(np.prod(shape))
        flat = np.array([rng.bytes(8).hex().encode() for _ in range(count)], dtype=object)
        return flat.reshape(shape)
    dtype = to_numpy_dtype(spec.datatype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, 16, shape).astype(dtype)


def _encode(tensors: dict[str, tuple[str, np.ndarray]]) -> Payload:
    inputs, blobs = [], []
    for name, (datatype, array) in tensors.items():
        raw = (
            serialize_bytes_tensor(array)
            if datatype == "BYTES"
            else np.ascontiguousarray(array).tobytes()
        )
        blobs.append(raw)
        inputs.append(
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": datatype,
                "parameters": {"binary_data_size": len(raw)},
            }
        )
    # Outputs come back binary too (as perf_analyzer asks): cheaper to read, and BYTES
    # outputs that are not text (a generator's PNG) cannot be sent as JSON at all.
    header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    return Payload(header + b"".join(blobs), len(header))


def build_payloads(
    inputs: list[InputSpec],
    rows: int,
    *,
    data: list[dict[str, np.ndarray]] | None = None,
    seed: int = 0,
) -> list[Payload]:
    """The bodies to send for requests of ``rows`` rows, random or from ``data``."""
    if data:
        out = []
        for entry in data:
            tensors = {}
            for spec in inputs:
                if spec.name not in entry:
                    raise ConfigError(
                        f"--data has no tensor for input {spec.name!r} in one of its entries; "
                        f"every entry must give {', '.join(i.name for i in inputs)}"
                    )
                tensors[spec.name] = (spec.datatype, entry[spec.name])
            out.append(_encode(tensors))
        return out
    rng = np.random.default_rng(seed)
    return [
        _encode({s.name: (s.datatype, _random(s, _shape(s, rows), rng)) for s in inputs})
        for _ in range(_VARIANTS)
    ]


def build_stream_payloads(
    inputs: list[InputSpec],
    values: dict[str, Any] | None,
    *,
    data: list[dict[str, np.ndarray]] | None = None,
    seed: int = 0,
) -> list[Payload]:
    """JSON bodies for ``generate_stream`` (one request, one row): the profile's
    ``inputs`` values, else each ``--data`` entry, else random values per input."""
    if values is not None:
        known = {s.name for s in inputs}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"the streaming class's inputs name {', '.join(map(repr, unknown))}, which "
                f"the model does not have (its inputs: {', '.join(sorted(known))})"
            )
        return [Payload(json.dumps(values).encode(), None)]
    if data:
        entries = [{k: _json_values(v) for k, v in entry.items()} for entry in data]
    else:
        rng = np.random.default_rng(seed)
        entries = [
            {s.name: _json_values(_random(s, _shape(s, 1)[1:] or (1,), rng)) for s in inputs}
            for _ in range(_VARIANTS)
        ]
    return [Payload(json.dumps(entry).encode(), None) for entry in entries]


def _json_values(array: np.ndarray) -> list[Any]:
    flat = np.ravel(array)
    if flat.dtype == object:
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in flat]
    return list(flat.tolist())


def _tensor(name: str, value: object, spec: InputSpec) -> np.ndarray:
    shape: tuple[int, ...] | None = None
    if isinstance(value, dict):
        if "shape" in value:
            shape = tuple(int(d) for d in value["shape"])
        if "b64" in value:
            raw = base64.b64decode(value["b64"])
            if spec.datatype == "BYTES":
                return np.array([raw], dtype=object)
            flat = np.frombuffer(raw, dtype=to_numpy_dtype(spec.datatype))
            return flat.reshape(shape or _fill(spec, flat.size, name))
        value = value.get("content")
    if not isinstance(value, list):
        raise ConfigError(
            f"--data input {name!r}: expected a list, or an object with 'content' (and "
            f"optionally 'shape') or 'b64', not {type(value).__name__}"
        )
    if spec.datatype == "BYTES":
        flat = np.array([str(v).encode() for v in np.ravel(np.array(value, dtype=object))], object)
    else:
        flat = np.ravel(np.array(value, dtype=to_numpy_dtype(spec.datatype)))
    target = shape or _fill(spec, flat.size, name)
    if int(np.prod(target)) != flat.size:
        raise ConfigError(
            f"--data input {name!r} has {flat.size} values, but shape {list(target)} needs "
            f"{int(np.prod(target))}"
        )
    return flat.reshape(target)


def _fill(spec: InputSpec, count: int, name: str) -> tuple[int, ...]:
    """The model's shape with its one free dimension sized to hold ``count`` values."""
    fixed = int(np.prod([d for d in spec.shape if d > 0])) if spec.shape else 1
    free = [i for i, d in enumerate(spec.shape) if d < 0]
    if not free:
        return spec.shape
    if count % max(fixed, 1):
        raise ConfigError(
            f"--data input {name!r}: {count} values do not fill whole rows of shape "
            f"{list(spec.shape)}; give 'shape' explicitly"
        )
    dims = [1 if d < 0 else d for d in spec.shape]
    dims[free[0]] = count // max(fixed, 1)
    return tuple(dims)


def read_data_file(path: Path, inputs: list[InputSpec]) -> list[dict[str, np.ndarray]]:
    """The entries of a perf_analyzer input-data file, as arrays for ``inputs``."""
    try:
        document = json.loads(path.read_text("utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read --data {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"--data {path} is not JSON: {exc}") from None
    entries = document.get("data") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            f'--data {path} must be perf_analyzer input data: {{"data": [{{"INPUT": [...]}}]}}'
        )
    specs = {s.name: s for s in inputs}
    out = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise ConfigError(f"--data {path}: each entry of 'data' must map input names to data")
        unknown = sorted(set(entry) - set(specs))
        if unknown:
            raise ConfigError(
                f"--data {path} names inputs the model does not have: {', '.join(unknown)} "
                f"(the model's inputs: {', '.join(specs)})"
            )
        out.append({k: _tensor(k, v, specs[k]) for k, v in entry.items()})
    return out
