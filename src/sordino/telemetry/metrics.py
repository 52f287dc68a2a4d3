"""The Prometheus metrics of one runtime, in a registry of its own.

Each :class:`Metrics` owns a ``CollectorRegistry`` so several runtimes (tests) never
share counters. Scheduler statistics (queue depth, in-flight) are read at scrape time
from the parts' ``statistics()``, never mirrored by hand. A model name a client sent
becomes a label value only while that model is loaded (:class:`MetricLabels`); refusals
for any other name are counted under ``model="other"``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sordino.inference import ModelKey
from sordino.records import BatchDone, RequestDone, SchedulerStatistics
from sordino.telemetry.labels import MetricLabels
from sordino.telemetry.tallies import HistogramTally

__all__ = ["LATENCY_BUCKETS", "Metrics"]

# Fine enough below 100 ms for a meaningful p99 of small models, and up to 30 s for diffusion.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class _SchedulerCollector(Collector):
    def __init__(self, source: Callable[[], Iterable[SchedulerStatistics]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "sordino_queue_depth",
            "Requests waiting in the model's queue.",
            labels=["model", "version"],
        )
        inflight = GaugeMetricFamily(
            "sordino_inflight_requests",
            "Requests accepted and not yet finished (queued or running).",
            labels=["model", "version"],
        )
        running = GaugeMetricFamily(
            "sordino_running_batches", "Batches executing now.", labels=["model", "version"]
        )
        max_batch = GaugeMetricFamily(
            "sordino_scheduler_max_batch",
            "The batch size cap the scheduler mode uses now.",
            labels=["model", "version", "mode"],
        )
        delay = GaugeMetricFamily(
            "sordino_scheduler_max_delay_seconds",
            "The batching wait the scheduler mode uses now.",
            labels=["model", "version", "mode"],
        )
        for stats in self._source():
            labels = [stats.model, stats.version]
            depth.add_metric(labels, stats.queue.depth)
            inflight.add_metric(labels, stats.in_flight)
            running.add_metric(labels, stats.running_batches)
            mode_labels = [*labels, stats.controller.effective_mode]
            max_batch.add_metric(mode_labels, stats.controller.max_batch)
            delay.add_metric(mode_labels, stats.controller.max_delay_s)
        yield from (depth, inflight, running, max_batch, delay)


RENDERS_PER_S = 10.0
"""Fresh renders of ``/metrics`` a second at most (and as many in a burst); past it a
request gets the last render, at most ``1 / RENDERS_PER_S`` s old. A render costs 2–4
ms of the serving loop (prometheus_client formats and checks every sample line): four
clients polling it in a loop took inference's p99 from 5 to 67 ms before."""


class Metrics:
    """Request, latency and batch metrics; also a :class:`SchedulerObserver`."""

    def __init__(
        self, labels: MetricLabels, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.labels = labels
        self.registry = CollectorRegistry(auto_describe=True)
        self._clock = clock
        self._last = b""  # the last exposition rendered (exposition)
        self._tokens = RENDERS_PER_S
        self._rendered_at = clock()
        self.requests = Counter(
            "sordino_requests",
            "Requests by model, outcome and reason (rejected = ended before queueing).",
            ["model", "version", "outcome", "reason"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "sordino_rejected_requests",
            "Requests refused before they were accepted, by reason.",
            ["model", "reason"],
            registry=self.registry,
        )
        self.queue_seconds = HistogramTally(
            "sordino_request_queue_seconds",
            "Time a request waited in the queue.",
            "model",
            LATENCY_BUCKETS,
        )
        self.registry.register(self.queue_seconds)
        self.compute_seconds = HistogramTally(
            "sordino_request_compute_seconds",
            "Time the batch holding the request took to run.",
            "model",
            LATENCY_BUCKETS,
        )
        self.registry.register(self.compute_seconds)
        self.total_seconds = HistogramTally(
            "sordino_request_seconds", "Time from acceptance to result.", "model", LATENCY_BUCKETS
        )
        self.registry.register(self.total_seconds)
        self.batch_size = Histogram(
            "sordino_batch_size",
            "Rows per executed batch.",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.batches = Counter(
            "sordino_batches", "Executed batches by outcome.", ["model", "outcome"],
            registry=self.registry,
        )  # fmt: skip
        self._children: dict[tuple[Any, ...], Any] = {}
        self._done_children: dict[tuple[ModelKey, str, str], tuple[Any, ...]] = {}

    def watch_schedulers(self, source: Callable[[], Iterable[SchedulerStatistics]]) -> None:
        """Export queue depth and in-flight counts read from ``source`` at scrape time."""
        self.registry.register(_SchedulerCollector(source))

    def exposition(self) -> bytes:
        """Return the Prometheus text exposition of every metric: rendered now, or, past
        :data:`RENDERS_PER_S` (a token bucket), the last render."""
        now = self._clock()
        tokens = min(RENDERS_PER_S, self._tokens + (now - self._rendered_at) * RENDERS_PER_S)
        self._rendered_at = now
        if tokens >= 1.0 or not self._last:
            tokens -= 1.0
            self._last = generate_latest(self.registry)
        self._tokens = tokens
        return self._last

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    # -- SchedulerObserver -----------------------------------------------------------

    def request_done(self, done: RequestDone) -> None:
        # One dict lookup a request for the four children an outcome touches.
        key = (done.model, done.outcome, done.reason)
        children = self._done_children.get(key)
        if children is None:
            children = self._done_children[key] = self._children_of(*key)
        children[0].inc()
        if len(children) > 1:
            children[1].observe(done.queue_s)
            children[2].observe(done.compute_s)
            children[3].observe(done.total_s)

    def _children_of(self, model: ModelKey, outcome: str, reason: str) -> tuple[Any, ...]:
        """The counter's child of an outcome, and the three histograms' for a success."""
        requests = self._child(self.requests, model.name, model.version, outcome, reason)
        if outcome != "success":
            return (requests,)
        return (
            requests,
            self._child(self.queue_seconds, model.name),
            self._child(self.compute_seconds, model.name),
            self._child(self.total_seconds, model.name),
        )

    def batch_done(self, done: BatchDone) -> None:
        self._child(self.batch_size, done.model.name).observe(done.rows)
        self._child(self.batches, done.model.name, "success" if done.ok else "failure").inc()

    def queue_changed(self, model: ModelKey, depth: int) -> None:
        return None

    def request_rejected(
        self, model: str, reason: str, *, version: str = "", count: int = 1
    ) -> None:
        """Count a request refused before acceptance (bad input, queue full, unknown model).

        It is counted in ``sordino_requests_total`` too (outcome ``rejected``), so that
        family counts every request, as ``sordino_tenant_requests_total`` does. ``model``
        is the name the client sent: labelled ``other`` unless it is loaded. ``count``
        counts that many such requests at once.
        """
        name = self.labels.model(model)
        self._child(self.rejected, name, reason).inc(count)
        served = version if name == model else ""
        self._child(self.requests, name, served, "rejected", reason).inc(count)
