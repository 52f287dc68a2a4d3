"""memory.reuse_strategy: what the generation caches give back first when full."""

from __future__ import annotations

import numpy as np
import pytest

from sordino.generation.reuse import Generated, ResultCache, StateCache


def _result(seed: int, side: int = 8) -> Generated:
    return Generated(np.zeros((side, side), np.uint8), b"png%d" % seed, 4, 4, seed)


@pytest.mark.parametrize(
    ("policy", "evicted"),
    [("lru", 3), ("lfu", 2), ("largest", 1)],
)
def test_each_policy_evicts_its_own_victim(policy: str, evicted: int) -> None:
    cache = ResultCache(entries=3, policy=policy)  # type: ignore[arg-type]
    cache.put("t", 1, _result(1, side=64))  # the largest
    cache.put("t", 2, _result(2))
    cache.put("t", 3, _result(3))
    for _ in range(3):
        assert cache.get("t", 3) is not None  # 3: used most often, longest ago
    assert cache.get("t", 2) is not None  # 2: used once
    assert cache.get("t", 1) is not None  # 1: used once, last
    cache.put("t", 4, _result(4))
    assert cache.evictions == 1 and cache.size("t") == 3
    gone = [k for k in (1, 2, 3) if cache.get("t", k) is None]
    assert gone == [evicted]


def test_lfu_in_the_state_cache_keeps_the_popular_state() -> None:
    cache = StateCache(entries=2, policy="lfu")
    cache.put("popular", np.ones(16, np.float32))
    cache.put("rare", np.ones(16, np.float32))
    for _ in range(4):
        assert cache.get("popular") is not None
    assert cache.get("rare") is not None  # the most recent, but used once
    cache.put("new", np.ones(16, np.float32))
    assert cache.get("popular") is not None and cache.get("rare") is None
    assert cache.evictions == 1


def test_largest_in_the_state_cache_gives_back_the_most_bytes() -> None:
    cache = StateCache(entries=2, policy="largest")
    cache.put("big", np.ones(4096, np.float32))
    cache.put("small", np.ones(16, np.float32))
    cache.put("next", np.ones(16, np.float32))
    assert cache.get("big") is None and cache.get("small") is not None


def test_the_setting_reaches_a_served_pipeline() -> None:
    from sordino.config import RuntimeConfig
    from sordino.config.memory import MemoryConfig
    from sordino.models.repository import builtin_sources
    from sordino.testing import serve_in_thread

    config = RuntimeConfig(memory=MemoryConfig(reuse_strategy="lfu"))
    sources = [s for s in builtin_sources() if s.name == "digits-diffusion"]
    with serve_in_thread(config, sources) as server:
        pipeline = server.runtime.registry.get("digits-diffusion").pipeline
        assert pipeline is not None
        assert pipeline.results.policy == "lfu" and pipeline.states.policy == "lfu"
