"""The configuration schema: defaults, constraints, Triton aliases, immutability."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from sordino.config import (
    DynamicBatchingConfig,
    DynamicBatchingStrategy,
    ModelConfig,
    PriorityRule,
    QueuePolicy,
    RuntimeConfig,
    SchedulerConfig,
    ServerConfig,
    VersionPolicy,
)


def batching(**fields: object) -> dict[str, object]:
    return {"name": "dynamic_batching", **fields}


# --- defaults -----------------------------------------------------------------------------


def test_server_defaults() -> None:
    """An empty config listens on localhost:8000 with a 64 MiB body limit and 30 s shutdown."""
    server = RuntimeConfig().server
    assert (server.host, server.http_port) == ("127.0.0.1", 8000)
    assert server.max_request_size == 64 * 1024**2
    assert server.shutdown_timeout == 30.0


def test_data_dir_default_is_expanded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The default data_dir ~/.sordino has its ~ expanded."""
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ServerConfig().data_dir == tmp_path / ".sordino"


def test_a_whole_config_takes_home_when_it_is_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The default data_dir follows $HOME as it is when a config is built, not at import."""
    for home in (tmp_path / "first", tmp_path / "second"):
        monkeypatch.setenv("HOME", str(home))
        assert RuntimeConfig().server.data_dir == home / ".sordino"
        assert RuntimeConfig.model_validate({}).server.data_dir == home / ".sordino"


def test_scheduler_and_model_defaults() -> None:
    """Adaptive mode, 100 ms p99 target, no strategies, no models, no repository."""
    config = RuntimeConfig()
    assert config.scheduler.mode == "adaptive"
    assert config.scheduler.slo_p99_ms == 100.0
    assert config.scheduler.strategies == ()
    assert config.models == ()
    assert config.model_repository is None


def test_dynamic_batching_property_defaults_when_absent() -> None:
    """Without a dynamic_batching strategy the property returns the strategy's defaults."""
    strategy = SchedulerConfig().dynamic_batching
    assert strategy == DynamicBatchingStrategy(name="dynamic_batching")
    assert (strategy.min_batch, strategy.max_batch, strategy.timeout_ms) == (1, 32, 10.0)


def test_priority_rules_empty_when_absent() -> None:
    """Without a stream_priority strategy there are no priority rules."""
    assert SchedulerConfig().priority_rules == ()


def test_helper_properties_return_configured_strategies() -> None:
    """The helpers return the configured strategies, not defaults."""
    scheduler = SchedulerConfig.model_validate(
        {
            "strategies": [
                batching(max_batch=8),
                {"name": "stream_priority", "rules": [{"tag": "vip", "priority": 1}]},
            ]
        }
    )
    assert scheduler.dynamic_batching.max_batch == 8
    assert scheduler.priority_rules == (PriorityRule(tag="vip", priority=1),)


# --- server and scheduler constraints -----------------------------------------------------


@pytest.mark.parametrize("port", [-1, 65536])
def test_http_port_out_of_range(port: int) -> None:
    """Ports outside 0..65535 are refused."""
    with pytest.raises(ValidationError):
        ServerConfig(http_port=port)


def test_http_port_zero_allowed() -> None:
    """Port 0 (pick a free port) is valid."""
    assert ServerConfig(http_port=0).http_port == 0


def test_slo_must_be_positive() -> None:
    """A p99 target of 0 ms is refused."""
    with pytest.raises(ValidationError):
        SchedulerConfig(slo_p99_ms=0)


def test_unknown_mode_refused() -> None:
    """Only the listed scheduler modes are accepted."""
    with pytest.raises(ValidationError):
        SchedulerConfig.model_validate({"mode": "turbo"})


def test_min_batch_above_max_batch_names_both() -> None:
    """min_batch > max_batch is an error naming both values."""
    with pytest.raises(ValidationError, match=r"min_batch \(8\) is larger than max_batch \(4\)"):
        DynamicBatchingStrategy.model_validate(batching(min_batch=8, max_batch=4))


def test_preferred_batch_outside_min_max_refused() -> None:
    """Preferred batch sizes must lie between min_batch and max_batch."""
    with pytest.raises(ValidationError, match=r"\[64\] are outside min_batch..max_batch \(2..32\)"):
        DynamicBatchingStrategy.model_validate(batching(min_batch=2, preferred_batch=[4, 64]))


def test_timeout_ms_accepts_duration_string() -> None:
    """timeout_ms takes a number of milliseconds or a duration string."""
    assert DynamicBatchingStrategy.model_validate(batching(timeout_ms="0.05s")).timeout_ms == 50.0


def test_duplicate_strategy_refused() -> None:
    """The same strategy twice is refused."""
    with pytest.raises(ValidationError, match="configured more than once"):
        SchedulerConfig.model_validate({"strategies": [batching(), batching()]})


def test_unknown_strategy_lists_valid_names() -> None:
    """An unknown strategy name fails and the error names the valid ones."""
    with pytest.raises(ValidationError, match=r"dynamic_batching.*stream_priority.*fallback_chain"):
        SchedulerConfig.model_validate({"strategies": [{"name": "round_robin"}]})


def test_fallback_chain_accepted_with_declared_devices() -> None:
    """The issue's devices + fallback_chain example validates, and the chain is in order."""
    config = RuntimeConfig.model_validate(
        {
            "devices": [
                {"name": "accelerator_v3", "provider": "cuda", "device_id": 0},
                {"name": "accelerator_v2", "provider": "cuda", "device_id": 1},
                {"name": "cpu_fallback", "provider": "cpu"},
            ],
            "scheduler": {
                "strategies": [
                    {
                        "name": "fallback_chain",
                        "primary": "accelerator_v3",
                        "fallbacks": ["accelerator_v2", "cpu_fallback"],
                        "switch_threshold": "error_rate>5% for 30s",
                    }
                ]
            },
        }
    )
    chain = config.scheduler.fallback_chain
    assert chain is not None
    assert chain.chain == ("accelerator_v3", "accelerator_v2", "cpu_fallback")
    assert config.device("accelerator_v2").provider == "CUDAExecutionProvider"


def test_fallback_chain_rejects_a_device_twice() -> None:
    """A device may appear once in a chain."""
    strategy = {"name": "fallback_chain", "primary": "a", "fallbacks": ["b", "a"]}
    with pytest.raises(ValidationError, match=r"devices \['a'\] appear more than once"):
        SchedulerConfig.model_validate({"strategies": [strategy]})


def test_device_names_unique() -> None:
    """Two devices with one name are refused."""
    with pytest.raises(ValidationError, match="used more than once"):
        RuntimeConfig.model_validate({"devices": [{"name": "a"}, {"name": "a"}]})


@pytest.mark.parametrize("priority", ["high", "normal", "low", 1, 7])
def test_priority_accepts_names_and_levels(priority: object) -> None:
    """A priority is high/normal/low or a level >= 1."""
    assert PriorityRule.model_validate({"tag": "t", "priority": priority}).priority == priority


@pytest.mark.parametrize("priority", ["urgent", 0, -1, True])
def test_priority_refuses_other_values(priority: object) -> None:
    """Other names, levels below 1 and booleans are refused."""
    with pytest.raises(ValidationError, match="priority must be"):
        PriorityRule.model_validate({"tag": "t", "priority": priority})


def test_blank_tag_refused() -> None:
    """A rule needs a non-empty tag."""
    with pytest.raises(ValidationError, match="tag must not be empty"):
        PriorityRule(tag=" ", priority="high")


def test_same_tag_twice_refused() -> None:
    """Two rules for one tag would be ambiguous."""
    rules = [{"tag": "a", "priority": "high"}, {"tag": "a", "priority": "low"}]
    with pytest.raises(ValidationError, match="more than one rule"):
        SchedulerConfig.model_validate(
            {"strategies": [{"name": "stream_priority", "rules": rules}]}
        )


# --- models -------------------------------------------------------------------------------


def test_model_defaults() -> None:
    """A bare model entry inherits batching, runs one CPU instance and serves the latest version."""
    model = ModelConfig()
    assert model.backend == "onnxruntime"
    assert model.max_batch_size is None
    assert model.instance_count == 1
    assert model.execution_providers == ("CPUExecutionProvider",)
    assert model.dynamic_batching == DynamicBatchingConfig()
    assert model.version_policy.kind == "latest"


@pytest.mark.parametrize("name", ["-bad", "has space", "a/b", ""])
def test_model_name_pattern(name: str) -> None:
    """Names start with a letter or digit and use only letters, digits, '_', '.', '-'."""
    with pytest.raises(ValidationError):
        ModelConfig(name=name)


def test_flat_triton_aliases_move_into_dynamic_batching() -> None:
    """Batching keys written on the model land in dynamic_batching."""
    model = ModelConfig.model_validate(
        {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 500, "priority_levels": 5}
    )
    assert model.dynamic_batching.preferred_batch_size == (4, 8)
    assert model.dynamic_batching.max_queue_delay_microseconds == 500
    assert model.dynamic_batching.priority_levels == 5


def test_flat_alias_and_nested_key_conflict() -> None:
    """The same batching key on the model and under dynamic_batching is an error."""
    data = {"min_batch_size": 2, "dynamic_batching": {"min_batch_size": 4}}
    with pytest.raises(ValidationError, match="given both on the model and under dynamic_batching"):
        ModelConfig.model_validate(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"max_batch_size": 8, "dynamic_batching": {"max_batch": 16}},
         r"dynamic_batching.max_batch \(16\) exceeds max_batch_size \(8\)"),
        ({"dynamic_batching": {"max_batch": 4, "min_batch_size": 8}},
         r"min_batch_size \(8\) exceeds dynamic_batching.max_batch \(4\)"),
        ({"max_batch_size": 0, "dynamic_batching": {"max_batch": 4}},
         "max_batch_size 0 means this model never batches"),
        ({"dynamic_batching": {"max_batch": 0}}, "greater than or equal to 1"),
    ],
)  # fmt: skip
def test_a_models_max_batch_must_fit(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ModelConfig.model_validate(data)


def test_empty_dynamic_batching_section_means_defaults() -> None:
    """Triton's bare `dynamic_batching {}` written as `dynamic_batching:` loads as defaults."""
    assert ModelConfig.model_validate({"dynamic_batching": None}).dynamic_batching == (
        DynamicBatchingConfig()
    )


def test_platform_alias_sets_backend() -> None:
    """Triton's platform onnxruntime_onnx means the onnxruntime backend."""
    assert ModelConfig.model_validate({"platform": "onnxruntime_onnx"}).backend == "onnxruntime"


def test_other_platform_refused() -> None:
    """Platforms other than onnxruntime_onnx are refused."""
    with pytest.raises(ValidationError, match="platform 'tensorrt_plan' is not supported"):
        ModelConfig.model_validate({"platform": "tensorrt_plan"})


def test_instance_group_sets_instance_count() -> None:
    """Triton's instance_group count becomes instance_count."""
    data = {"instance_group": [{"count": 3, "kind": "KIND_CPU"}]}
    assert ModelConfig.model_validate(data).instance_count == 3


def test_instance_group_gpu_sets_kind_and_gpus() -> None:
    """KIND_GPU with gpus becomes instance_kind gpu on those device ids."""
    data = {"instance_group": [{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1]}]}
    model = ModelConfig.model_validate(data)
    assert (model.instance_count, model.instance_kind, model.gpus) == (2, "gpu", (0, 1))


def test_instance_group_unknown_kind() -> None:
    """An unknown instance kind names the valid ones."""
    data = {"instance_group": [{"count": 1, "kind": "KIND_TPU"}]}
    with pytest.raises(ValidationError, match="KIND_CPU, KIND_GPU or KIND_AUTO"):
        ModelConfig.model_validate(data)


def test_isolation_defaults_to_process() -> None:
    """Models run in worker processes unless isolation says thread."""
    assert ModelConfig().isolation == "process"
    assert ModelConfig(isolation="thread").isolation == "thread"


def test_instance_group_needs_exactly_one_entry() -> None:
    """Several instance groups cannot be expressed as one instance_count."""
    data = {"instance_group": [{"count": 1}, {"count": 2}]}
    with pytest.raises(ValidationError, match="exactly one"):
        ModelConfig.model_validate(data)


def test_instance_group_and_instance_count_conflict() -> None:
    """Giving both spellings is an error."""
    data = {"instance_count": 2, "instance_group": [{"count": 2}]}
    with pytest.raises(ValidationError, match="not both"):
        ModelConfig.model_validate(data)


def test_provider_aliases_map_to_onnxruntime_names() -> None:
    """Short provider aliases (any case) map to ONNX Runtime's provider names."""
    model = ModelConfig.model_validate({"execution_providers": ["cuda", "TensorRT", "cpu"]})
    assert model.execution_providers == (
        "CUDAExecutionProvider",
        "TensorrtExecutionProvider",
        "CPUExecutionProvider",
    )


def test_unknown_provider_lists_valid_names() -> None:
    """An unknown provider is refused with the valid names."""
    with pytest.raises(ValidationError, match="unknown execution provider 'gpu'; valid: cpu, cuda"):
        ModelConfig.model_validate({"execution_providers": ["gpu"]})


def test_preferred_batch_size_above_max_batch_size_refused() -> None:
    """With max_batch_size > 0, preferred sizes must not exceed it."""
    data = {"max_batch_size": 8, "preferred_batch_size": [4, 16]}
    with pytest.raises(ValidationError, match=r"\[16\] exceeds max_batch_size 8"):
        ModelConfig.model_validate(data)


def test_batching_keys_refused_when_model_never_batches() -> None:
    """max_batch_size 0 with preferred sizes would silently ignore them, so it is refused."""
    with pytest.raises(ValidationError, match="never batches"):
        ModelConfig.model_validate({"max_batch_size": 0, "preferred_batch_size": [4]})


def test_default_priority_level_out_of_range_names_both() -> None:
    """default_priority_level outside 1..priority_levels names both values."""
    with pytest.raises(ValidationError, match=r"\(4\) must be between 1 and priority_levels \(3\)"):
        DynamicBatchingConfig(priority_levels=3, default_priority_level=4)


def test_default_priority_level_defaults_to_middle() -> None:
    """An omitted default level is the middle of the configured levels."""
    assert DynamicBatchingConfig.model_validate({"priority_levels": 5}).default_priority_level == 3
    assert DynamicBatchingConfig.model_validate({"priority_levels": 1}).default_priority_level == 1


def test_max_queue_size_zero_refused() -> None:
    """0 (Triton's unbounded) is refused: sordino never runs an unbounded queue."""
    with pytest.raises(ValidationError, match="never runs an unbounded queue, set a positive"):
        QueuePolicy(max_queue_size=0)


def test_queue_policy_rejects_unknown_action() -> None:
    """timeout_action is REJECT or DELAY."""
    with pytest.raises(ValidationError):
        QueuePolicy.model_validate({"timeout_action": "DROP"})


# --- version policy -----------------------------------------------------------------------


def test_version_policy_latest() -> None:
    """latest: N serves the N highest versions."""
    policy = VersionPolicy.model_validate({"latest": {"num_versions": 2}})
    assert policy.kind == "latest"
    assert policy.select([1, 3, 2]) == (2, 3)


def test_version_policy_all_written_as_empty_key() -> None:
    """`all:` (null in YAML) selects every version."""
    policy = VersionPolicy.model_validate({"all": None})
    assert policy.kind == "all"
    assert policy.select([2, 1]) == (1, 2)


def test_version_policy_specific() -> None:
    """specific serves only the listed versions that exist."""
    policy = VersionPolicy.model_validate({"specific": {"versions": [1, 3, 9]}})
    assert policy.select([1, 2, 3]) == (1, 3)


@pytest.mark.parametrize("data", [{}, {"latest": {}, "all": {}}])
def test_version_policy_needs_exactly_one_kind(data: dict[str, object]) -> None:
    """Neither or two kinds at once is an error."""
    with pytest.raises(ValidationError, match="exactly one of latest, all, specific"):
        VersionPolicy.model_validate(data)


# --- the whole config ---------------------------------------------------------------------


def test_explicit_models_need_name_and_path() -> None:
    """An entry under models: must name the model and its path."""
    with pytest.raises(ValidationError, match="needs name and path"):
        RuntimeConfig.model_validate({"models": [{"max_batch_size": 4}]})


def test_duplicate_model_names_refused() -> None:
    """Two explicit models cannot share a name."""
    models = [{"name": "m", "path": "a.onnx"}, {"name": "m", "path": "b.onnx"}]
    with pytest.raises(ValidationError, match="used more than once"):
        RuntimeConfig.model_validate({"models": models})


def test_snapshot_is_frozen() -> None:
    """A config cannot be changed after validation."""
    config = RuntimeConfig()
    with pytest.raises(ValidationError, match="frozen"):
        config.server.http_port = 1


def test_lists_become_tuples() -> None:
    """Sequences are stored as tuples, so nothing inside a snapshot is mutable."""
    config = RuntimeConfig.model_validate({"models": [{"name": "m", "path": "m.onnx"}]})
    assert isinstance(config.models, tuple)
    assert isinstance(config.models[0].execution_providers, tuple)


def test_dump_validates_back_to_an_equal_snapshot() -> None:
    """model_dump() output validates to an equal (and equally hashed) config."""
    config = RuntimeConfig.model_validate(
        {
            "scheduler": {"strategies": [batching(timeout_ms="5ms")]},
            "models": [{"name": "m", "path": "m.onnx", "version_policy": {"all": None}}],
        }
    )
    again = RuntimeConfig.model_validate(config.model_dump())
    assert again == config
    assert hash(again) == hash(config)


def test_unknown_keys_refused_everywhere() -> None:
    """Every section forbids keys it does not know."""
    with pytest.raises(ValidationError):
        QueuePolicy.model_validate({"max_queue_sz": 4})
