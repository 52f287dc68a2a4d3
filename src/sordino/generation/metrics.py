"""Prometheus metrics of generation, read at scrape time.

- ``sordino_generation_degraded_requests_total``: requests that got fewer steps than asked
- ``sordino_generation_steps_saved_total``: steps not run because of degradation
- ``sordino_generation_ended_at_deadline_total``: running generations ended at a step
  boundary because they could no longer finish by their deadline
- ``sordino_generation_step_factor``: the global step factor (1 when normal)
- ``sordino_generation_cache_hits_total{model}``, ``..._cache_misses_total{model}``: the
  exact-result cache; ``sordino_generation_coalesced_total{model}``: requests that
  joined an identical one in flight
- ``sordino_generation_state_hits_total{model}``, ``..._state_steps_saved_total{model}``:
  approximate reuse (cached intermediate states)
- ``sordino_generation_step_cache_computed_total{model}``,
  ``..._step_cache_skipped_total{model}``: denoising steps the denoiser ran, and steps
  that reused the previous prediction instead (``iterative.step_cache``)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sordino.generation.degrade import StepDegrader

if TYPE_CHECKING:
    from sordino.generation.pipeline import Pipeline

__all__ = ["GenerationCollector"]


class GenerationCollector(Collector):
    """Exports the step degrader and every pipeline's reuse counters."""

    def __init__(self, degrader: StepDegrader, pipelines: Callable[[], Sequence[Pipeline]]) -> None:
        self._degrader = degrader
        self._pipelines = pipelines

    def collect(self) -> Iterator[Metric]:
        stats = self._degrader.statistics()
        yield CounterMetricFamily(
            "sordino_generation_degraded_requests",
            "Generations that got fewer steps than asked (degrade instead of drop).",
            stats.degraded_requests,
        )
        yield CounterMetricFamily(
            "sordino_generation_steps_saved",
            "Denoising steps not run because of degradation.",
            stats.steps_saved,
        )
        yield CounterMetricFamily(
            "sordino_generation_ended_at_deadline",
            "Running generations ended at a step boundary: they could no longer finish "
            "by their deadline.",
            stats.ended_at_deadline,
        )
        yield GaugeMetricFamily(
            "sordino_generation_step_factor",
            "Global factor on remaining steps (1 = normal).",
            1.0 if stats.factor is None else stats.factor,
        )
        families = {
            "cache_hits": "Exact results served from the cache.",
            "cache_misses": "Seeded requests not found in the cache.",
            "coalesced": "Requests that joined an identical generation in flight.",
            "state_hits": "Generations started from a cached intermediate state.",
            "state_steps_saved": "Steps skipped by starting from a cached state.",
            "step_cache_computed": "Denoising steps the denoiser ran.",
            "step_cache_skipped": "Denoising steps that reused the previous prediction.",
        }
        metrics = {
            name: CounterMetricFamily(f"sordino_generation_{name}", doc, labels=["model"])
            for name, doc in families.items()
        }
        for pipeline in self._pipelines():
            model = [pipeline.key.name]
            metrics["cache_hits"].add_metric(model, pipeline.results.hits)
            metrics["cache_misses"].add_metric(model, pipeline.results.misses)
            metrics["coalesced"].add_metric(model, pipeline.in_flight.coalesced)
            metrics["state_hits"].add_metric(model, pipeline.states.hits)
            metrics["state_steps_saved"].add_metric(model, pipeline.states.steps_saved)
            steps = pipeline.step_cache.statistics()
            metrics["step_cache_computed"].add_metric(model, steps.computed)
            metrics["step_cache_skipped"].add_metric(model, steps.skipped)
        yield from metrics.values()
