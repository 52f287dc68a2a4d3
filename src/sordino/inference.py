"""The records that travel past the protocol layer, and what describes a model.

The protocol layer decodes HTTP and gRPC bodies into :class:`InferRequest` and encodes
:class:`InferResponse` back; nothing below it sees wire formats. A request's
``inputs`` and a response's ``outputs`` are mappings of names to numpy arrays
(numeric datatypes in their numpy dtype, ``BYTES`` as ``object`` arrays of
``bytes``). Past admission they are :class:`sordino.memory.refs.Tensors`, owned
references into the shared-memory arena: whoever holds a request or a response
calls ``release()`` when done with it (see docs/architecture.md, "Who owns a
tensor"). :class:`ModelMetadata` says what a loaded model takes and gives; the
protocol, scheduling and execution layers all read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from sordino.datatypes import deserialize_bytes_tensor, serialize_bytes_tensor
from sordino.errors import ModelResponseError, model_response_error

__all__ = [
    "REQUEST_ABSENT",
    "REQUEST_APART",
    "REQUEST_ERRORS",
    "REQUEST_PARAMETERS",
    "REQUEST_RESCHEDULED",
    "InferRequest",
    "InferResponse",
    "ModelKey",
    "ModelMetadata",
    "RequestFacts",
    "RequestedOutput",
    "SharedInput",
    "StreamSpec",
    "Tensor",
    "TensorSpec",
    "decode_request_absent",
    "decode_request_apart",
    "decode_request_errors",
    "encode_request_absent",
    "encode_request_apart",
    "encode_request_errors",
    "encode_request_rescheduled",
    "release_owned",
]

Tensor = npt.NDArray[Any]


@dataclass(slots=True)
class RequestedOutput:
    """One output the client asked for, and how it wants it encoded.

    ``binary`` is ``None`` when the client did not say; the encoder then applies the
    request-wide ``binary_data_output`` parameter.
    """

    name: str
    binary: bool | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SharedInput:
    """An input whose bytes lie in a client's registered system shared-memory region.

    The codec records it; the transport reads it from the region
    (``server/shm.py``) into ``InferRequest.inputs`` before the request is served.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    region: str
    byte_size: int
    offset: int = 0


@dataclass(slots=True)
class InferRequest:
    """One decoded inference request.

    ``inputs`` maps input names to arrays whose shape includes the batch dimension
    when the model batches. ``outputs`` is ``None`` when the client asked for every
    output. ``parameters`` holds the request-level parameters as sent (priority,
    timeout, tag, binary_data_output, ...); admission reads them.
    """

    model: str
    inputs: Mapping[str, Tensor]
    version: str | None = None
    id: str | None = None
    outputs: list[RequestedOutput] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    input_datatypes: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    shared_inputs: list[SharedInput] = field(default_factory=list)
    """Inputs still to be read from shared-memory regions (Triton's extension)."""
    correlation_id: int | str = 0
    """The sequence's correlation ID (``parameters.sequence_id``, which sequence
    batching consumes) once its sequence took the request; 0 for none (Triton's)."""
    flags: int = 0
    """Triton's request flags, set with the correlation ID: sequence start (1), end (2)."""
    again: dict[str, Tensor] | None = None
    """Set (by its sequence batcher) for a request its model may run again in a later
    batch (Triton's iterative sequences): the inputs that then differ — its START and
    END controls, false; None for a request run once."""
    tenant: str | None = None
    """The tenant the server authenticated the request as, once it has (its key is
    hashed once a request); None until then, and on a server without tenants."""
    received_at: float | None = None
    """``time.monotonic()`` when the transport had the request's headers; its deadline
    counts from then (the wait to be read and decoded is part of it)."""
    client: str | None = None
    """The caller's network address (host, no port), as the transport saw it; None when
    unknown. Bounds what one caller may hold (a model's sequence slots)."""
    internal_tenant: str | None = None
    """Set only by the server itself, for a request a model makes to another model (BLS):
    the tenant it is served for, taken from the request the calling model was executing
    (already authenticated). Transports never set it."""
    trace: object = None
    """``"HTTP"`` or ``"GRPC"`` when a transport will encode the answer itself; the
    request's trace once the server samples it (``server/tracing.py``)."""

    def release(self) -> None:
        """Give back the arena blocks under ``inputs``, if they are owned tensors."""
        release_owned(self.inputs)


@dataclass(slots=True)
class InferResponse:
    """The result of one request: its outputs, in the order the model declares them."""

    model: str
    version: str
    outputs: Mapping[str, Tensor]
    output_datatypes: dict[str, str]
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)

    def release(self) -> None:
        """Give back the arena blocks under ``outputs`` once they are encoded."""
        release_owned(self.outputs)


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What a backend may know of one request of a batch, besides its tensors.

    Triton's per-request fields, as its Python backend hands them to ``execute``:
    ``id`` (the request's ``id``, "" for none), ``correlation_id`` (the sequence's, 0
    for none), ``parameters`` (the request's parameters that the server did not
    consume, as one compact JSON object), ``flags`` (sequence start 1, end 2),
    ``timeout_us`` (the ``timeout`` parameter, microseconds; 0 for none) and
    ``outputs`` (the outputs the client asked for; empty: every output). And sordino's
    own: ``priority`` (the level the request is queued at), ``deadline`` (when it must
    be answered, a ``time.time()`` value; None: no deadline) and ``tenant`` (None
    without tenants). Built once when the
    request is accepted, for a model whose backend reads them
    (``BackendKind.request_facts``); it crosses to worker processes with the batch.
    """

    id: str = ""
    correlation_id: int | str = 0
    parameters: str = "{}"
    outputs: tuple[str, ...] = ()
    flags: int = 0
    timeout_us: int = 0
    priority: int | None = None
    deadline: float | None = None
    tenant: str | None = None


def release_owned(tensors: Mapping[str, Tensor]) -> None:
    """Release ``tensors`` if they are owned references (``memory.refs.Tensors``).

    Plain dicts of arrays own nothing. (Duck-typed: ``memory`` sits above this module.)
    """
    release = getattr(tensors, "release", None)
    if release is not None:
        release()


@dataclass(frozen=True, slots=True)
class ModelKey:
    """A loaded model version: what the executor and the statistics are keyed by.

    ``generation`` tells apart two loads of one version that are up at once: while a
    version is reloaded, the new load warms up beside the one serving, which drains
    once the new one serves. It is left out of equality and hashing, so statistics,
    telemetry and caches keyed by a version see one model throughout a reload; only
    what holds the instances (the executor's pool) keys by :attr:`slot`.
    """

    name: str
    version: str
    generation: int = field(default=0, compare=False)

    def __str__(self) -> str:
        return f"{self.name}/{self.version}"

    @property
    def slot(self) -> tuple[ModelKey, int]:
        """This load of the version (the key and its generation), as the pool keys it."""
        return (self, self.generation)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output of a model.

    ``shape`` is the full shape as the model declares it, batch dimension included
    when ``batched`` is true; ``-1`` marks a dimension of any size. ``datatype`` is
    the KServe v2 name (``FP32``, ``INT64``, ``BYTES``, ...). An ``optional`` input
    may be left out of a request (Triton's ``optional: true``; a Python model then
    finds no such tensor).
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False
    reshape: tuple[int, ...] | None = None
    """The shape the model itself takes or gives, after the batch dimension when it
    batches, where its configuration gives one other than ``shape`` (Triton's
    ``reshape``: ``backends/reshape.py``); None: ``shape``."""

    @property
    def item_shape(self) -> tuple[int, ...]:
        """The shape of one batch item (``shape`` without the leading batch dimension)."""
        return self.shape[1:]


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """How a step model streams: what feeds the next step, and when the stream ends.

    ``carry`` maps an output name to the input it becomes on the next step (same
    datatype and shape); inputs not carried keep the request's values. ``done`` names
    a BOOL output: the stream of a request ends after the step where it is true for
    every row. A request still not done after ``max_steps`` steps fails.
    """

    carry: tuple[tuple[str, str], ...]
    done: str
    max_steps: int = 1000
    emit: str | None = None
    """A BOOL output; a step where it is false for every row sends no response."""
    state: tuple[str, ...] = ()
    """Inputs only the carry feeds; the first step gets zeros (the client sends none)."""


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """What a loaded model takes and gives.

    ``batched`` is true when every input and output has a leading batch dimension
    of variable size, so requests can be stacked along it. ``stream`` is set for a
    step model that streams a response per step (see ``backends/base.py``).
    ``extra`` holds what a backend declares beyond that; ``max_batch_size`` there bounds
    the scheduler's batches when the model's configuration does not.
    """

    name: str
    version: str
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batched: bool
    extra: dict[str, str] = field(default_factory=dict)
    stream: StreamSpec | None = None
    decoupled: bool = False
    """The model sends its own responses, zero or more per request, as it likes (Triton's
    decoupled transaction policy; see ``backends/decoupled.py``): served as a stream."""
    refused: dict[str, str] = field(default_factory=dict)
    """Inputs the model declines by name, each with why it is not supported (a served
    export's diffusers arguments sordino does not implement): a request with one is
    answered :class:`~sordino.errors.Unsupported` saying so, not "no such input"."""
    filled: frozenset[str] = frozenset()
    """Inputs the server fills in that the model's configuration does not declare (a
    Python model's sequence control inputs, as Triton hands them): in ``inputs`` for
    the runtime, never sent by clients, not shown in its metadata or configuration."""

    def input(self, name: str) -> TensorSpec | None:
        """Return the input called ``name``, or None."""
        for spec in self.inputs:
            if spec.name == name:
                return spec
        return None

    def output(self, name: str) -> TensorSpec | None:
        """Return the output called ``name``, or None."""
        for spec in self.outputs:
            if spec.name == name:
                return spec
        return None


REQUEST_ERRORS = "sordino.request_errors"
"""The output in which a backend that runs a batch as its requests (Triton's
``execute``) says which requests it answered with an error: a ``BYTES`` tensor with an
element per request, empty for one answered, else ``{"code": …, "message": …}``
(Triton's error code). The other outputs then hold the rows of the answered requests
only, in order. The scheduler takes it out before anything else sees the outputs
(``scheduling/batches.py``)."""


def encode_request_errors(count: int, errors: Mapping[int, tuple[int, str]]) -> Tensor:
    """The :data:`REQUEST_ERRORS` tensor of a batch of ``count`` requests: ``errors``
    maps a request's index to its error's (code, message)."""
    column = np.empty(count, dtype=object)
    for index in range(count):
        error = errors.get(index)
        column[index] = (
            b"" if error is None else orjson.dumps({"code": error[0], "message": error[1]})
        )
    return column


def decode_request_errors(column: Tensor, count: int) -> list[ModelResponseError | None]:
    """Each request's error from a :data:`REQUEST_ERRORS` tensor (None: answered)."""
    found: list[ModelResponseError | None] = [None] * count
    for index, entry in enumerate(column.reshape(-1)[:count]):
        if entry:
            error = orjson.loads(entry)
            found[index] = model_response_error(str(error["message"]), int(error["code"]))
    return found


REQUEST_RESCHEDULED = "sordino.request_rescheduled"
"""The output in which such a backend says which requests the model asked to run again
in a later batch (Triton's ``set_release_flags(TRITONSERVER_REQUEST_RELEASE_
RESCHEDULE)``): a ``UINT8`` tensor with an element per request, 1 for those. They have
no rows in the other outputs (as a request answered with an error). A decoupled model's
request is rescheduled by a final response whose outputs are this name alone."""


def encode_request_rescheduled(count: int, indices: Iterable[int]) -> Tensor:
    """The :data:`REQUEST_RESCHEDULED` tensor of a batch of ``count`` requests."""
    column = np.zeros(count, dtype=np.uint8)
    column[list(indices)] = 1
    return column


REQUEST_ABSENT = "sordino.request_absent"
"""The output in which such a backend says which outputs some answered requests'
responses lack when others' have them (Triton answers a request without an output
its response lacks): a ``BYTES`` tensor with an element per request, empty, or a
JSON list of the names. Those rows of the other outputs are filler; the scheduler
takes the column out and leaves the names out of each request's answer."""


def encode_request_absent(count: int, absent: Mapping[int, Sequence[str]]) -> Tensor:
    """The :data:`REQUEST_ABSENT` tensor of a batch of ``count`` requests: ``absent``
    maps a request's index to the outputs its response lacks."""
    column = np.empty(count, dtype=object)
    for index in range(count):
        names = absent.get(index)
        column[index] = orjson.dumps(list(names)) if names else b""
    return column


def decode_request_absent(column: Tensor, count: int) -> list[tuple[str, ...]]:
    """The outputs each request's response lacks, from a :data:`REQUEST_ABSENT` tensor."""
    found: list[tuple[str, ...]] = [()] * count
    for index, entry in enumerate(column.reshape(-1)[:count]):
        if entry:
            found[index] = tuple(str(name) for name in orjson.loads(entry))
    return found


REQUEST_PARAMETERS = "sordino.request_parameters"
"""The output in which such a backend gives the parameters of answered requests'
responses (Triton's ``InferenceResponse(parameters=...)``): a ``BYTES`` tensor with an
element per request, empty, or the JSON object. The scheduler takes the column out and
puts each object on its request's answer (``InferResponse.parameters``)."""


def encode_request_parameters(count: int, parameters: Mapping[int, str]) -> Tensor:
    """The :data:`REQUEST_PARAMETERS` tensor of a batch of ``count`` requests:
    ``parameters`` maps a request's index to its response's parameters (JSON text)."""
    column = np.empty(count, dtype=object)
    for index in range(count):
        column[index] = parameters.get(index, "").encode()
    return column


def decode_request_parameters(column: Tensor, count: int) -> list[dict[str, Any] | None]:
    """Each request's response parameters from a :data:`REQUEST_PARAMETERS` tensor."""
    found: list[dict[str, Any] | None] = [None] * count
    for index, entry in enumerate(column.reshape(-1)[:count]):
        if entry:
            found[index] = orjson.loads(entry)
    return found


REQUEST_APART = "sordino.request_apart"
"""The output in which such a backend gives the outputs it could not join into the
batch's rows (Triton answers each request with its response's tensors as they are:
another datatype, other dimensions or another row count than the other requests'):
a ``BYTES`` tensor with an element per request, empty, or :func:`encode_request_apart`'s
record of that request's tensors. Those outputs are not in the other outputs; the
scheduler takes the column out and adds each request's tensors to its answer."""


def encode_request_apart(
    count: int, apart: Mapping[int, Mapping[str, Tensor]], order: Sequence[str] = ()
) -> Tensor:
    """The :data:`REQUEST_APART` tensor of a batch of ``count`` requests: ``apart`` maps
    a request's index to its own tensors (numbers, bools, or ``object`` arrays of
    strings), each recorded as its datatype, shape and bytes, and its place among the
    model's outputs ``order`` (an answer lists them in that order)."""
    column = np.empty(count, dtype=object)
    for index in range(count):
        tensors = apart.get(index)
        if not tensors:
            column[index] = b""
            continue
        heads: list[tuple[str, str, list[int], int, int]] = []
        datas: list[bytes] = []
        for name, array in tensors.items():
            strings = array.dtype == np.object_
            data = (
                serialize_bytes_tensor(array) if strings else np.ascontiguousarray(array).tobytes()
            )
            place = order.index(name) if name in order else len(order)
            kind = "BYTES" if strings else array.dtype.str
            heads.append((name, kind, list(array.shape), len(data), place))
            datas.append(data)
        column[index] = orjson.dumps(heads) + b"\n" + b"".join(datas)
    return column


def decode_request_apart(column: Tensor, count: int) -> list[list[tuple[int, str, Tensor]] | None]:
    """Each request's own tensors from a :data:`REQUEST_APART` tensor, as (place among
    the model's outputs, name, tensor) in that order (None: none)."""
    found: list[list[tuple[int, str, Tensor]] | None] = [None] * count
    for index, entry in enumerate(column.reshape(-1)[:count]):
        if not entry:
            continue
        head, _, data = bytes(entry).partition(b"\n")
        tensors: list[tuple[int, str, Tensor]] = []
        at = 0
        for name, dtype, shape, size, place in orjson.loads(head):
            piece = data[at : at + size]
            at += size
            if dtype == "BYTES":
                array = deserialize_bytes_tensor(piece, int(np.prod(shape)))
            else:
                array = np.frombuffer(piece, dtype=np.dtype(dtype))
            tensors.append((int(place), str(name), array.reshape(shape)))
        found[index] = sorted(tensors, key=lambda t: t[0])
    return found
