"""Prometheus metrics of the configured pipelines, read at scrape time.

- ``sordino_pipeline_batches_total{pipeline}``: batches of pipeline requests run
- ``sordino_pipeline_node_inputs_total{pipeline,how}``: how node inputs travelled —
  ``handed_over`` (the arena block they lay in, no copy), ``entered`` (a pipeline
  input the pipeline wrote into the arena once), ``recopied`` (written again because
  a node model's batch joined them with other work; counted per node model)
- ``sordino_pipeline_plan_{planned_peak,naive}_bytes{pipeline}``: the last batch's
  tensors laid out by lifetime, next to each in its own block

Pipelines are configured, so the label set is bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sordino.records import PipelineStatistics

__all__ = ["PipelineCollector"]


class PipelineCollector(Collector):
    """Exports a source of :class:`PipelineStatistics`."""

    def __init__(self, source: Callable[[], Sequence[PipelineStatistics]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        stats = self._source()
        batches = CounterMetricFamily(
            "sordino_pipeline_batches", "Batches of pipeline requests run.", labels=["pipeline"]
        )
        inputs = CounterMetricFamily(
            "sordino_pipeline_node_inputs",
            "Node inputs by how they reached the node: handed_over (no copy), entered "
            "(written into the arena once), recopied (a merged node batch copied them).",
            labels=["pipeline", "how"],
        )
        planned = GaugeMetricFamily(
            "sordino_pipeline_plan_planned_peak_bytes",
            "The last batch's tensors laid out by lifetime.",
            labels=["pipeline"],
        )
        naive = GaugeMetricFamily(
            "sordino_pipeline_plan_naive_bytes",
            "The last batch's tensors each in its own block.",
            labels=["pipeline"],
        )
        for stat in stats:
            batches.add_metric([stat.pipeline], stat.batches)
            inputs.add_metric([stat.pipeline, "handed_over"], stat.handed_over)
            inputs.add_metric([stat.pipeline, "entered"], stat.entered)
            inputs.add_metric([stat.pipeline, "recopied"], stat.recopied)
            planned.add_metric([stat.pipeline], stat.planned_peak_bytes)
            naive.add_metric([stat.pipeline], stat.naive_bytes)
        yield from (batches, inputs, planned, naive)
