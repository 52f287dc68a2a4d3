"""Triton's sequence batching: stateful models served request by request in a sequence.

A request to a model with ``sequence_batching`` carries a correlation ID
(``parameters.sequence_id``: an integer in 1..2**64-1 — Triton's uint64, where 0 means
"no sequence" — or a non-empty string) and the flags
``sequence_start`` / ``sequence_end``. Per model, :class:`Sequences` keeps each live
sequence (keyed by tenant and correlation ID): its implicit state (the ``state``
outputs of its last request, fed to the ``state`` inputs of the next; on the first,
zeros or its ``initial_state`` file) and a lock, so the requests of one sequence run
one after another, in the order they arrive, while requests of different sequences are
batched together by the model's ordinary dynamic batcher. Control inputs (START, END,
READY, CORRID) are filled in by the runtime; the client sends neither them nor the state
inputs.

Slots are bounded: a new sequence past the limit is refused with 503 until one ends, and
one caller (its tenant on a tenanted server, its client address otherwise) may hold at
most ``max_sequences_per_client`` of them — past that its new sequence is refused with
429 — so one client cannot take every slot. A sequence ends with its ``sequence_end``
request, or is released after ``max_sequence_idle_microseconds`` without a request
(whatever its requests answered; a ``sequence_released`` event says so); a later
request without ``sequence_start`` is then refused.

``direct`` and ``oldest`` differ here only in the slot limit: sordino carries the
state itself, so a sequence is never pinned to a batch slot or an instance.

With ``iterative_sequence`` (a Python model's request rescheduling) a request without a
correlation ID is a sequence of its own (:meth:`Sequences.own`): its ID is the model's
next (1, 2, ...), its START control true and its END control false, and it takes no
slot. Whatever its ID, such a request carries ``again`` (its START and END controls
false): the inputs the scheduler gives it each time its model runs it again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sordino.config.sequences import SequenceBatchingConfig
from sordino.datatypes import from_triton_type, to_numpy_dtype
from sordino.errors import (
    InferenceFailed,
    InvalidRequest,
    ModelLoadError,
    QueueFull,
    RateLimited,
)
from sordino.events import EventSink
from sordino.inference import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    RequestedOutput,
    Tensor,
    TensorSpec,
)
from sordino.memory.refs import Tensors
from sordino.server.data_files import raw_array, read_data_file

__all__ = ["Sequences", "sequence_owner", "sequences_for"]

CorrelationId = int | str

_MAX_CORRID = 2**64 - 1
"""Triton's correlation IDs are uint64; 0 is "no sequence"."""


@dataclass(slots=True)
class _Sequence:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    state: dict[str, Tensor] = field(default_factory=dict)
    last: float = 0.0
    ended: bool = False
    owner: str = ""
    """The caller holding the slot (tenant or client address): counted against its share."""


def sequences_for(
    config: SequenceBatchingConfig,
    metadata: ModelMetadata,
    *,
    max_batch_size: int,
    instances: int,
    events: EventSink,
    folder: Path | None = None,
    undeclared: bool = False,
) -> Sequences:
    """Check ``config`` against the model; return its sequence batcher (ModelLoadError if
    wrong). ``folder``: the model's, whose ``initial_state/`` holds its states' initial
    data files. ``undeclared``: the model takes control inputs its configuration does not
    declare (a Python model, as Triton hands them): they join its inputs, ``filled``
    (the sequence batcher's ``metadata`` is then the model's to serve)."""
    model = metadata.name
    if undeclared:
        metadata = _with_controls(metadata, config)
    if metadata.decoupled and not config.iterative_sequence:
        raise ModelLoadError(
            f"model {model!r}: sequence_batching for a decoupled model is supported only with "
            "iterative_sequence: true (each request a sequence of its own, its responses a "
            "stream); sordino does not serve a decoupled model's sequences of requests"
        )
    for control in config.control_input:
        if metadata.input(control.name) is None:
            raise ModelLoadError(
                f"model {model!r}: sequence_batching.control_input names {control.name!r}, "
                f"but the model's inputs are {', '.join(s.name for s in metadata.inputs)}"
            )
    for state in config.state:
        source, target = metadata.output(state.output_name), metadata.input(state.input_name)
        if source is None or target is None:
            raise ModelLoadError(
                f"model {model!r}: sequence_batching.state feeds {state.output_name!r} into "
                f"{state.input_name!r}; both must be the model's (an output, an input)"
            )
        if (source.datatype, source.shape) != (target.datatype, target.shape):
            raise ModelLoadError(
                f"model {model!r}: sequence_batching.state output {state.output_name!r} and "
                f"input {state.input_name!r} must have the same datatype and shape"
            )
    if config.oldest is not None:
        slots = config.oldest.max_candidate_sequences
    elif config.direct is not None and config.direct.max_sequences is not None:
        slots = config.direct.max_sequences
    else:
        slots = max(1, max_batch_size) * instances
    initial = {
        state.input_name: _initial_state(
            metadata, state.input_name, state.initial_data_file, folder
        )
        for state in config.state
        if state.initial_data_file is not None
    }
    return Sequences(config, metadata, slots=slots, events=events, initial=initial)


def _with_controls(metadata: ModelMetadata, config: SequenceBatchingConfig) -> ModelMetadata:
    """``metadata`` with each control input it lacks, of the control's datatype and one
    element a request (Triton's ``[1]``), among its ``filled`` inputs."""
    added = []
    for control_input in config.control_input:
        if metadata.input(control_input.name) is not None:
            continue
        control = control_input.control[0]
        if control.data_type is not None:
            datatype = from_triton_type(control.data_type)
        elif control.int32_false_true is not None:
            datatype = "INT32"
        elif control.fp32_false_true is not None:
            datatype = "FP32"
        else:
            datatype = "BOOL"
        shape = (-1, 1) if metadata.batched else (1,)
        added.append(TensorSpec(control_input.name, datatype, shape))
    if not added:
        return metadata
    return dataclasses.replace(
        metadata,
        inputs=(*metadata.inputs, *added),
        filled=metadata.filled | {spec.name for spec in added},
    )


def _initial_state(
    metadata: ModelMetadata, name: str, file: str, folder: Path | None
) -> np.ndarray:
    """A state's initial data, from ``file`` of ``folder``'s ``initial_state/``: as many
    raw elements as the state holds a row (ModelLoadError naming what is wrong)."""
    spec = metadata.input(name)
    assert spec is not None  # checked above
    shape = spec.item_shape if metadata.batched else spec.shape
    where = f"model {metadata.name!r}: state {name!r}"
    if spec.datatype == "BYTES" or any(dim < 0 for dim in shape):
        raise ModelLoadError(
            f"{where}: an initial state from a file needs a state of fixed dims and a "
            f"numeric datatype (it is {spec.datatype} {list(shape)}); use zero_data"
        )
    data = read_data_file(folder or Path(), "initial_state", file, "initial_state data_file", where)
    return raw_array(data, spec.datatype, shape, file, where)


class Sequences:
    """One model's live sequences."""

    def __init__(
        self,
        config: SequenceBatchingConfig,
        metadata: ModelMetadata,
        *,
        slots: int,
        events: EventSink,
        initial: dict[str, np.ndarray] | None = None,
    ) -> None:
        """``initial``: a state's first value a row, by input (zeros for the others)."""
        self.config = config
        self._initial = initial or {}
        self.metadata = metadata
        self.slots = slots
        per_client = config.max_sequences_per_client
        self.per_client = min(slots, per_client if per_client is not None else -(-slots // 2))
        """Sequences one caller may hold at once (at most every slot)."""
        self._held: dict[str, int] = {}
        self._events = events
        self._idle_s = config.max_sequence_idle_microseconds / 1e6
        self._live: dict[tuple[str, CorrelationId], _Sequence] = {}
        self._state_outputs = {s.output_name: s.input_name for s in config.state}
        self.iterative = config.iterative_sequence
        """Triton's iterative sequences: a request without a correlation ID is a
        sequence of its own (:meth:`own`), and the model may run requests again."""
        self._ids = itertools.count(1)

    @property
    def hidden_inputs(self) -> set[str]:
        """Inputs the runtime fills (control and state): never the client's to send."""
        return {c.name for c in self.config.control_input} | {
            s.input_name for s in self.config.state
        }

    def live(self) -> int:
        return len(self._live)

    async def run(
        self,
        request: InferRequest,
        tenant: str,
        call: Callable[[InferRequest], Awaitable[InferResponse]],
        *,
        owner: str | None = None,
    ) -> InferResponse:
        """Serve ``request`` as the next of its sequence with ``call`` (the one-shot path).

        ``owner`` is the caller a new sequence is counted against (its tenant on a
        tenanted server, else its client address); None: ``tenant``.
        """
        if self.iterative and not _given(request):
            self.own(request)
            return await call(request)
        corrid, start, end = self._take_flags(request)
        key = (tenant, corrid)
        sequence = self._live.get(key)
        if start:
            if sequence is None:
                if len(self._live) >= self.slots:
                    raise QueueFull(
                        f"model {self.metadata.name!r} serves {self.slots} sequences at once "
                        "and all are in use; end one (sequence_end) or retry later",
                        retry_after_s=self._idle_s,
                    )
                holder = tenant if owner is None else owner
                if self._held.get(holder, 0) >= self.per_client:
                    raise RateLimited(
                        f"model {self.metadata.name!r} lets one client hold "
                        f"{self.per_client} of its {self.slots} sequences at once and "
                        f"{holder!r} holds them all; end one (sequence_end), or wait "
                        f"{self._idle_s:g} s for an idle one to be released",
                        retry_after_s=self._idle_s,
                    )
                sequence = self._live[key] = _Sequence(owner=holder)
                self._held[holder] = self._held.get(holder, 0) + 1
        elif sequence is None:
            raise InvalidRequest(
                f"inference request for sequence {corrid} to model '{self.metadata.name}' must "
                "specify the START flag on the first request of the sequence (sordino: no "
                "live sequence has this correlation ID; it ended, or was released after "
                f"{self._idle_s:g} s idle)"
            )
        async with sequence.lock:
            try:
                if start:
                    sequence.state.clear()
                    sequence.ended = False
                self._fill(request, corrid, start=start, end=end, state=sequence.state)
                wanted = request.outputs
                if wanted is not None:
                    names = {o.name for o in wanted}
                    request.outputs = wanted + [
                        RequestedOutput(name) for name in self._state_outputs if name not in names
                    ]
                try:
                    response = await call(request)
                finally:
                    request.outputs = wanted
                missing = [name for name in self._state_outputs if name not in response.outputs]
                if missing:  # (a model may leave an output out: not its state)
                    response.release()
                    raise InferenceFailed(
                        f"model {self.metadata.name!r} did not return its state output "
                        f"{missing[0]!r} (sequence_batching state), so sequence {corrid} "
                        "cannot go on; the model must return it with every response"
                    )
                sequence.state = {
                    self._state_outputs[name]: np.array(response.outputs[name])
                    for name in self._state_outputs
                }
                response = self._strip(response, wanted)
            finally:
                # Whatever the outcome, the slot is freed by the end flag or, idle, by the
                # timer: a sequence whose requests all fail is not held forever.
                sequence.last = time.monotonic()
                if end:
                    self._end(key, sequence, "end")
                elif not sequence.ended:
                    asyncio.get_running_loop().call_later(self._idle_s, self._expire, key, sequence)
        return response

    def own(self, request: InferRequest) -> None:
        """Make ``request`` to an iterative model a sequence of its own: its correlation
        ID the client's, or else the model's next (START true, END false, as Triton's
        iterative sequencer sets them); its control inputs filled. It takes no slot and
        waits for no other request: it holds no state (the configuration refuses
        ``state`` with ``iterative_sequence``)."""
        if _given(request):
            corrid, start, end = self._take_flags(request)
        else:
            corrid, start, end = next(self._ids), True, False
            self._take_flags(request, check=False)
            request.correlation_id, request.flags = corrid, 1
        self._fill(request, corrid, start=start, end=end, state={})

    def _take_flags(
        self, request: InferRequest, *, check: bool = True
    ) -> tuple[CorrelationId, bool, bool]:
        """The request's correlation ID and START and END flags, taken out of its
        parameters (consumed here, not admission's to refuse) and set on it."""
        taken = self._flags(request) if check else (0, False, False)
        for name in ("sequence_id", "sequence_start", "sequence_end"):
            request.parameters.pop(name, None)
        corrid, start, end = taken
        # A Python model reads them as Triton's correlation_id() and flags().
        request.correlation_id = corrid
        request.flags = (1 if start else 0) | (2 if end else 0)
        return taken

    def _flags(self, request: InferRequest) -> tuple[CorrelationId, bool, bool]:
        parameters = request.parameters
        corrid: Any = parameters.get("sequence_id", 0)
        if isinstance(corrid, bool) or not isinstance(corrid, int | str) or corrid in (0, ""):
            raise InvalidRequest(
                f"inference request to model '{self.metadata.name}' must specify a non-zero "
                "or non-empty correlation ID (sordino: set parameters.sequence_id, with "
                "sequence_start on a sequence's first request and sequence_end on its last)"
            )
        if isinstance(corrid, int) and not 0 < corrid <= _MAX_CORRID:
            raise InvalidRequest(
                f"sequence_id {corrid} of a request to model '{self.metadata.name}' is out of "
                "range: a correlation ID is an integer from 1 to 2**64-1 (uint64) or a "
                "non-empty string"
            )
        flags = []
        for key in ("sequence_start", "sequence_end"):
            value = parameters.get(key, False)
            if not isinstance(value, bool):
                raise InvalidRequest(f"request parameter {key!r} must be true or false")
            flags.append(value)
        return corrid, flags[0], flags[1]

    def _fill(
        self,
        request: InferRequest,
        corrid: CorrelationId,
        *,
        start: bool,
        end: bool,
        state: dict[str, Tensor],
    ) -> None:
        inputs = dict(request.inputs)
        for name in self.hidden_inputs:
            if name in inputs:
                raise InvalidRequest(
                    f"input {name!r} of model {self.metadata.name!r} is filled in by the "
                    "sequence batcher (a control or state input); leave it out of the request"
                )
        rows = 1
        if self.metadata.batched and inputs:
            rows = int(next(iter(inputs.values())).shape[0])
        signals = {
            "CONTROL_SEQUENCE_START": start,
            "CONTROL_SEQUENCE_END": end,
            "CONTROL_SEQUENCE_READY": True,
        }
        # Run again (rescheduled), a request's START and END are false (Triton's flags 0).
        again: dict[str, Tensor] = {}
        for control_input in self.config.control_input:
            control = control_input.control[0]
            shape, datatype = self._shape(control_input.name, rows)
            if control.kind == "CONTROL_SEQUENCE_CORRID":
                value: Any = corrid
                if datatype == "BYTES":
                    value = str(corrid).encode()
                elif isinstance(corrid, str):
                    raise InvalidRequest(
                        f"model {self.metadata.name!r} takes integer correlation IDs "
                        f"({datatype}); sequence_id is the string {corrid!r:.80}"
                    )
                elif corrid > np.iinfo(to_numpy_dtype(datatype)).max:
                    raise InvalidRequest(
                        f"model {self.metadata.name!r} takes correlation IDs up to "
                        f"{np.iinfo(to_numpy_dtype(datatype)).max} ({datatype}); sequence_id "
                        f"is {corrid}"
                    )
            else:
                pair = (
                    control.int32_false_true or control.fp32_false_true or control.bool_false_true
                )
                assert pair is not None  # checked by the config
                value = pair[1] if signals[control.kind] else pair[0]
                if control.kind != "CONTROL_SEQUENCE_READY":
                    again[control_input.name] = np.full(shape, pair[0], dtype=_dtype(datatype))
            inputs[control_input.name] = np.full(shape, value, dtype=_dtype(datatype))
            request.input_datatypes[control_input.name] = datatype
        if self.iterative:
            request.again = again
        for spec in self.config.state:
            shape, datatype = self._shape(spec.input_name, rows)
            previous = state.get(spec.input_name)
            first = self._initial.get(spec.input_name)
            if previous is not None and list(previous.shape) == shape:
                inputs[spec.input_name] = previous
            elif first is not None:
                inputs[spec.input_name] = np.ascontiguousarray(np.broadcast_to(first, shape))
            else:
                inputs[spec.input_name] = np.zeros(shape, dtype=to_numpy_dtype(datatype))
            request.input_datatypes[spec.input_name] = datatype
        request.inputs = inputs

    def _shape(self, name: str, rows: int) -> tuple[list[int], str]:
        spec = self.metadata.input(name)
        assert spec is not None  # checked at load
        shape = [max(dim, 1) for dim in spec.shape]
        if self.metadata.batched:
            shape[0] = rows
        return shape, spec.datatype

    def _strip(
        self, response: InferResponse, wanted: list[RequestedOutput] | None
    ) -> InferResponse:
        keep = (
            {o.name for o in wanted}
            if wanted is not None
            else {name for name in response.outputs if name not in self._state_outputs}
        )
        if set(response.outputs) <= keep or not isinstance(response.outputs, Tensors):
            return response
        outputs = response.outputs
        response.outputs = Tensors.compose({name: (outputs, name) for name in keep})
        outputs.release()
        return response

    def _end(self, key: tuple[str, CorrelationId], sequence: _Sequence, cause: str) -> None:
        sequence.ended = True
        if self._live.get(key) is sequence:
            del self._live[key]
            held = self._held.get(sequence.owner, 0) - 1
            if held > 0:
                self._held[sequence.owner] = held
            else:
                self._held.pop(sequence.owner, None)
        if cause != "end":
            self._events.emit(
                "sequence_released",
                self.metadata.name,
                cause,
                tenant=key[0],
                correlation_id=str(key[1]),
            )

    def _expire(self, key: tuple[str, CorrelationId], sequence: _Sequence) -> None:
        if sequence.ended or sequence.lock.locked():
            return
        if time.monotonic() - sequence.last >= self._idle_s * 0.999:
            self._end(key, sequence, "idle")


def _given(request: InferRequest) -> bool:
    """Whether ``request`` names a sequence (a correlation ID other than 0 or "")."""
    corrid = request.parameters.get("sequence_id", 0)
    return isinstance(corrid, bool) or corrid not in (0, "")


def _dtype(datatype: str) -> Any:
    return object if datatype == "BYTES" else to_numpy_dtype(datatype)


def sequence_owner(request: InferRequest, tenant: str, *, tenanted: bool) -> str:
    """Whom a new sequence of ``request`` counts against: the tenant when its key names
    it (``tenanted``: the server authenticates tenants); else the client address (a
    claimed tenant name is anyone's to claim)."""
    if tenanted or request.client is None:
        return tenant
    return request.client
