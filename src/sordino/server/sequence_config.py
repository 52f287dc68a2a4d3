"""A model's ``sequence_batching`` as Triton 2.51's configuration JSON writes it
(``GET …/config``, and gRPC ``ModelConfig`` from the same document).

sordino keeps less than it shows: ``oldest``'s queue delay and preferred sizes are its
batcher's (``scheduling.policy``), a state's datatype and dims its output's. What
sordino refuses unless it is Triton's default (``minimum_slot_utilization``,
``preserve_ordering``, a state's buffer options) is shown at that default.
"""

from __future__ import annotations

from typing import Any

from sordino.config.sequences import SequenceBatchingConfig, SequenceControl, SequenceState
from sordino.datatypes import to_triton_type
from sordino.inference import ModelMetadata
from sordino.scheduling.batcher import BatchPolicy

__all__ = ["sequence_batching_json"]


def sequence_batching_json(
    config: SequenceBatchingConfig, metadata: ModelMetadata, policy: BatchPolicy
) -> dict[str, Any]:
    """``config`` in Triton's JSON: the strategy (only when given, as Triton shows it),
    the idle time, the control inputs, the states, ``iterative_sequence``."""
    shown: dict[str, Any] = {}
    delay = round(policy.max_delay_s * 1e6)
    if config.oldest is not None:
        shown["oldest"] = {
            "max_candidate_sequences": config.oldest.max_candidate_sequences,
            "preferred_batch_size": list(policy.preferred),
            "max_queue_delay_microseconds": delay,
            "preserve_ordering": False,
        }
    elif config.direct is not None:
        shown["direct"] = {
            "max_queue_delay_microseconds": config.direct.max_queue_delay_microseconds,
            "minimum_slot_utilization": _number(config.direct.minimum_slot_utilization),
        }
    shown["max_sequence_idle_microseconds"] = config.max_sequence_idle_microseconds
    shown["control_input"] = [
        {"name": control.name, "control": [_control(control.control[0])]}
        for control in config.control_input
    ]
    shown["state"] = [_state(state, metadata) for state in config.state]
    shown["iterative_sequence"] = config.iterative_sequence
    return shown


def _control(control: SequenceControl) -> dict[str, Any]:
    return {
        "kind": control.kind,
        "int32_false_true": list(control.int32_false_true or ()),
        "fp32_false_true": [_number(v) for v in control.fp32_false_true or ()],
        "bool_false_true": list(control.bool_false_true or ()),
        "data_type": control.data_type or "TYPE_INVALID",
    }


def _number(value: float) -> float | int:
    """A float as Triton's JSON writes it: 1, not 1.0."""
    return int(value) if float(value).is_integer() else value


def _state(state: SequenceState, metadata: ModelMetadata) -> dict[str, Any]:
    """A state with its output's datatype and dims (checked the same as its input's at
    load), and its initial state when one is declared."""
    spec = metadata.output(state.output_name)
    datatype = to_triton_type(spec.datatype) if spec is not None else "TYPE_INVALID"
    dims = [] if spec is None else list(spec.shape[1:] if metadata.batched else spec.shape)
    initial: list[dict[str, Any]] = []
    if state.initial_name is not None:
        # Triton's JSON writes these dims as text (int64 in a nested message).
        entry: dict[str, Any] = {"data_type": datatype, "dims": [str(d) for d in dims]}
        entry["name"] = state.initial_name
        if state.initial_data_file is not None:
            entry["data_file"] = state.initial_data_file
        else:
            entry["zero_data"] = True
        initial.append(entry)
    return {
        "input_name": state.input_name,
        "output_name": state.output_name,
        "data_type": datatype,
        "dims": dims,
        "initial_state": initial,
        "use_same_buffer_for_input_output": False,
        "use_growable_memory": False,
    }
