"""Prometheus metrics of the execution layer, read from its ``statistics()`` at scrape time.

- ``sordino_worker_up{model,version,instance,device,isolation}``: 1 while serving
- ``sordino_worker_restarts_total{...}``: replacements started after a failure
- ``sordino_worker_failures_total{...}``: the instance's failures: each worker death
  (or failed restart) once, however many batches it took, and each batch the model
  failed on a live worker
- ``sordino_batch_retries_total``: batches retried after losing their instance, or
  after the model failed them on an instance (on another one, or on its replacement)
- ``sordino_instance_ejections_total{model,version,instance}`` and
  ``sordino_instance_ejected{...}`` (1 while ejected): outlier ejection
- ``sordino_device_available{device}``, ``sordino_device_breaker_state{device,state}``
  (1 for the current state), ``sordino_device_breaker_opened_total{device}``,
  ``sordino_device_breaker_error_rate{device}`` (over the threshold window)
- ``sordino_device_switches_total{model,from_device,to_device}`` and
  ``sordino_device_switch_seconds`` (sum/count, plus ``_max``): failure to result;
  ``sordino_device_switch_dispatch_seconds``: failure to the hand-over to the next device
- ``sordino_shm_*``: the shared-memory arena (reserved, in use, peak, fragmentation)
- ``sordino_faults_active``, ``sordino_faults_applied_total``
- ``sordino_node_instances{node}`` (serving) and ``sordino_node_batches_total{node}``:
  per Ray node, for instances that run as Ray actors (``executor.kind: ray``)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from sordino.records import ExecutionStatistics

__all__ = ["ExecutionCollector"]

_STATES = ("closed", "open", "half_open")


class ExecutionCollector(Collector):
    """Exports an :class:`ExecutionStatistics` source."""

    def __init__(self, source: Callable[[], ExecutionStatistics]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        stats = self._source()
        labels = ["model", "version", "instance", "device", "isolation"]
        up = GaugeMetricFamily("sordino_worker_up", "1 while the instance serves.", labels=labels)
        restarts = CounterMetricFamily(
            "sordino_worker_restarts", "Instance replacements after a failure.", labels=labels
        )
        failures = CounterMetricFamily(
            "sordino_worker_failures",
            "Worker deaths and failed restarts (each once) and batches failed on a live worker.",
            labels=labels,
        )
        for w in stats.workers:
            values = [w.model, w.version, str(w.index), w.device, w.isolation]
            up.add_metric(values, 1.0 if w.state == "ready" else 0.0)
            restarts.add_metric(values, w.restarts)
            failures.add_metric(values, w.failures)
        yield from (up, restarts, failures)
        outlier_labels = ["model", "version", "instance"]
        ejections = CounterMetricFamily(
            "sordino_instance_ejections",
            "Times the instance was ejected for failing batches that others ran.",
            labels=outlier_labels,
        )
        ejected = GaugeMetricFamily(
            "sordino_instance_ejected", "1 while the instance is ejected.", labels=outlier_labels
        )
        for o in stats.outliers:
            values = [o.model, o.version, str(o.index)]
            ejections.add_metric(values, o.ejections)
            ejected.add_metric(values, 0.0 if o.ejected_until is None else 1.0)
        yield from (ejections, ejected)
        yield from _per_node(stats)
        yield CounterMetricFamily(
            "sordino_batch_retries",
            "Batches retried on another instance or a replacement.",
            stats.retries,
        )
        available = GaugeMetricFamily(
            "sordino_device_available", "1 when the device exists here.", labels=["device"]
        )
        state = GaugeMetricFamily(
            "sordino_device_breaker_state",
            "1 for the breaker's current state.",
            labels=["device", "state"],
        )
        opened = CounterMetricFamily(
            "sordino_device_breaker_opened", "Times the breaker opened.", labels=["device"]
        )
        error_rate = GaugeMetricFamily(
            "sordino_device_breaker_error_rate",
            "Error rate over the breaker's window.",
            labels=["device"],
        )
        for device in stats.devices:
            available.add_metric([device.name], 1.0 if device.available else 0.0)
            if device.breaker is not None:
                for name in _STATES:
                    state.add_metric([device.name, name], float(device.breaker.state == name))
                opened.add_metric([device.name], device.breaker.opened)
                error_rate.add_metric([device.name], device.breaker.error_rate)
        yield from (available, state, opened, error_rate)
        switch_labels = ["model", "from_device", "to_device"]
        switches = CounterMetricFamily(
            "sordino_device_switches",
            "Batches moved to the next device after a failure.",
            labels=switch_labels,
        )
        seconds = SummaryMetricFamily(
            "sordino_device_switch_seconds",
            "Time from a device's failure to the result from the next device.",
            labels=switch_labels,
        )
        dispatch = SummaryMetricFamily(
            "sordino_device_switch_dispatch_seconds",
            "Time from a device's failure to the batch being handed to the next device.",
            labels=switch_labels,
        )
        worst = GaugeMetricFamily(
            "sordino_device_switch_seconds_max", "Longest switch seen.", labels=switch_labels
        )
        for s in stats.switches:
            values = [s.model, s.from_device, s.to_device]
            switches.add_metric(values, s.count)
            seconds.add_metric(values, s.count, s.total_s)
            dispatch.add_metric(values, s.count, s.dispatch_total_s)
            worst.add_metric(values, s.max_s)
        yield from (switches, seconds, dispatch, worst)
        if stats.arena is not None:
            arena = stats.arena
            for name, value, text in (
                ("reserved_bytes", arena.reserved_bytes, "Bytes of the shared-memory arena."),
                ("in_use_bytes", arena.in_use_bytes, "Arena bytes held by tensors now."),
                ("peak_bytes", arena.peak_bytes, "Most arena bytes ever held at once."),
                ("fragmentation", arena.fragmentation, "1 - largest free block / free bytes."),
            ):
                yield GaugeMetricFamily(f"sordino_shm_{name}", text, value)
        yield GaugeMetricFamily("sordino_faults_active", "Injected faults.", stats.faults_active)
        yield CounterMetricFamily(
            "sordino_faults_applied", "Batches hit by an injected fault.", stats.faults_applied
        )


def _per_node(stats: ExecutionStatistics) -> Iterator[Metric]:
    """Serving instances and batches per Ray node; nothing without Ray actors."""
    serving: dict[str, int] = {}
    batches: dict[str, int] = {}
    for w in stats.workers:
        if not w.node:
            continue
        serving[w.node] = serving.get(w.node, 0) + (w.state == "ready")
        batches[w.node] = batches.get(w.node, 0) + w.batches
    if not serving:
        return
    up = GaugeMetricFamily(
        "sordino_node_instances", "Instances serving on the Ray node.", labels=["node"]
    )
    ran = CounterMetricFamily(
        "sordino_node_batches", "Batches run by the Ray node's instances.", labels=["node"]
    )
    for node in sorted(serving):
        up.add_metric([node], serving[node])
        ran.add_metric([node], batches[node])
    yield from (up, ran)
