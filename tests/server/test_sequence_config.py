"""A model's ``sequence_batching`` in its configuration (``GET …/config``, gRPC
``ModelConfig``), as Triton 2.51 shows it. The expected documents are what Triton 2.51
answered for the same ``config.pbtxt`` sections (a Python model with four control inputs,
``max_batch_size: 8``); ``bench/triton_python_parity.py`` compares the iterative ones
side by side."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format

from sordino.backends.pbtxt import parse_pbtxt
from sordino.backends.pbtxt_settings import sordino_settings
from sordino.config import ModelConfig, load_config
from sordino.inference import ModelMetadata, TensorSpec
from sordino.protocol.pb import kserve_v2_pb2 as pb
from sordino.scheduling.settings import scheduling_for
from sordino.server.sequence_config import sequence_batching_json

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]"""

TRITONS_CONTROLS = [
    {"name": "START", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1], "fp32_false_true": [], "bool_false_true": [], "data_type": "TYPE_INVALID"}]},  # noqa: E501
    {"name": "END", "control": [{"kind": "CONTROL_SEQUENCE_END", "int32_false_true": [], "fp32_false_true": [0, 1], "bool_false_true": [], "data_type": "TYPE_INVALID"}]},  # noqa: E501
    {"name": "READY", "control": [{"kind": "CONTROL_SEQUENCE_READY", "int32_false_true": [], "fp32_false_true": [], "bool_false_true": [False, True], "data_type": "TYPE_INVALID"}]},  # noqa: E501
    {"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "int32_false_true": [], "fp32_false_true": [], "bool_false_true": [], "data_type": "TYPE_UINT64"}]},  # noqa: E501
]  # fmt: skip

STATE = (
    'state [ { input_name: "SIN" output_name: "SOUT" data_type: TYPE_INT32 dims: [ 1 ] '
    'initial_state { name: "i" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } ]'
)

CASES: list[tuple[str, dict[str, Any]]] = [
    (
        "iterative_sequence: true",
        {"max_sequence_idle_microseconds": 1000000, "control_input": TRITONS_CONTROLS,
         "state": [], "iterative_sequence": True},
    ),
    (
        "direct { max_queue_delay_microseconds: 100 minimum_slot_utilization: 0 }\n"
        "max_sequence_idle_microseconds: 5000000",
        {"direct": {"max_queue_delay_microseconds": 100, "minimum_slot_utilization": 0},
         "max_sequence_idle_microseconds": 5000000, "control_input": TRITONS_CONTROLS,
         "state": [], "iterative_sequence": False},
    ),
    (
        "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] "
        "max_queue_delay_microseconds: 10000 }",
        {"oldest": {"max_candidate_sequences": 4, "preferred_batch_size": [2],
                    "max_queue_delay_microseconds": 10000, "preserve_ordering": False},
         "max_sequence_idle_microseconds": 1000000, "control_input": TRITONS_CONTROLS,
         "state": [], "iterative_sequence": False},
    ),
    (
        STATE,
        {"max_sequence_idle_microseconds": 1000000, "control_input": TRITONS_CONTROLS,
         "state": [{"input_name": "SIN", "output_name": "SOUT", "data_type": "TYPE_INT32",
                    "dims": [1], "initial_state": [{"data_type": "TYPE_INT32", "dims": ["1"],
                                                    "name": "i", "zero_data": True}],
                    "use_same_buffer_for_input_output": False, "use_growable_memory": False}],
         "iterative_sequence": False},
    ),
]  # fmt: skip


def _metadata() -> ModelMetadata:
    spec = TensorSpec
    return ModelMetadata(
        "m", "1", "python",
        inputs=(spec("X", "INT32", (-1, 1)), spec("SIN", "INT32", (-1, 1))),
        outputs=(spec("Y", "INT32", (-1, 1)), spec("SOUT", "INT32", (-1, 1))),
        batched=True,
    )  # fmt: skip


@pytest.mark.parametrize(("section", "triton"), CASES)
def test_a_sequence_batchers_section_reads_as_tritons(section: str, triton: dict[str, Any]) -> None:
    text = f"max_batch_size: 8\nsequence_batching {{\n{section}\n{CONTROLS}\n}}"
    config = ModelConfig(**sordino_settings(parse_pbtxt(text), source="c"), backend="python")
    assert config.sequence_batching is not None
    scheduling = scheduling_for(load_config(None, {}).scheduler, config, batched=True)
    shown = sequence_batching_json(config.sequence_batching, _metadata(), scheduling.policy)
    assert shown == triton
    assert list(shown) == list(triton)  # Triton's order
    # The gRPC form is the same document as a protobuf message (Triton's field numbers).
    message = json_format.ParseDict({"sequence_batching": shown}, pb.ModelConfig())
    assert (
        message.sequence_batching.max_sequence_idle_microseconds
        == (triton["max_sequence_idle_microseconds"])
    )
    assert [c.name for c in message.sequence_batching.control_input] == [
        "START", "END", "READY", "CORRID"
    ]  # fmt: skip
