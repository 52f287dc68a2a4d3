"""INT8 and INT4 quantization with ONNX Runtime's tools, and the comparison the guard runs.

:func:`quantize` writes a quantized copy of a float ONNX model — static (activation
ranges calibrated on ``calibration``, an ``.npz`` of input arrays) or dynamic
(weights only) — and embeds runtime hints: ``precision: int8``, the float
reference (its file name beside the quantized one: a float model kept elsewhere is
copied there, since a model loads no file outside its folder), the accuracy bound,
and a held-out sample the guard replays (the last rows of the calibration data, which
calibration never sees; or ``sample``), at most :data:`MAX_SAMPLE_ROWS` rows and
:data:`MAX_SAMPLE_ELEMENTS` values.
:func:`quantize_int4` writes ONNX Runtime's 4-bit weight-only form (``MatMulNBits``):
every MatMul (and plain Gemm) whose weight is a constant 2-D float matrix gets its
weight packed block-wise, with the same hints (``precision: int4``).
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
    "quantize_int4",
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
    check_target(source, target)
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
    return _embed_guard(source, target, session, held_out, sample, "int8", accuracy_bound)


def _embed_guard(
    source: Path,
    target: Path,
    session: Any,
    held_out: dict[str, np.ndarray] | None,
    sample: Path | None,
    precision: str,
    accuracy_bound: float,
) -> tuple[ModelHints, GuardFigures]:
    """Embed the guard's hints in ``target`` and compare it with ``source`` on the sample."""
    inputs = [spec.name for spec in session.get_inputs()]
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
            "precision": precision,
            "float_reference": _reference_beside(source, target),
            "accuracy_bound": accuracy_bound,
            "guard_sample": encode_sample(held_out),
        }
    )
    embed_hints(target, target, hints)
    return hints, compare(target, source, held_out)


INT4_BLOCK_SIZES = (16, 32, 64, 128, 256)
"""The block sizes ``MatMulNBits`` takes (a power of two, at least 16)."""


def quantize_int4(
    source: Path,
    target: Path,
    *,
    block_size: int = 32,
    sample: Path | None = None,
    accuracy_bound: float = 0.99,
) -> tuple[ModelHints, int, GuardFigures]:
    """Write the 4-bit weight-only model of ``source`` to ``target``.

    Returns its hints, how many weights were quantized, and the guard figures. Weights
    are quantized block-wise along K (asymmetric, one scale and zero point per block of
    ``block_size`` rows) by ONNX Runtime's own packing routine, the one its
    ``MatMulNBitsQuantizer`` calls; a Gemm with ``alpha == 1`` and ``transA == 0``
    becomes ``MatMulNBits`` followed by an ``Add`` of its bias. InvalidRequest when no
    weight qualifies. A weight whose K is no multiple of ``block_size`` is zero-padded
    to whole blocks, as ONNX Runtime does.
    """
    check_target(source, target)
    import onnx
    from onnx import helper, numpy_helper

    if block_size not in INT4_BLOCK_SIZES:
        raise InvalidRequest(
            f"block size {block_size} is not one MatMulNBits takes; use one of "
            f"{', '.join(map(str, INT4_BLOCK_SIZES))}"
        )
    session = _session(source)
    model = onnx.load(str(source))
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    consumers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    nodes: list[Any] = []
    replaced = 0
    for node in graph.node:
        weight = _int4_weight(node, initializers, consumers)
        if weight is None:
            nodes.append(node)
            continue
        replaced += 1
        prefix = f"{node.name or node.output[0]}_int4"
        rows, cols = weight.shape
        packed, scales, zero_points = _pack_int4(weight, block_size)
        graph.initializer.extend(
            [
                numpy_helper.from_array(packed, f"{prefix}_B"),
                numpy_helper.from_array(scales, f"{prefix}_scales"),
                numpy_helper.from_array(zero_points, f"{prefix}_zero_points"),
            ]
        )
        bias = _gemm_bias(node, initializers)
        output = f"{prefix}_out" if bias is not None else node.output[0]
        nodes.append(
            helper.make_node(
                "MatMulNBits",
                [node.input[0], f"{prefix}_B", f"{prefix}_scales", f"{prefix}_zero_points"],
                [output],
                name=prefix,
                domain="com.microsoft",
                K=rows,
                N=cols,
                bits=4,
                block_size=block_size,
            )
        )
        if bias is not None:
            graph.initializer.append(numpy_helper.from_array(bias, f"{prefix}_bias"))
            nodes.append(helper.make_node("Add", [output, f"{prefix}_bias"], [node.output[0]]))
    if not replaced:
        raise InvalidRequest(
            f"{source} has no MatMul weight this INT4 mode can quantize (it needs a MatMul "
            "or Gemm whose weight is a constant 2-D float matrix); use --int8 instead"
        )
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in graph.node for name in node.input}
    kept_tensors = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept_tensors)
    if not any(entry.domain == "com.microsoft" for entry in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(target))
    hints, figures = _embed_guard(source, target, session, None, sample, "int4", accuracy_bound)
    return hints, replaced, figures


def _int4_weight(node: Any, initializers: Mapping[str, Any], consumers: Mapping[str, int]) -> Any:
    """The [K, N] float32 weight of a MatMul or plain Gemm ``node``, or None when it has none
    this mode can quantize (not constant, not 2-D, shared with another node, a Gemm that
    scales or transposes its input)."""
    from onnx import helper, numpy_helper

    if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
        return None
    tensor = initializers.get(node.input[1])
    if tensor is None or consumers.get(node.input[1], 0) != 1:
        return None
    weight = numpy_helper.to_array(tensor)
    if weight.ndim != 2 or weight.dtype != np.float32:
        return None
    if node.op_type == "Gemm":
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attributes.get("transA", 0) or attributes.get("alpha", 1.0) != 1.0:
            return None
        if attributes.get("transB", 0):
            weight = weight.T
    return np.ascontiguousarray(weight)


def _gemm_bias(node: Any, initializers: Mapping[str, Any]) -> np.ndarray | None:
    """A Gemm's ``beta * C`` as a constant (None for a MatMul or a Gemm without C)."""
    from onnx import helper, numpy_helper

    if node.op_type != "Gemm" or len(node.input) < 3 or not node.input[2]:
        return None
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    tensor = initializers.get(node.input[2])
    if tensor is None:
        raise InvalidRequest(
            f"Gemm {node.name or node.output[0]} has a bias that is no constant; INT4 "
            "quantizes Gemms with constant weights and bias only"
        )
    bias: np.ndarray = numpy_helper.to_array(tensor).astype(np.float32)
    return bias * np.float32(attributes.get("beta", 1.0))


def _pack_int4(weight: np.ndarray, block_size: int) -> tuple[np.ndarray, ...]:
    """ONNX Runtime's block-wise 4-bit packing of a [K, N] weight (asymmetric)."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits

    rows, cols = weight.shape
    blocks = (rows + block_size - 1) // block_size
    if blocks * block_size != rows:
        weight = np.pad(weight, ((0, blocks * block_size - rows), (0, 0)))
    packed = np.zeros((cols, blocks, block_size // 2), dtype=np.uint8)
    scales = np.zeros((cols, blocks), dtype=np.float32)
    zero_points = np.zeros((cols, (blocks + 1) // 2), dtype=np.uint8)
    quantize_matmul_4bits(packed, weight, scales, zero_points, block_size, cols, rows, False)
    return packed, scales, zero_points


def check_target(source: Path, target: Path) -> None:
    """Refuse a ``target`` that would replace ``source`` (the float model is the guard's
    reference: the copy would be compared with itself) or lies in no folder."""
    if target.resolve() == source.resolve():
        raise InvalidRequest(
            f"the output {target} is the model itself: the float model stays as the "
            "accuracy guard's reference (replaced, the quantized copy would be compared "
            f"with itself); write the copy elsewhere, e.g. {source.stem}.int8.onnx"
        )
    if not target.resolve().parent.is_dir():
        raise InvalidRequest(f"the output's folder {target.parent} does not exist: create it")


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
