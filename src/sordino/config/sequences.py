"""A model's ``sequence_batching`` section: Triton's stateful-model scheduling.

Written as in Triton's ``config.pbtxt``, in YAML::

    sequence_batching:
      max_sequence_idle_microseconds: 5000000
      max_sequences_per_client: 2      # sordino's key; default: half the slots
      direct: {}                       # or oldest: {max_candidate_sequences: 4}
      control_input:
        - name: START
          control: [{kind: CONTROL_SEQUENCE_START, int32_false_true: [0, 1]}]
        - name: CORRID
          control: [{kind: CONTROL_SEQUENCE_CORRID, data_type: TYPE_UINT64}]
      state:
        - {input_name: STATE_IN, output_name: STATE_OUT}

A Python model may take ``iterative_sequence: true`` instead of states: each request
without a correlation ID is then a sequence of its own, which the model may run again
in later batches (Triton's request rescheduling).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from sordino.config.base import Section

__all__ = ["ControlInput", "SequenceBatchingConfig", "SequenceControl", "SequenceState"]

ControlKind = Literal[
    "CONTROL_SEQUENCE_START",
    "CONTROL_SEQUENCE_END",
    "CONTROL_SEQUENCE_READY",
    "CONTROL_SEQUENCE_CORRID",
]


class SequenceControl(Section):
    """One control signal and how its false/true values are written."""

    kind: ControlKind
    int32_false_true: tuple[int, int] | None = None
    fp32_false_true: tuple[float, float] | None = None
    bool_false_true: tuple[bool, bool] | None = None
    data_type: (
        Literal["TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING"] | None
    ) = None
    """For CONTROL_SEQUENCE_CORRID: the correlation ID's datatype."""

    @model_validator(mode="after")
    def _one_encoding(self) -> SequenceControl:
        given = [
            name
            for name in ("int32_false_true", "fp32_false_true", "bool_false_true")
            if getattr(self, name) is not None
        ]
        if self.kind == "CONTROL_SEQUENCE_CORRID":
            if given or self.data_type is None:
                raise ValueError("CONTROL_SEQUENCE_CORRID takes data_type (e.g. TYPE_UINT64) only")
        elif len(given) != 1 or self.data_type is not None:
            raise ValueError(
                f"{self.kind} takes exactly one of int32_false_true, fp32_false_true, "
                "bool_false_true"
            )
        return self


class ControlInput(Section):
    """A model input the runtime fills with a sequence signal."""

    name: str = Field(min_length=1)
    control: tuple[SequenceControl, ...] = Field(min_length=1, max_length=1)


class SequenceState(Section):
    """Implicit state: ``output_name`` of one request becomes ``input_name`` of the next."""

    input_name: str = Field(min_length=1)
    output_name: str = Field(min_length=1)
    initial_name: str | None = None
    """The name of its ``initial_state`` (Triton's; shown in its configuration); None:
    none declared (zeros)."""
    initial_data_file: str | None = Field(default=None, pattern=r"^[^/\\]+$", max_length=255)
    """Each sequence's first state, read from this file of the model folder's
    ``initial_state/`` folder: the state's elements in row-major order, raw (Triton's
    ``initial_state { data_file }``); None: zeros."""


class OldestStrategy(Section):
    max_candidate_sequences: int = Field(default=8, ge=1)
    """Sequences served at once; a new one past this is refused (503) until one ends."""


class DirectStrategy(Section):
    max_sequences: int | None = Field(default=None, ge=1)
    """Sequences served at once (sordino's key); None: max_batch_size x instance_count."""
    max_queue_delay_microseconds: int = Field(default=0, ge=0)
    minimum_slot_utilization: float = Field(default=0.0, ge=0.0, le=1.0)
    """Triton's pair: with both above 0, a batch of the sequences' requests waits (up to
    the delay) until this fraction of ``max_batch_size`` has a request ready; with
    either at 0, the requests ready run at once (the delay alone waits for nothing)."""


class SequenceBatchingConfig(Section):
    """Serve a stateful model: requests carry a correlation ID and start/end flags."""

    max_sequence_idle_microseconds: int = Field(default=1_000_000, ge=1)
    """A sequence without a request for this long is released (an event says so)."""
    max_sequences_per_client: int | None = Field(default=None, ge=1)
    """Sordino's key: live sequences one caller may hold at once (a tenant on a tenanted
    server, a client address otherwise); a new one past it is refused (429). None: half
    the model's sequence slots, rounded up, so one caller cannot take them all."""
    direct: DirectStrategy | None = None
    oldest: OldestStrategy | None = None
    control_input: tuple[ControlInput, ...] = ()
    state: tuple[SequenceState, ...] = ()
    iterative_sequence: bool = False
    """Triton's iterative sequences: a request without a correlation ID is a sequence of
    its own (its ID assigned, 1, 2, ...), and the model may run it again in a later
    batch (a Python model's ``set_release_flags(TRITONSERVER_REQUEST_RELEASE_
    RESCHEDULE)``), its START and END controls false then. A Python model's only."""

    @model_validator(mode="after")
    def _one_strategy(self) -> SequenceBatchingConfig:
        if self.direct is not None and self.oldest is not None:
            raise ValueError("give direct or oldest, not both")
        if self.iterative_sequence and self.state:
            raise ValueError(
                "iterative_sequence with a state is not supported by sordino (a request run "
                "again would need its state carried between its runs); remove one of them"
            )
        return self

    @property
    def strategy(self) -> Literal["direct", "oldest"]:
        return "oldest" if self.oldest is not None else "direct"
