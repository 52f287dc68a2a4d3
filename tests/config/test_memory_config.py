"""The ``memory`` section: the issue's YAML loads as written; bad values say what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from sordino.config import load_config
from sordino.errors import ConfigError

ISSUE_YAML = """\
memory:
  strategy: fragmentation_aware     # fragmentation_aware | best_fit | simple (bump/free-list)
  pool_size: 2GB                    # the shared arena
  defrag_interval: 5m               # 0 = never on a timer
  defrag_threshold: 0.3             # also defrag when fragmentation stays above this for a minute
  overflow_protection: true
  reuse_strategy: lru               # what the framework-side caches give back first
  quotas:
    - {tenant: premium, max: 1GB}
    - {tenant: free, max: 200MB}
"""


def test_the_issue_yaml_loads(tmp_path: Path) -> None:
    path = tmp_path / "sordino.yaml"
    path.write_text(ISSUE_YAML)
    memory = load_config(path).memory
    assert memory.strategy == "fragmentation_aware" and memory.pool_size == 2 * 2**30
    assert memory.defrag_interval == 300.0 and memory.defrag_threshold == 0.3
    assert memory.quota("premium") == 2**30 and memory.quota("free") == 200 * 2**20
    assert memory.quota("nobody") is None
    assert memory.zeroes_on_free  # quotas set: blocks are zeroed when freed


def test_defaults_keep_todays_arena() -> None:
    memory = load_config(None).memory
    assert (memory.enabled, memory.strategy, memory.pool_size) == (True, "best_fit", None)
    assert memory.defrag_interval == 0 and memory.defrag_threshold == 0
    assert not memory.zeroes_on_free


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        ({"memory.strategy": "fast"}, ["memory.strategy", "fragmentation_aware", "'fast'"]),
        ({"memory.pool_size": "lots"}, ["memory.pool_size", "'auto'"]),
        ({"memory.pool_size": "auto", "memory.pool_min": "1GB", "memory.pool_max": "64MB"},
         ["memory.pool_max", "memory.pool_min"]),
        ({"memory.enabled": False, "memory.pool_size": "auto"},
         ["memory.enabled is false", "pool_size"]),
        ({"memory.pool_size": "1KB"}, ["memory.pool_size", "65536"]),
        ({"memory.defrag_interval": "soon"}, ["memory.defrag_interval", "'5m'"]),
        ({"memory.defrag_threshold": 1.5}, ["memory.defrag_threshold", "1"]),
        ({"memory.reuse_strategy": "fifo"}, ["memory.reuse_strategy", "lru", "lfu", "largest"]),
        ({"memory.quotas": [{"tenant": "a", "max": "1GB"}, {"tenant": "a", "max": "2GB"}]},
         ["quota tenants ['a']"]),
        ({"memory.quotas": [{"tenant": "a"}]}, ["memory.quotas.0", "max"]),
        ({"memory.small_max": "8MB"}, ["medium_max", "small_max"]),
        ({"memory.enabled": False, "memory.quotas": [{"tenant": "a", "max": 1}]},
         ["memory.enabled is false", "quotas"]),
        ({"memory.defrag_every": "5m"}, ["memory.defrag_every"]),
    ],
)  # fmt: skip
def test_bad_values_name_the_key_and_what_is_allowed(
    overrides: dict[str, object], needles: list[str]
) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(None, overrides)
    for needle in needles:
        assert needle in str(error.value), (needle, str(error.value))


def test_pool_size_auto_starts_at_pool_min() -> None:
    memory = load_config(None, {"memory.pool_size": "auto", "memory.pool_min": "8MB"}).memory
    assert memory.pool_size == "auto" and memory.auto_pool
    assert memory.initial_pool(256 * 2**20) == 8 * 2**20
    fixed = load_config(None, {"memory.pool_size": "32MB"}).memory
    assert not fixed.auto_pool and fixed.initial_pool(1) == 32 * 2**20


@pytest.mark.parametrize(
    ("entry", "needles"),
    [
        ({"framework_memory": {"arena_extend_strategy": "kDouble"}},
         ["framework_memory.arena_extend_strategy", "kSameAsRequested"]),
        ({"framework_memory": {"cpu_arena": False, "shrink_after_rows": 4}},
         ["cpu_arena is false", "shrink_after_rows"]),
        ({"isolation": "thread", "framework_memory": {"arena_extend_strategy": "kSameAsRequested"}},
         ["framework_memory", "not supported with isolation: thread"]),
        ({"framework_memory": {"gpu_mem_limit": "lots"}}, ["framework_memory.gpu_mem_limit"]),
    ],
)  # fmt: skip
def test_bad_framework_memory_names_the_key(entry: dict[str, object], needles: list[str]) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(None, {"models": [{"name": "m", "path": "/m.onnx", **entry}]})
    for needle in needles:
        assert needle in str(error.value), (needle, str(error.value))


def test_framework_memory_loads() -> None:
    entry = {"name": "m", "path": "/m.onnx", "framework_memory": {
        "arena_extend_strategy": "kSameAsRequested", "shrink_after_rows": 64,
        "gpu_mem_limit": "2GB", "gpu_arena_extend_strategy": "kSameAsRequested"}}  # fmt: skip
    memory = load_config(None, {"models": [entry]}).models[0].framework_memory
    assert memory.custom_cpu_arena and memory.gpu_mem_limit == 2 * 2**30
    assert memory.describe_gpu(("CPUExecutionProvider",)) == "absent"
    assert "gpu_mem_limit" in memory.describe_gpu(("CUDAExecutionProvider",))
