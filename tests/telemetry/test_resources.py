"""Resource figures: real where the machine has them, absent where it has not."""

from __future__ import annotations

from dataclasses import dataclass

from sordino.telemetry.resources import ResourceSampler, pool_sample


@dataclass(frozen=True)
class _PoolStats:
    reserved_bytes: int
    in_use_bytes: int
    fragmentation: float


def test_process_memory_is_real_and_pools_are_read_by_field_name() -> None:
    sampler = ResourceSampler(gpus=False)
    sampler.add_pool("arena", lambda: _PoolStats(1000, 400, 0.25))
    sample = sampler.sample()
    assert sample.rss_bytes > 10 << 20
    assert sample.pool_reserved_bytes == 1000 and sample.pool_in_use_bytes == 400
    assert sample.fragmentation == 0.25
    assert sample.gpus == ()


def test_without_a_pool_the_pool_figures_are_absent() -> None:
    sample = ResourceSampler(gpus=False).sample()
    assert sample.pools == ()
    assert sample.pool_reserved_bytes is None and sample.fragmentation is None
    assert sample.cpu_temp_c is None or 0 < sample.cpu_temp_c < 150


def test_unknown_pool_fields_stay_none() -> None:
    assert pool_sample("p", object()).reserved_bytes is None
