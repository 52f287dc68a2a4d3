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
  CPU (Triton reports the same without a GPU);
- with a response cache (``--cache-config``): ``nv_cache_num_{hits,misses}_per_model``
  and ``nv_cache_{hit,miss}_duration_per_model`` (µs) per model version the cache has
  answered or missed (a model that enables it: its first request is a miss), and the
  cache's own gauges ``nv_cache_num_entries``, ``nv_cache_num_lookups``,
  ``nv_cache_num_hits``, ``nv_cache_num_misses``, ``nv_cache_num_evictions``,
  ``nv_cache_lookup_duration``, ``nv_cache_insertion_duration`` (µs) and
  ``nv_cache_util`` (the share of its size in use).

sordino's own ``sordino_*`` metrics say more (per priority, tenant, outcome); these
are for what was built for Triton.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sordino.inference import ModelKey
from sordino.records import CacheFigures
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
_CACHE_PER_MODEL = (
    ("cache_hits", "nv_cache_num_hits_per_model", "Number of cache hits per model"),
    ("cache_misses", "nv_cache_num_misses_per_model", "Number of cache misses per model"),
    ("cache_hit_ns", "nv_cache_hit_duration_per_model",
     "Total cache hit duration per model, in microseconds"),
    ("cache_miss_ns", "nv_cache_miss_duration_per_model",
     "Total cache miss (insert+lookup) duration per model, in microseconds"),
)  # fmt: skip


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
        self,
        stats: ModelStats,
        models: Callable[[], Sequence[tuple[ModelKey, int]]],
        cache: Callable[[], CacheFigures] | None = None,
    ) -> None:
        """``cache``: the response cache's figures, where the server has one."""
        self._stats = stats
        self._models = models
        self._cache = cache

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
        per_model = {field: _Counter(name, text, labels) for field, name, text in _CACHE_PER_MODEL}
        for key, queued in self._models():
            figures = self._stats.triton_counters(key)
            at = [key.name, key.version]
            for field, family in per_model.items() if figures["cache_misses"] else ():
                value = figures[field]  # (a model the cache has seen: as Triton, no other)
                family.add_metric(at, value // 1000 if field.endswith("_ns") else value)
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
        if self._cache is None:
            return
        yield from per_model.values()
        cache = self._cache()
        for name, text, value in (
            ("nv_cache_num_entries", "Number of responses stored in response cache", cache.entries),
            ("nv_cache_num_lookups", "Number of cache lookups in response cache", cache.lookups),
            ("nv_cache_num_hits", "Number of cache hits in response cache", cache.hits),
            ("nv_cache_num_misses", "Number of cache misses in response cache", cache.misses),
            ("nv_cache_num_evictions", "Number of cache evictions in response cache",
             cache.evictions),
            ("nv_cache_lookup_duration",
             "Total cache lookup duration (hit and miss), in microseconds",
             int(cache.lookup_s * 1e6)),
            ("nv_cache_insertion_duration", "Total cache insertion duration, in microseconds",
             int(cache.insertion_s * 1e6)),
            ("nv_cache_util", "Cache utilization [0.0 - 1.0]", cache.used / cache.size),
        ):  # fmt: skip
            gauge = GaugeMetricFamily(name, text)
            gauge.add_metric([], value)
            yield gauge
