"""scheduling_for(): how configuration becomes a batch policy and queue settings."""

from __future__ import annotations

from pathlib import Path

from sordino.config import ModelConfig, SchedulerConfig, validate_config
from sordino.config.iterative import IterativeConfig
from sordino.scheduling.settings import scheduling_for


def _scheduler(**strategy: object) -> SchedulerConfig:
    data = {"scheduler": {"strategies": [{"name": "dynamic_batching", **strategy}]}}
    return validate_config(data).scheduler


def test_defaults() -> None:
    s = scheduling_for(SchedulerConfig(), ModelConfig(), batched=True)
    assert (s.mode, s.max_batch_size, s.policy.max_batch) == ("adaptive", 32, 32)
    assert s.policy.max_delay_s == 0.010
    assert s.queue.max_queue_size == 1024 and s.queue.priority_levels == 3


def test_model_max_batch_size_caps_the_strategy() -> None:
    s = scheduling_for(_scheduler(max_batch=16), ModelConfig(max_batch_size=8), batched=True)
    assert (s.max_batch_size, s.policy.max_batch) == (8, 8)


def test_strategy_caps_a_larger_model_limit() -> None:
    s = scheduling_for(_scheduler(max_batch=16), ModelConfig(max_batch_size=64), batched=True)
    assert (s.max_batch_size, s.policy.max_batch) == (64, 16)


def test_a_models_max_batch_overrides_the_strategys_and_leaves_requests_alone() -> None:
    """``dynamic_batching.max_batch`` sets the batch cap alone: the rows a request may
    carry stay the model's ``max_batch_size`` (a lower cap refuses no request)."""
    lower = ModelConfig(max_batch_size=64, dynamic_batching={"max_batch": 4})
    s = scheduling_for(_scheduler(max_batch=16), lower, batched=True)
    assert (s.max_batch_size, s.policy.max_batch) == (64, 4)
    higher = ModelConfig(max_batch_size=64, dynamic_batching={"max_batch": 48})
    s = scheduling_for(_scheduler(max_batch=16), higher, batched=True)
    assert (s.max_batch_size, s.policy.max_batch) == (64, 48)
    inherited = ModelConfig(dynamic_batching={"max_batch": 8})  # max_batch_size from max_batch
    s = scheduling_for(_scheduler(max_batch=16), inherited, batched=True)
    assert (s.max_batch_size, s.policy.max_batch) == (16, 8)


def test_model_delay_overrides_strategy_timeout() -> None:
    model = ModelConfig(dynamic_batching={"max_queue_delay_microseconds": 2500})
    s = scheduling_for(_scheduler(timeout_ms=50), model, batched=True)
    assert s.policy.max_delay_s == 0.0025


def test_unbatched_model_never_batches() -> None:
    s = scheduling_for(SchedulerConfig(), ModelConfig(), batched=False)
    assert (s.max_batch_size, s.policy.max_batch, s.policy.max_delay_s) == (0, 1, 0.0)


def test_disabled_strategy_turns_batching_off() -> None:
    s = scheduling_for(_scheduler(enabled=False), ModelConfig(), batched=True)
    assert s.policy.max_batch == 1


def test_preferred_sizes_and_min_batch() -> None:
    s = scheduling_for(
        _scheduler(min_batch=2, max_batch=16, preferred_batch=[4, 8]), ModelConfig(), batched=True
    )
    assert (s.policy.min_batch, s.policy.preferred) == (2, (4, 8))


def test_conservative_mode_caps_queue() -> None:
    model = ModelConfig(scheduler_mode="conservative")
    s = scheduling_for(_scheduler(max_batch=8), model, batched=True, instances=2)
    assert s.mode == "conservative"
    assert s.queue.max_queue_size == 4 * 4 * 2


def test_queue_policy_is_carried() -> None:
    model = ModelConfig(
        dynamic_batching={
            "priority_levels": 5,
            "default_priority_level": 4,
            "default_queue_policy": {
                "timeout_action": "DELAY",
                "default_timeout_microseconds": 100_000,
                "max_queue_size": 7,
            },
        }
    )
    q = scheduling_for(SchedulerConfig(), model, batched=True).queue
    assert (q.priority_levels, q.default_priority, q.timeout_action) == (5, 4, "DELAY")
    assert (q.default_timeout_s, q.max_queue_size) == (0.1, 7)


def test_an_exports_denoiser_runs_what_queued_unless_a_mode_is_set(tmp_path: Path) -> None:
    """A Stable Diffusion export's denoiser batches the steps that queued while it ran
    (ultra_low_latency), unless the model or the server names a mode."""
    export = ModelConfig(iterative=IterativeConfig(export=tmp_path))
    assert scheduling_for(SchedulerConfig(), export, batched=True).mode == "ultra_low_latency"
    assert scheduling_for(SchedulerConfig(), ModelConfig(), batched=True).mode == "adaptive"
    digits = ModelConfig(iterative=IterativeConfig())
    assert scheduling_for(SchedulerConfig(), digits, batched=True).mode == "adaptive"
    own = export.model_copy(update={"scheduler_mode": "manual"})
    assert scheduling_for(SchedulerConfig(), own, batched=True).mode == "manual"
    server = validate_config({"scheduler": {"mode": "adaptive"}}).scheduler
    assert scheduling_for(server, export, batched=True).mode == "adaptive"
