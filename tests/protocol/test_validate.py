"""Checking a decoded request against the model's metadata."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sordino.datatypes import from_numpy_dtype
from sordino.errors import TensorError
from sordino.inference import InferRequest, ModelMetadata, RequestedOutput, TensorSpec
from sordino.protocol.validate import check_declared_shape, validate_request

DIGITS = ModelMetadata(
    name="digits-classifier",
    version="1",
    platform="onnxruntime_onnx",
    inputs=(TensorSpec("pixels", "FP32", (-1, 64)),),
    outputs=(TensorSpec("probabilities", "FP32", (-1, 10)),),
    batched=True,
)
SIMPLE = ModelMetadata(
    name="simple",
    version="1",
    platform="onnxruntime_onnx",
    inputs=(TensorSpec("INPUT0", "INT32", (-1, 16)), TensorSpec("INPUT1", "INT32", (-1, 16))),
    outputs=(TensorSpec("OUTPUT0", "INT32", (-1, 16)), TensorSpec("OUTPUT1", "INT32", (-1, 16))),
    batched=True,
)
UNBATCHED = ModelMetadata(
    name="fixed",
    version="1",
    platform="onnxruntime_onnx",
    inputs=(TensorSpec("x", "FP32", (3, -1)),),
    outputs=(TensorSpec("y", "FP32", (3,)),),
    batched=False,
)


def request(**inputs: np.ndarray[Any, Any]) -> InferRequest:
    return InferRequest(
        model="m",
        inputs=dict(inputs),
        input_datatypes={name: from_numpy_dtype(arr.dtype) for name, arr in inputs.items()},
    )


def pixels(batch: int = 2) -> np.ndarray[Any, Any]:
    return np.zeros((batch, 64), np.float32)


def pair(a: int, b: int, outputs: list[str] | None = None) -> InferRequest:
    """A request for SIMPLE with batch sizes ``a`` and ``b``."""
    req = request(INPUT0=np.zeros((a, 16), np.int32), INPUT1=np.zeros((b, 16), np.int32))
    req.outputs = None if outputs is None else [RequestedOutput(name) for name in outputs]
    return req


def test_matching_request_passes() -> None:
    """A request with the right inputs, datatypes and shapes passes."""
    validate_request(request(pixels=pixels()), DIGITS, max_batch_size=8)


def test_unknown_input_lists_the_model_inputs() -> None:
    """An input the model does not have is named, with the valid names."""
    with pytest.raises(TensorError, match="has no input 'image'; its inputs are 'pixels'"):
        validate_request(request(pixels=pixels(), image=pixels()), DIGITS, max_batch_size=8)


def test_missing_input_is_named_with_its_spec() -> None:
    """A model input the request lacks is named with its datatype and shape."""
    with pytest.raises(TensorError, match=r"expects input 'INPUT1' \(INT32, shape \[-1, 16\]\)"):
        validate_request(request(INPUT0=np.zeros((1, 16), np.int32)), SIMPLE, max_batch_size=8)


def test_datatype_mismatch_names_both_datatypes() -> None:
    """A wrong datatype is refused with the declared and the expected datatype."""
    with pytest.raises(TensorError) as info:
        validate_request(request(pixels=pixels().astype(np.int32)), DIGITS, max_batch_size=8)
    assert str(info.value) == (
        "inference input 'pixels' data-type is 'INT32', but model 'digits-classifier' "
        "expects 'FP32' (sordino: input 'pixels' has datatype INT32 but model "
        "'digits-classifier' expects FP32)"
    )


def test_datatype_is_taken_from_the_array_when_not_declared() -> None:
    """Without input_datatypes the array's dtype decides, and FP64 is not cast to FP32."""
    req = InferRequest(model="m", inputs={"pixels": np.zeros((1, 64))})
    with pytest.raises(TensorError, match=r"has datatype FP64 but .* expects FP32"):
        validate_request(req, DIGITS, max_batch_size=8)


def test_rank_mismatch_is_refused() -> None:
    """An input of the wrong rank is refused with both ranks."""
    with pytest.raises(TensorError, match=r"'pixels' has shape \[64\] \(rank 1\) .* rank 2"):
        validate_request(request(pixels=np.zeros(64, np.float32)), DIGITS, max_batch_size=8)


def test_fixed_dimension_mismatch_is_refused() -> None:
    """A fixed dimension of the wrong size is named."""
    with pytest.raises(TensorError, match=r"\[2, 63\] .* expects \[-1, 64\]: dimension 1 must"):
        validate_request(request(pixels=np.zeros((2, 63), np.float32)), DIGITS, max_batch_size=8)


def test_unbatched_model_checks_its_first_dimension() -> None:
    """Without batching, dimension 0 is an ordinary fixed dimension."""
    with pytest.raises(TensorError, match="dimension 0 must be 3"):
        validate_request(request(x=np.zeros((2, 5), np.float32)), UNBATCHED, max_batch_size=8)


def test_unbatched_model_accepts_any_size_for_variable_dimensions() -> None:
    """A -1 dimension takes any size, and max_batch_size does not apply."""
    validate_request(request(x=np.zeros((3, 50), np.float32)), UNBATCHED, max_batch_size=8)


def test_empty_batch_is_refused() -> None:
    """A batched input needs at least one item."""
    with pytest.raises(TensorError, match="'pixels' has batch size 0"):
        validate_request(request(pixels=pixels(0)), DIGITS, max_batch_size=8)


def test_batch_above_max_batch_size_is_refused() -> None:
    """A batch larger than max_batch_size is refused with the limit."""
    with pytest.raises(TensorError, match=r"batch size 9 .* at most 8 items per request"):
        validate_request(request(pixels=pixels(9)), DIGITS, max_batch_size=8)


def test_batch_equal_to_max_batch_size_passes() -> None:
    """max_batch_size itself is allowed."""
    validate_request(request(pixels=pixels(8)), DIGITS, max_batch_size=8)


def test_zero_max_batch_size_means_no_limit() -> None:
    """max_batch_size 0 puts no limit on the batch size."""
    validate_request(request(pixels=pixels(1000)), DIGITS, max_batch_size=0)


def test_inputs_must_share_the_batch_size() -> None:
    """Inputs with different leading dimensions are refused, listing each size."""
    with pytest.raises(TensorError, match=r"different batch sizes \('INPUT0': 2, 'INPUT1': 3\)"):
        validate_request(pair(2, 3), SIMPLE, max_batch_size=8)


def test_unknown_output_lists_the_model_outputs() -> None:
    """A requested output the model does not have is named, with the valid names."""
    with pytest.raises(TensorError, match="no output 'OUTPUT2'; its outputs are 'OUTPUT0', 'OUTP"):
        validate_request(pair(1, 1, ["OUTPUT2"]), SIMPLE, max_batch_size=8)


def test_known_outputs_pass() -> None:
    """Requesting outputs the model has passes."""
    validate_request(pair(1, 1, ["OUTPUT1", "OUTPUT0"]), SIMPLE, max_batch_size=8)


def test_declared_shape_that_fits_passes() -> None:
    check_declared_shape("pixels", [2, 64], room=1000, metadata=DIGITS, max_batch_size=64)
    check_declared_shape("x", [0, 5], room=10)  # an empty tensor, no model at hand


def test_declared_shape_of_an_unknown_input_is_refused_first() -> None:
    with pytest.raises(TensorError, match="has no input 'pixelz'; its inputs are 'pixels'"):
        check_declared_shape("pixelz", [2**62] * 40_000, room=10, metadata=DIGITS)


def test_declared_rank_above_the_model_rank_is_refused() -> None:
    """The 40,000-dimension shape is refused by counting dimensions, nothing more."""
    with pytest.raises(TensorError, match="40000 dimensions but model 'digits-classifier' "):
        check_declared_shape("pixels", [2**62] * 40_000, room=840_000, metadata=DIGITS)


def test_declared_rank_without_a_model_is_capped() -> None:
    with pytest.raises(TensorError, match="at most 32"):
        check_declared_shape("x", [1] * 33, room=100)


def test_declared_batch_above_max_batch_size_is_refused() -> None:
    with pytest.raises(TensorError, match=r"batch size 268435456 .* at most 64 items"):
        check_declared_shape("pixels", [2**28, 64], room=112, metadata=DIGITS, max_batch_size=64)


def test_declared_dimension_larger_than_the_request_is_refused() -> None:
    with pytest.raises(TensorError, match="dimension 1 is 268435456, more than a 112-byte"):
        check_declared_shape("x", [1, 2**28], room=112, metadata=UNBATCHED)
    # Even with a zero dimension elsewhere: an empty tensor's dimensions stay plausible.
    with pytest.raises(TensorError, match="dimension 1 is"):
        check_declared_shape("x", [0, 2**62], room=112)


def test_declared_element_count_larger_than_the_request_is_refused() -> None:
    with pytest.raises(TensorError, match="holds more elements than a 100-byte request"):
        check_declared_shape("x", [3, 50], room=100, metadata=UNBATCHED)
