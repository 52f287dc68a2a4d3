"""Check a request against the model it is for, before it is queued.

Two steps. While decoding, before any tensor is built, :func:`check_declared_shape`
refuses a declared shape that cannot be right, cheaply: an input the model does not
have, more dimensions than the model's rank, a dimension or an element count larger
than the request's bytes could hold, a batch larger than the model takes. So a small
request declaring a huge tensor costs the server nothing. After decoding,
:func:`validate_request` checks that the tensors are the ones the model takes: names,
datatypes, ranks, fixed dimensions and batch sizes. Nothing is cast or reshaped to
make a request fit: a mismatch is the client's to fix, and the message says what the
model expects. An input the model declines by name (``ModelMetadata.refused``) is
answered :class:`~sordino.errors.Unsupported`, saying why (:func:`refuse_declined`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sordino.datatypes import MAX_RANK, element_count, format_shape, from_numpy_dtype
from sordino.errors import MalformedBody, TensorError, Unsupported
from sordino.inference import InferRequest, ModelMetadata, Tensor, TensorSpec

__all__ = [
    "JSON_BYTES_PER_VALUE",
    "JSON_ROOM",
    "check_declared_shape",
    "check_json_size",
    "check_text_inputs",
    "json_values",
    "refuse_declined",
    "refuse_json_over",
    "validate_request",
]

JSON_BYTES_PER_VALUE = 64
"""What one value of a tensor may take in a request's JSON, with its separator and any
indentation (``1.2345678901234567e-308,`` is 24)."""

JSON_ROOM = 256 * 1024
"""JSON every request may have besides its values (names, shapes, parameters, the id);
a JSON part no larger is never checked by :func:`check_json_size`."""


def json_values(metadata: ModelMetadata, max_batch_size: int) -> int | None:
    """The most values any request to the model holds, or None for no bound: when each
    input has a fixed shape (but for the batch dimension) and numbers."""
    rows = max_batch_size if metadata.batched else 1
    values = 0
    for spec in metadata.inputs:
        dims = spec.shape[1:] if metadata.batched else spec.shape
        if spec.datatype == "BYTES" or rows <= 0 or any(d < 0 for d in dims):
            return None  # strings, or a dimension of any size: no bound but the body's
        values += rows * element_count(dims)
    return values


def check_json_size(metadata: ModelMetadata, max_batch_size: int, size: int) -> None:
    """Refuse (413) a request whose JSON part of ``size`` bytes is larger than any request
    to the model needs (its :func:`json_values`), before it is parsed. A 30 MB JSON body
    sent to the digits classifier (64 values a row) took the serving loop 1.9 s and 450
    MB to parse before its element count was refused."""
    if size > JSON_ROOM:
        refuse_json_over(size, metadata.name, json_values(metadata, max_batch_size))


def refuse_json_over(size: int, model: str, values: int | None) -> None:
    """Raise :class:`MalformedBody` (413) if ``size`` bytes of JSON are more than a
    request of ``values`` values needs (None: no bound): at most
    :data:`JSON_BYTES_PER_VALUE` a value and :data:`JSON_ROOM` besides. The words of
    :func:`check_json_size`, also said by a front-end process, which reads ``values``
    from the engine's load board."""
    if values is None:
        return
    bound = values * JSON_BYTES_PER_VALUE + JSON_ROOM
    if size > bound:
        raise MalformedBody(
            f"the request's JSON is {size} bytes, more than any request to model "
            f"{model!r} needs: it takes at most {values} values (at most {bound} "
            "bytes as JSON); send fewer values, or the tensors as binary data "
            "(Inference-Header-Content-Length)",
            too_large=True,
        )


def refuse_declined(metadata: ModelMetadata, name: str) -> None:
    """Raise Unsupported if the model declines input ``name`` by name, saying why."""
    why = metadata.refused.get(name)
    if why is not None:
        raise Unsupported(f"model {metadata.name!r} has no input {name!r}: not supported: {why}")


def check_declared_shape(
    name: str,
    shape: Sequence[int],
    *,
    room: int,
    metadata: ModelMetadata | None = None,
    max_batch_size: int = 0,
) -> None:
    """Raise TensorError if input ``name`` cannot have ``shape``; allocate and multiply nothing big.

    ``shape`` holds non-negative integers; ``room`` is the size in bytes of the request
    that declares it, an upper bound on its element count (every element takes at
    least a byte). In this order: with the model's ``metadata``, the input must be
    one of the model's and have at most the model's rank for it (without, at most
    :data:`~sordino.datatypes.MAX_RANK` dimensions); a batched model's leading
    dimension must be at most ``max_batch_size`` (when positive); every dimension and
    the element count must be at most ``room``.
    """
    declared: tuple[int, ...] | None = None
    if metadata is None:
        rank = MAX_RANK
    else:
        spec = metadata.input(name)
        if spec is None:
            refuse_declined(metadata, name)
            expected = [s.name for s in metadata.inputs]
            raise TensorError(
                f"unexpected inference input '{name}' for model '{metadata.name}' (sordino: "
                f"model {metadata.name!r} has no input {name!r}; its inputs are "
                f"{_names(expected)})"
            )
        declared = spec.shape
        rank = len(spec.shape)
    if len(shape) > rank:
        if metadata is None or declared is None:
            limit = f"a tensor has at most {MAX_RANK}"
        else:
            limit = f"model {metadata.name!r} expects rank {rank}: {_shape(declared)}"
        tail = f"input {name!r} has {len(shape)} dimensions but {limit}"
        if metadata is None or declared is None:
            raise TensorError(tail)
        raise TensorError(
            f"{_unexpected_shape(name, metadata.name, declared, shape)} (sordino: {tail})"
        )
    if metadata is not None and metadata.batched and shape and 0 < max_batch_size < shape[0]:
        raise _batch_too_large(name, shape[0], metadata.name, max_batch_size)
    for axis, dim in enumerate(shape):
        if dim > room:
            raise TensorError(
                f"input {name!r} has shape {format_shape(shape)}: dimension {axis} is {dim}, "
                f"more than a {room}-byte request can fill; send the tensor's real shape"
            )
    if element_count(shape, room) > room:
        raise TensorError(
            f"input {name!r} has shape {format_shape(shape)}, which holds more elements than "
            f"a {room}-byte request can carry; send the tensor's real shape"
        )


def validate_request(
    request: InferRequest, metadata: ModelMetadata, *, max_batch_size: int
) -> None:
    """Raise TensorError unless ``request`` fits the model ``metadata`` describes.

    Every model input must be present (but an optional one) and no other; each
    input's datatype and rank
    must equal the spec's and every fixed dimension (``>= 0`` in the spec) must
    match. When the model is batched, the leading dimension is the batch size: it
    must be at least 1, at most ``max_batch_size`` when that is positive, and the
    same for every input. Requested outputs must be outputs of the model.
    """
    model = metadata.name
    expected = [spec.name for spec in metadata.inputs]
    for name in request.inputs:
        if metadata.input(name) is None:
            refuse_declined(metadata, name)
            raise TensorError(
                f"unexpected inference input '{name}' for model '{model}' (sordino: "
                f"model {model!r} has no input {name!r}; its inputs are {_names(expected)})"
            )
    for spec in metadata.inputs:
        array = request.inputs.get(spec.name)
        if array is None:
            if spec.optional:
                continue
            raise TensorError(
                f"expected {len(expected)} inputs but got {len(request.inputs)} inputs for "
                f"model '{model}' (sordino: model {model!r} expects input {spec.name!r} "
                f"({spec.datatype}, shape {_shape(spec.shape)}) but the request does not have it)"
            )
        _check_input(request, model, spec, array, batched=metadata.batched)
    if metadata.batched:
        _check_batch(request, metadata, max_batch_size)
    if request.outputs is not None:
        outputs = [spec.name for spec in metadata.outputs]
        for requested in request.outputs:
            if metadata.output(requested.name) is None:
                raise TensorError(
                    f"unexpected inference output '{requested.name}' for model '{model}' "
                    f"(sordino: model {model!r} has no output {requested.name!r}; "
                    f"its outputs are {_names(outputs)})"
                )


def _check_input(
    request: InferRequest, model: str, spec: TensorSpec, array: Tensor, *, batched: bool
) -> None:
    datatype = request.input_datatypes.get(spec.name) or from_numpy_dtype(array.dtype)
    if datatype != spec.datatype:
        raise TensorError(
            f"inference input '{spec.name}' data-type is '{datatype}', but model '{model}' "
            f"expects '{spec.datatype}' (sordino: input {spec.name!r} has datatype {datatype} "
            f"but model {model!r} expects {spec.datatype})"
        )
    if array.ndim != len(spec.shape):
        raise TensorError(
            f"{_unexpected_shape(spec.name, model, spec.shape, array.shape)} (sordino: "
            f"input {spec.name!r} has shape {_shape(array.shape)} (rank {array.ndim}) but "
            f"model {model!r} expects rank {len(spec.shape)}: {_shape(spec.shape)})"
        )
    # The batch dimension of a batched model is variable whatever the spec says.
    first = 1 if batched else 0
    for axis in range(first, array.ndim):
        want = spec.shape[axis]
        if want >= 0 and array.shape[axis] != want:
            raise TensorError(
                f"{_unexpected_shape(spec.name, model, spec.shape, array.shape)} (sordino: "
                f"input {spec.name!r} has shape {_shape(array.shape)} but model {model!r} "
                f"expects {_shape(spec.shape)}: dimension {axis} must be {want})"
            )


def _check_batch(request: InferRequest, metadata: ModelMetadata, max_batch_size: int) -> None:
    sizes = {name: int(array.shape[0]) for name, array in request.inputs.items()}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{name!r}: {size}" for name, size in sizes.items())
        raise TensorError(
            f"inputs have different batch sizes ({listed}); every input of model "
            f"{metadata.name!r} must have the same leading dimension"
        )
    for name, size in sizes.items():
        if size < 1:
            raise TensorError(
                f"input {name!r} has batch size 0; send at least one item along dimension 0"
            )
        if 0 < max_batch_size < size:
            raise _batch_too_large(name, size, metadata.name, max_batch_size)


def _batch_too_large(name: str, size: int, model: str, max_batch_size: int) -> TensorError:
    return TensorError(
        f"inference request batch-size must be <= {max_batch_size} for '{model}' (sordino: "
        f"input {name!r} has batch size {size} but model {model!r} takes at most "
        f"{max_batch_size} items per request; split the request)"
    )


def _unexpected_shape(name: str, model: str, expected: Iterable[int], got: Iterable[int]) -> str:
    """Triton's phrase for a shape mismatch (its shapes are written without spaces)."""
    want = "[" + ",".join(str(d) for d in expected) + "]"
    have = "[" + ",".join(str(d) for d in got) + "]"
    return f"unexpected shape for input '{name}' for model '{model}'. Expected {want}, got {have}"


def _names(names: Iterable[str]) -> str:
    listed = ", ".join(repr(name) for name in names)
    return listed or "none"


def _shape(shape: Iterable[int]) -> str:
    return "[" + ", ".join(str(dim) for dim in shape) + "]"


def check_text_inputs(request: InferRequest, metadata: ModelMetadata) -> None:
    """Raise TensorError if a ``BYTES`` input of a model that reads text is not UTF-8.

    ONNX models take ``BYTES`` tensors as strings, and one element that is not UTF-8
    makes the model fail for the whole batch it is in; it is refused here, per
    request, with the element named, before it can share a batch with others.
    """
    if not metadata.platform.startswith("onnxruntime"):
        return
    for spec in metadata.inputs:
        if spec.datatype != "BYTES":
            continue
        array = request.inputs.get(spec.name)
        if array is None:
            continue
        for index, element in enumerate(array.reshape(-1)):
            if isinstance(element, bytes):
                try:
                    element.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise TensorError(
                        f"input {spec.name!r} element {index} is not valid UTF-8 (byte "
                        f"{exc.start}: {element[exc.start : exc.start + 1]!r}); model "
                        f"{metadata.name!r} reads BYTES inputs as UTF-8 text"
                    ) from None
