"""Triton's config.pbtxt read into Triton's JSON form, and what sordino takes from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from sordino.backends.pbtxt import parse_pbtxt
from sordino.backends.pbtxt_settings import sordino_settings
from sordino.config import ModelConfig, load_config
from sordino.errors import ConfigError, ModelLoadError
from sordino.models.repository import scan_repository
from sordino.scheduling.settings import scheduling_for

TEXT = """
# a comment
name: "w1"
backend: "python"
max_batch_size: 32
input [ { name: "x" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [
  { name: "y", data_type: TYPE_FP32, dims: [ -1, 4 ] }
]
dynamic_batching {
  preferred_batch_size: [ 8, 32 ]
  max_queue_delay_microseconds: 10000
}
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters: { key: "onnx_path" value: { string_value: "/tmp/a \\"b\\".onnx" } }
parameters { key: "threads" value { string_value: "2" } }
model_transaction_policy { decoupled: true }
"""


def test_the_text_format_becomes_tritons_json_form() -> None:
    """Repeated fields are lists, maps objects, enums their names, numbers numbers."""
    config = parse_pbtxt(TEXT)
    assert config["name"] == "w1" and config["max_batch_size"] == 32
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [256]}]
    assert config["output"][0]["dims"] == [-1, 4]
    assert config["dynamic_batching"]["preferred_batch_size"] == [8, 32]
    assert config["parameters"] == {
        "onnx_path": {"string_value": '/tmp/a "b".onnx'},
        "threads": {"string_value": "2"},
    }
    assert config["model_transaction_policy"] == {"decoupled": True}


def test_sordino_takes_backend_batching_and_instances() -> None:
    """What ModelConfig gets: backend, max_batch_size, dynamic batching, instance group."""
    settings = sordino_settings(parse_pbtxt(TEXT), source="config.pbtxt")
    assert settings == {
        "backend": "python",
        "max_batch_size": 32,
        "dynamic_batching": {
            "preferred_batch_size": [8, 32],
            "max_queue_delay_microseconds": 10000,
        },
        "instance_count": 2,
        "instance_kind": "cpu",
    }


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('name: "a"\ninput [ { name: "x" ', "line 2: missing '}'"),
        ('name: "a"\n}', "line 2: unexpected '}'"),
        ('name: "a"\n  @', "line 2: cannot read '@'"),
    ],
)
def test_a_broken_file_is_an_error_naming_the_line(text: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        parse_pbtxt(text, source="m/config.pbtxt")


SEQUENCES = """
backend: "python"
max_batch_size: 4
input [
  { name: "INPUT", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "START", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "CORRID", data_type: TYPE_UINT64, dims: [ 1 ] },
  { name: "STATE_IN", data_type: TYPE_INT32, dims: [ 1 ] }
]
output [
  { name: "OUTPUT", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "STATE_OUT", data_type: TYPE_INT32, dims: [ 1 ] }
]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 3 max_queue_delay_microseconds: 0 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
"""


def test_sordino_takes_the_sequence_batcher() -> None:
    """Triton's sequence_batching becomes sordino's: idle time, strategy, control
    inputs, implicit state (a state's datatype and shape are its output's)."""
    settings = sordino_settings(parse_pbtxt(SEQUENCES), source="config.pbtxt")
    config = ModelConfig(**settings)
    sequences = config.sequence_batching
    assert sequences is not None
    assert sequences.max_sequence_idle_microseconds == 5_000_000
    assert sequences.strategy == "oldest" and sequences.oldest is not None
    assert sequences.oldest.max_candidate_sequences == 3
    assert [c.name for c in sequences.control_input] == ["START", "CORRID"]
    assert sequences.control_input[0].control[0].int32_false_true == (0, 1)
    assert sequences.control_input[1].control[0].data_type == "TYPE_UINT64"
    assert [(s.input_name, s.output_name) for s in sequences.state] == [("STATE_IN", "STATE_OUT")]


def test_an_empty_sequence_batcher_is_the_direct_strategy() -> None:
    settings = sordino_settings(parse_pbtxt("sequence_batching { direct { } }"), source="c")
    config = ModelConfig(**settings)
    assert config.sequence_batching is not None
    assert config.sequence_batching.strategy == "direct"
    # Triton's strategies batch what is queued unless told to wait (refused before).
    assert config.dynamic_batching.max_queue_delay_microseconds == 0


@pytest.mark.parametrize(
    ("strategy", "delay", "preferred"),
    [
        ("oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }", 10000,
         ()),
        ("oldest { preferred_batch_size: [ 2, 4 ] }", 0, (2, 4)),
    ],
)  # fmt: skip
def test_a_strategys_queue_delay_and_sizes_are_its_batchers(
    strategy: str, delay: int, preferred: tuple[int, ...]
) -> None:
    """What Triton's strategy waits to join the sequences' requests into a batch (its
    simple_dyna_sequence example: oldest, 10 ms) is sordino's batcher's wait."""
    text = f"max_batch_size: 8\nsequence_batching {{ {strategy} }}"
    config = ModelConfig(**sordino_settings(parse_pbtxt(text), source="c"))
    batching = config.dynamic_batching
    assert (batching.max_queue_delay_microseconds, batching.preferred_batch_size) == (
        delay,
        preferred,
    )


@pytest.mark.parametrize(
    ("direct", "policy"),
    [
        # Triton's direct strategy waits only with both above 0 (core's
        # sequence_batch_scheduler.cc): the delay alone runs what is ready at once.
        ("max_queue_delay_microseconds: 100", (0.0, 1, ())),
        ("minimum_slot_utilization: 0.5", (0.0, 1, ())),
        ("max_queue_delay_microseconds: 2000000 minimum_slot_utilization: 0.5",
         (2.0, 4, (4, 5, 6, 7, 8))),
        ("max_queue_delay_microseconds: 1000 minimum_slot_utilization: 0.3", (0.001, 3,
         (3, 4, 5, 6, 7, 8))),
    ],
)  # fmt: skip
def test_the_direct_strategy_waits_for_its_slot_utilization(
    direct: str, policy: tuple[float, int, tuple[int, ...]]
) -> None:
    """A batch of a direct-strategy sequence model runs once ``minimum_slot_utilization``
    of its ``max_batch_size`` slots have a request ready (any size from there on), or
    when ``max_queue_delay_microseconds`` passed."""
    text = f"max_batch_size: 8\nsequence_batching {{ direct {{ {direct} }} }}"
    config = ModelConfig(**sordino_settings(parse_pbtxt(text), source="c"))
    made = scheduling_for(load_config(None, {}).scheduler, config, batched=True).policy
    assert (made.max_delay_s, made.min_batch, made.preferred) == policy


def test_iterative_sequence_is_a_python_models_and_needs_no_state() -> None:
    """Triton's iterative sequences are taken for a Python model (it reschedules its
    requests); an ONNX model never does, and a state would need carrying between runs."""
    text = "max_batch_size: 8\nsequence_batching { iterative_sequence: true }"
    settings = sordino_settings(parse_pbtxt(text), source="c")
    config = ModelConfig(**settings, backend="python")
    assert config.sequence_batching is not None
    assert config.sequence_batching.iterative_sequence
    with pytest.raises(ValidationError, match="iterative_sequence needs a model that runs"):
        ModelConfig(**settings)
    stateful = text.replace("true", 'true state [ { input_name: "a" output_name: "b" } ]')
    with pytest.raises(ValidationError, match="iterative_sequence with a state is not supported"):
        ModelConfig(**sordino_settings(parse_pbtxt(stateful), source="c"), backend="python")


@pytest.mark.parametrize(
    ("field", "said"),
    [
        ("oldest { preserve_ordering: true }", "oldest.preserve_ordering"),
        (  # both: say one
            'state [ { input_name: "a" output_name: "b" initial_state { name: "z" '
            'data_file: "z.bin" zero_data: true } } ]',
            "state.initial_state",
        ),
        (  # a field sordino does not know beside those it takes
            'state [ { input_name: "a" output_name: "b" initial_state { name: "z" '
            "zero_data: true pinned: true } } ]",
            "state.initial_state",
        ),
        (
            'state [ { input_name: "a" output_name: "b" use_growable_memory: true } ]',
            "state.use_growable_memory",
        ),
    ],
)
def test_what_sordino_does_not_do_of_the_sequence_batcher_is_refused_by_name(
    field: str, said: str
) -> None:
    text = f"sequence_batching {{ {field} }}"
    with pytest.raises(ConfigError, match=f"m/config.pbtxt: sequence_batching: .*{said}"):
        sordino_settings(parse_pbtxt(text), source="m/config.pbtxt")


def test_a_bad_control_is_refused_naming_it(tmp_path: Path) -> None:
    """A repository's config.pbtxt: the sequence batcher's own checks name the file."""
    folder = tmp_path / "seq" / "1"
    folder.mkdir(parents=True)
    (folder / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (tmp_path / "seq" / "config.pbtxt").write_text(
        'backend: "python"\nsequence_batching { control_input [ { name: "S" control [ '
        "{ kind: CONTROL_SEQUENCE_START } ] } ] }\n"
    )
    with pytest.raises(ConfigError, match=r"(?s)config\.pbtxt.*START takes exactly"):
        scan_repository(tmp_path)


@pytest.mark.parametrize(
    ("policy", "served"),
    [
        ("", ["3"]),
        ("version_policy: { all { } }", ["1", "2", "3"]),
        ("version_policy: { latest { num_versions: 2 } }", ["2", "3"]),
        ("version_policy: { specific { versions: [ 1, 3 ] } }", ["1", "3"]),
    ],
)
def test_the_version_policy_says_which_versions_are_served(
    tmp_path: Path, policy: str, served: list[str]
) -> None:
    """As Triton: the newest version by default, else what ``version_policy`` says."""
    for version in ("1", "2", "3"):
        (tmp_path / "m" / version).mkdir(parents=True)
        (tmp_path / "m" / version / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (tmp_path / "m" / "config.pbtxt").write_text(f'backend: "python"\n{policy}\n')
    assert [s.version for s in scan_repository(tmp_path)] == served


def test_the_dynamic_batchers_priorities_and_queue_policy_are_taken() -> None:
    """priority_levels, default_priority_level and default_queue_policy as Triton reads
    them: allow_timeout_override false unless set (Triton's default)."""
    text = """
    backend: "python"
    max_batch_size: 8
    dynamic_batching {
      priority_levels: 4
      default_priority_level: 4
      default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5000
                             max_queue_size: 3 }
    }
    """
    config = ModelConfig(**sordino_settings(parse_pbtxt(text), source="c"))
    batching = config.dynamic_batching
    assert (batching.priority_levels, batching.default_priority_level) == (4, 4)
    queue = batching.default_queue_policy
    assert (queue.timeout_action, queue.default_timeout_microseconds) == ("DELAY", 5000)
    assert (queue.max_queue_size, queue.allow_timeout_override) == (3, False)


def test_protobuf_defaults_are_as_if_unset() -> None:
    """0 levels (no priorities) and a 0 queue size (Triton's unbounded) leave sordino's
    defaults: its levels, its bounded queue."""
    text = """
    backend: "python"
    dynamic_batching {
      priority_levels: 0 default_priority_level: 0
      default_queue_policy { max_queue_size: 0 allow_timeout_override: true }
    }
    """
    config = ModelConfig(**sordino_settings(parse_pbtxt(text), source="c"))
    default = ModelConfig().dynamic_batching
    batching = config.dynamic_batching
    assert (batching.priority_levels, batching.default_priority_level) == (
        default.priority_levels,
        default.default_priority_level,
    )
    assert (
        batching.default_queue_policy.max_queue_size == default.default_queue_policy.max_queue_size
    )
    assert batching.default_queue_policy.allow_timeout_override


@pytest.mark.parametrize(
    ("field", "said"),
    [
        ("instance_group [ { count: 1 passive: true } ]", "instance_group.passive"),
        (
            'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_FP32 '
            'source_input: "X" } ]',
            "batch_input",
        ),
    ],
)
def test_what_sordino_does_not_do_is_refused_by_name(field: str, said: str) -> None:
    """Set, these change what Triton does; sordino does not, so it says so at load."""
    with pytest.raises(ConfigError, match=f"m/config.pbtxt: sordino does not support {said}"):
        sordino_settings(parse_pbtxt(f'backend: "python"\n{field}'), source="m/config.pbtxt")


def test_model_warmup_is_taken_with_its_inputs_map() -> None:
    """It was refused before; its ``inputs`` is a map of messages."""
    text = (
        'backend: "python"\nmodel_warmup [ { name: "w" batch_size: 2 count: 3 inputs { key: "X" '
        "value { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } } ]"
    )
    config = ModelConfig(**sordino_settings(parse_pbtxt(text), source="c"))
    (sample,) = config.model_warmup
    assert (sample.name, sample.batch_size, sample.count) == ("w", 2, 3)
    assert sample.inputs["X"].data_type == "TYPE_INT32" and sample.inputs["X"].zero_data


def test_fields_at_their_defaults_are_not_refused() -> None:
    text = """
    backend: "python"
    dynamic_batching { preserve_ordering: false }
    response_cache { enable: false }
    instance_group [ { count: 1 kind: KIND_CPU passive: false } ]
    """
    settings = sordino_settings(parse_pbtxt(text), source="c")
    assert settings["instance_count"] == 1 and "response_cache" not in settings


def test_a_response_cache_is_taken() -> None:
    """Triton's response_cache is the model's ``response_cache`` (tests/server/
    test_response_cache.py serves it)."""
    text = 'backend: "python"\nresponse_cache { enable: true }\n'
    assert sordino_settings(parse_pbtxt(text), source="c")["response_cache"] is True


@pytest.mark.parametrize(
    ("platform", "said"),
    [
        (
            'platform: "pytorch_libtorch"',
            r"names the backend or platform 'pytorch_libtorch', which sordino does not serve "
            r"\(not supported\); it serves .*onnxruntime_onnx.*python",
        ),
        ('backend: "tensorrt"', r"names the backend or platform 'tensorrt'"),
    ],
)
def test_a_platform_sordino_does_not_serve_is_named(
    tmp_path: Path, platform: str, said: str
) -> None:
    """Before, such a folder was taken for an ONNX model: "no .onnx file in …/1"."""
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text(f"{platform}\nmax_batch_size: 0\n")
    with pytest.raises(ModelLoadError, match=said):
        scan_repository(tmp_path)


def test_a_dynamic_batcher_without_a_delay_waits_none_as_on_triton() -> None:
    """Triton's max_queue_delay_microseconds defaults to 0: batch what is queued. sordino
    filled it with its scheduler's 10 ms wait before."""
    text = 'backend: "python"\nmax_batch_size: 8\ndynamic_batching { }\n'
    config = ModelConfig(**sordino_settings(parse_pbtxt(text), source="c"))
    assert config.dynamic_batching.max_queue_delay_microseconds == 0


def test_a_levels_own_queue_policy_is_taken() -> None:
    """Triton's priority_queue_policy (refused before): each level's policy is whole,
    Triton's defaults where it says nothing; a level past priority_levels is refused."""
    text = (
        "max_batch_size: 4\ndynamic_batching { priority_levels: 3\n"
        "  default_queue_policy { default_timeout_microseconds: 5000 }\n"
        "  priority_queue_policy { key: 3 value: { max_queue_size: 2 timeout_action: DELAY } }\n"
        "}"
    )
    config = ModelConfig(**sordino_settings(parse_pbtxt(text), source="c"))
    (level,) = config.dynamic_batching.priority_queue_policy.items()
    assert level[0] == 3
    policy = level[1]
    assert (policy.max_queue_size, policy.timeout_action) == (2, "DELAY")
    assert (policy.default_timeout_microseconds, policy.allow_timeout_override) == (0, False)
    with pytest.raises(ValueError, match=r"names level\(s\) \[3\], outside priority_levels 1..2"):
        ModelConfig(**sordino_settings(parse_pbtxt(text.replace("levels: 3", "levels: 2")),
                                       source="c"))  # fmt: skip


def test_an_initial_state_of_zeros_is_sordinos_own_start() -> None:
    """``initial_state { zero_data: true }`` is what sordino starts each sequence's state
    from (refused before); one from a file is that file (tests/server/test_sequences.py
    serves it)."""
    text = (
        "max_batch_size: 4\nsequence_batching { direct { }\n"
        '  state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 '
        "dims: [ 2 ]\n    initial_state { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true "
        'name: "zeros" } } ]\n}'
    )
    config = ModelConfig(**sordino_settings(parse_pbtxt(text), source="c"))
    assert config.sequence_batching is not None
    (state,) = config.sequence_batching.state
    assert (state.input_name, state.output_name) == ("S_IN", "S_OUT")
    assert state.initial_data_file is None
    from_file = text.replace("zero_data: true", 'data_file: "start.bin"')
    config = ModelConfig(**sordino_settings(parse_pbtxt(from_file), source="c"))
    assert config.sequence_batching is not None
    assert config.sequence_batching.state[0].initial_data_file == "start.bin"
    with pytest.raises(ConfigError, match=r"initial_state dims \[3\] is not the state's"):
        sordino_settings(
            parse_pbtxt(text.replace("dims: [ 2 ] zero", "dims: [ 3 ] zero")), source="c"
        )


@pytest.mark.parametrize(
    ("groups", "count", "kind", "gpus"),
    [
        ("{ count: 2 kind: KIND_CPU }, { count: 1 kind: KIND_CPU }", 3, "cpu", ()),
        ("{ count: 1 kind: KIND_GPU gpus: [ 0 ] }, { count: 1 kind: KIND_GPU gpus: [ 1, 2 ] }",
         1, "gpu", (0, 1, 2)),
        ('{ count: 2 kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 1 } ] '
         "priority: 2 } }", 2, "cpu", ()),
    ],
)  # fmt: skip
def test_instance_groups_one_kind_of_device_can_say(
    groups: str, count: int, kind: str, gpus: tuple[int, ...]
) -> None:
    """Several groups of the CPU add up, GPU groups of one count on GPUs of their own
    join, and a group's rate_limiter is read as Triton reads it without --rate-limit (its
    default): not at all (each refused before)."""
    config = ModelConfig(**sordino_settings(parse_pbtxt(f"instance_group [ {groups} ]"),
                                            source="c"))  # fmt: skip
    assert (config.instance_count, config.instance_kind, config.gpus) == (count, kind, gpus)


@pytest.mark.parametrize(
    ("groups", "said"),
    [
        ("{ count: 1 kind: KIND_CPU }, { count: 1 kind: KIND_GPU }", "of several kinds (cpu, gpu)"),
        ("{ count: 1 kind: KIND_GPU gpus: [ 0 ] }, { count: 2 kind: KIND_GPU gpus: [ 1 ] }",
         "the same count on GPUs of their own (got counts [1, 2]"),
        ("{ count: 1 kind: KIND_GPU }, { count: 1 kind: KIND_GPU }", "without gpus"),
    ],
)  # fmt: skip
def test_instance_groups_one_count_a_device_cannot_say_are_refused(groups: str, said: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(said)):
        sordino_settings(parse_pbtxt(f"instance_group [ {groups} ]"), source="c")
