"""INT8 quantization with ONNX Runtime's tools, and the comparison the accuracy guard runs.

:func:`quantize` writes a quantized copy of a float ONNX model — static (activation
ranges calibrated on ``calibration``, an ``.npz`` of input arrays) or dynamic
(weights only) — and embeds runtime hints: ``precision: int8``, the float
reference (its file name beside the quantized one: a float model kept elsewhere is
copied there, since a model loads no file outside its folder), the accuracy bound,
and a held-out sample the guard replays (the last rows of the calibration data, which
calibration never sees; or ``sample``), at most :data:`MAX_SAMPLE_ROWS` rows and
:data:`MAX_SAMPLE_ELEMENTS` values.
:func:`compare` runs a sample through a quantized and a float model and returns
top-1 agreement and the largest absolute difference.
"""

from __future__ import annotations

import base64
import binascii
import io
import shutil
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sordino.errors import InvalidRequest
from sordino.models.hints import ModelHints, embed_hints, read_hints

__all__ = [
    "GuardFigures",
    "compare",
    "compare_outputs",
    "decode_sample",
    "encode_sample",
    "output_names",
    "quantize",
    "run_onnx",
]

SAMPLE_ROWS = 64
MAX_SAMPLE_ROWS = 1024
"""The most rows a guard sample may have."""
MAX_SAMPLE_ELEMENTS = 1_000_000
"""The most values in all of a guard sample's arrays together (4 MB of float32)."""


@dataclass(frozen=True, slots=True)
class GuardFigures:
    """How close a quantized model stays to its float reference on one sample."""

    rows: int
    agreement: float
    max_abs_error: float

    def to_json(self) -> dict[str, float]:
        return {
            "rows": self.rows,
            "agreement": round(self.agreement, 4),
            "max_abs_error": round(self.max_abs_error, 6),
        }


def encode_sample(arrays: Mapping[str, np.ndarray]) -> str:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **dict(arrays))  # type: ignore[arg-type]
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_sample(text: str) -> dict[str, np.ndarray]:
    """The arrays of a ``guard_sample`` hint; ValueError saying what is wrong with it.

    Each array's shape is read from its header and checked against the limits
    before any array is built (a small compressed text can hold gigabytes of zeros).
    """
    headers: list[tuple[str, tuple[int, ...], np.dtype[Any]]] = []
    try:
        raw = base64.b64decode(text, validate=True)
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            for member in archive.namelist():
                with archive.open(member) as stream:
                    version = np.lib.format.read_magic(stream)
                    header = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, _, dtype = header(stream)
                headers.append((member.removesuffix(".npy"), tuple(shape), dtype))
    except (binascii.Error, zipfile.BadZipFile, OSError, ValueError, KeyError) as exc:
        raise ValueError(f"not a base64 .npz of input arrays ({exc})") from None
    for name, shape, dtype in headers:
        _check_sample_shape(name, shape, dtype)
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise ValueError(f"not a base64 .npz of input arrays ({exc})") from None
    check_sample(arrays)
    return arrays


def _check_sample_shape(name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
    if dtype.hasobject:
        raise ValueError(f"array {name!r} holds Python objects; give numeric arrays")
    rows = shape[0] if shape else 1
    if rows > MAX_SAMPLE_ROWS:
        raise ValueError(f"array {name!r} has {rows} rows; a sample has at most {MAX_SAMPLE_ROWS}")
    if int(np.prod(shape, dtype=np.float64)) > MAX_SAMPLE_ELEMENTS:
        raise ValueError(
            f"array {name!r} of shape {list(shape)} has more than {MAX_SAMPLE_ELEMENTS} values"
        )


def check_sample(arrays: Mapping[str, np.ndarray]) -> None:
    """Raise ValueError when a guard sample is past :data:`MAX_SAMPLE_ROWS` or
    :data:`MAX_SAMPLE_ELEMENTS` (all arrays together)."""
    for name, array in arrays.items():
        _check_sample_shape(name, array.shape, array.dtype)
    total = sum(array.size for array in arrays.values())
    if total > MAX_SAMPLE_ELEMENTS:
        raise ValueError(f"the sample has {total} values; at most {MAX_SAMPLE_ELEMENTS}")


def _load_npz(path: Path, inputs: list[str]) -> dict[str, np.ndarray]:
    try:
        with np.load(path) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"{path} is not an .npz of input arrays: {exc}") from None
    missing = [name for name in inputs if name not in arrays]
    if missing:
        raise InvalidRequest(
            f"{path} has no array for input(s) {', '.join(missing)} (it has "
            f"{', '.join(arrays) or 'none'}); save one array per model input, rows first"
        )
    return {name: arrays[name] for name in inputs}


def _session(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_onnx(path: Path, sample: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run ``sample`` through the model at ``path`` with ONNX Runtime on the CPU."""
    outputs: list[np.ndarray] = _session(path).run(None, dict(sample))
    return outputs


def output_names(path: Path) -> list[str]:
    """The model's output names, in ONNX Runtime's order (that of :func:`run_onnx`)."""
    return [spec.name for spec in _session(path).get_outputs()]


def compare_outputs(quantized: list[np.ndarray], reference: list[np.ndarray]) -> GuardFigures:
    """Top-1 agreement on the first output, and the largest absolute difference of all."""
    first_q, first_f = quantized[0], reference[0]
    rows = int(first_f.shape[0]) if first_f.ndim else 1
    if first_f.ndim >= 2 and first_f.shape[-1] > 1:
        agreement = float(np.mean(first_q.argmax(axis=-1) == first_f.argmax(axis=-1)))
    else:
        agreement = float(np.mean(np.isclose(first_q, first_f, rtol=0.05, atol=1e-3)))
    error = max(
        float(np.max(np.abs(q.astype(np.float64) - f.astype(np.float64)))) if f.size else 0.0
        for q, f in zip(quantized, reference, strict=True)
    )
    return GuardFigures(rows, agreement, error)


def compare(quantized: Path, reference: Path, sample: Mapping[str, np.ndarray]) -> GuardFigures:
    """Run ``sample`` through both models and compare their outputs."""
    return compare_outputs(run_onnx(quantized, sample), run_onnx(reference, sample))


def quantize(
    source: Path,
    target: Path,
    *,
    calibration: Path | None = None,
    sample: Path | None = None,
    accuracy_bound: float = 0.99,
) -> tuple[ModelHints, GuardFigures]:
    """Write the INT8 model of ``source`` to ``target``; return its hints and guard figures.

    Static quantization with ``calibration``, dynamic without. Existing hints of the
    source (batch size, mode) are kept.
    """
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    session = _session(source)
    inputs = [spec.name for spec in session.get_inputs()]
    held_out: dict[str, np.ndarray] | None = None
    if calibration is not None:
        data = _load_npz(calibration, inputs)
        rows = min(len(array) for array in data.values())
        if rows < 2:
            raise InvalidRequest(f"{calibration} needs at least 2 rows (some are held out)")
        keep = min(SAMPLE_ROWS, rows // 4 or 1)
        held_out = {name: array[rows - keep : rows] for name, array in data.items()}
        batches = [
            {name: array[i : min(i + 16, rows - keep)] for name, array in data.items()}
            for i in range(0, rows - keep, 16)
        ]

        class Reader(CalibrationDataReader):  # type: ignore[misc]
            def __init__(self) -> None:
                self._batches: Iterator[dict[str, np.ndarray]] = iter(batches)

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self._batches, None)

        quantize_static(str(source), str(target), Reader())
    else:
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8)
    if sample is not None:
        held_out = _load_npz(sample, inputs)
    if held_out is None:
        held_out = _random_sample(session)
    try:
        check_sample(held_out)
    except ValueError as exc:
        raise InvalidRequest(f"the guard sample is too large: {exc}; give fewer rows") from None
    previous = read_hints(source)
    kept = previous.model_dump(exclude_none=True) if previous is not None else {}
    hints = ModelHints.model_validate(
        {
            **kept,
            "precision": "int8",
            "float_reference": _reference_beside(source, target),
            "accuracy_bound": accuracy_bound,
            "guard_sample": encode_sample(held_out),
        }
    )
    embed_hints(target, target, hints)
    return hints, compare(target, source, held_out)


def _reference_beside(source: Path, target: Path) -> str:
    """The float model's path relative to ``target``'s folder, copying it there if outside."""
    folder = target.resolve().parent
    original = source.resolve()
    if original.is_relative_to(folder):
        return original.relative_to(folder).as_posix()
    copy = folder / f"{target.stem}.float.onnx"
    shutil.copyfile(original, copy)
    return copy.name


def _random_sample(session: Any) -> dict[str, np.ndarray]:
    """Inputs drawn at random (no data given): a weak sample, said so in the docs."""
    rng = np.random.default_rng(0)
    sample: dict[str, np.ndarray] = {}
    for spec in session.get_inputs():
        shape = [SAMPLE_ROWS if not isinstance(d, int) else d for d in spec.shape]
        if "float" not in spec.type:
            raise InvalidRequest(
                f"input {spec.name} is {spec.type}: give --calibration or --sample data "
                "(random samples are drawn for float inputs only)"
            )
        sample[spec.name] = rng.standard_normal(shape).astype(np.float32)
    return sample
