"""Triton's own metric names, so a dashboard or alert written for Triton reads sordino.

Read at scrape time from the statistics the statistics extension serves
(:class:`~sordino.telemetry.model_stats.ModelStats`), per loaded model version
(labels ``model``, ``version``), as Triton 2.51 names and counts them:

- ``nv_inference_request_success`` and ``nv_inference_request_failure{reason}``
  (``REJECTED``: refused by the scheduler or expired in its queue; ``CANCELED``;
  ``BACKEND``: the model failed; ``OTHER``), counters of requests. As on Triton, a
  Python model's own error response (``InferenceResponse(error=...)``) counts as a
  success here, the model having run; sordino's ``sordino_*`` figures and the
  statistics extension count it a failure;
- ``nv_inference_count`` (rows) and ``nv_inference_exec_count`` (batches run);
- ``nv_inference_request_duration_us``, ``nv_inference_queue_duration_us`` and the
  three ``nv_inference_compute_{input,infer,output}_duration_us``, cumulative;
- ``nv_inference_pending_request_count``, a gauge of the requests queued now;
- ``nv_pinned_memory_pool_{total,used}_bytes``: 0, there being no pinned pool on the
  CPU (Triton reports the same without a GPU).

sordino's own ``sordino_*`` metrics say more (per priority, tenant, outcome); these
are for what was built for Triton.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sordino.inference import ModelKey
from sordino.telemetry.model_stats import FAILURE_REASONS, ModelStats

__all__ = ["TritonCollector"]

_DURATIONS = (
    ("request", "nv_inference_request_duration_us", "inference request"),
    ("queue", "nv_inference_queue_duration_us", "inference queuing"),
    ("compute_input", "nv_inference_compute_input_duration_us", "compute input"),
    ("compute_infer", "nv_inference_compute_infer_duration_us", "compute inference"),
    ("compute_output", "nv_inference_compute_output_duration_us", "inference compute output"),
)
"""(figure, metric, what Triton's help text says it sums)."""


class _Counter(Metric):
    """A cumulative figure whose samples are named as Triton names them.

    Its type line says ``untyped``: prometheus_client's text writer names every
    counter's samples ``NAME_total``, and Triton's carry no ``_total``. Prometheus
    reads an untyped series as it reads a counter (``rate()``, ``increase()``).
    """

    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        super().__init__(name, documentation, "unknown")
        self._labels = tuple(labels)

    def add_metric(self, values: Sequence[str], value: float) -> None:
        self.add_sample(self.name, dict(zip(self._labels, values, strict=True)), value)


class TritonCollector(Collector):
    """Triton's ``nv_*`` metrics of the models ``models()`` lists, each with the number
    of its requests queued now."""

    def __init__(
        self, stats: ModelStats, models: Callable[[], Sequence[tuple[ModelKey, int]]]
    ) -> None:
        self._stats = stats
        self._models = models

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "version"]
        success = _Counter(
            "nv_inference_request_success",
            "Number of successful inference requests, all batch sizes",
            labels,
        )
        failure = _Counter(
            "nv_inference_request_failure",
            "Number of failed inference requests, all batch sizes",
            [*labels, "reason"],
        )
        count = _Counter("nv_inference_count", "Number of inferences performed", labels)
        executions = _Counter(
            "nv_inference_exec_count", "Number of model executions performed", labels
        )
        durations = {key: _Counter(name, text, labels) for key, name, text in _DURATIONS}
        pending = GaugeMetricFamily(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model.",
            labels=labels,
        )
        for key, queued in self._models():
            figures = self._stats.triton_counters(key)
            at = [key.name, key.version]
            success.add_metric(at, figures["success"])
            for reason in FAILURE_REASONS:
                failure.add_metric([*at, reason], figures["failures"][reason])
            count.add_metric(at, figures["inference_count"])
            executions.add_metric(at, figures["execution_count"])
            for name, family in durations.items():
                family.add_metric(at, figures[f"{name}_ns"] // 1000)
            pending.add_metric(at, queued)
        yield from (success, failure, count, executions, *durations.values(), pending)
        for which in ("total", "used"):
            pool = GaugeMetricFamily(
                f"nv_pinned_memory_pool_{which}_bytes",
                f"Pinned memory pool {which} memory size, in bytes",
            )
            pool.add_metric([], 0)
            yield pool
