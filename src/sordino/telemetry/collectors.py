"""Prometheus families read at scrape time from the telemetry hub's records.

Resources, worker busy fraction, SLO attainment, forecasts, the last operator
profile of each model and the journal writer's state: each is read from a frozen
record when Prometheus scrapes, never mirrored by hand. A figure the machine does
not have (no GPU, no sensor, no pool, no forecast yet) yields no sample at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sordino.telemetry.forecast import Forecast
from sordino.telemetry.journal import JournalStatistics
from sordino.telemetry.profile_data import OperatorProfile
from sordino.telemetry.resources import ResourceSample
from sordino.telemetry.series import SecondRow
from sordino.telemetry.utilisation import UtilisationSample

__all__ = ["TelemetryCollector", "TelemetryView"]


@dataclass(frozen=True, slots=True)
class TelemetryView:
    """What the collector exports, gathered by the hub at scrape time."""

    last_rows: list[SecondRow]
    slo: dict[tuple[str, str], tuple[float, float | None]]  # target s, attainment
    resources: ResourceSample | None
    forecast: Forecast | None
    profiles: dict[str, OperatorProfile] = field(default_factory=dict)
    journal: JournalStatistics | None = None
    utilisation: UtilisationSample | None = None


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels or [])


class TelemetryCollector(Collector):
    """Exports a :class:`TelemetryView` taken from ``source`` at each scrape."""

    def __init__(self, source: Callable[[], TelemetryView]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        view = self._source()
        yield from self._execution(view)
        if view.utilisation is not None:
            yield from self._utilisation(view.utilisation)
        if view.resources is not None:
            yield from self._resources(view.resources)
        yield from self._forecast(view.forecast)
        yield from self._profiles(view.profiles)
        if view.journal is not None:
            yield from self._journal(view.journal)

    def _execution(self, view: TelemetryView) -> Iterator[Metric]:
        busy = _gauge(
            "sordino_worker_busy_ratio",
            "Share of the model's instances' time spent running batches in the last second.",
            ["model", "version"],
        )
        for row in view.last_rows:
            busy.add_metric([row.model, row.version], row.busy)
        target = _gauge(
            "sordino_slo_target_seconds",
            "The p99 latency target (slo_p99_ms).",
            ["model", "version"],
        )
        attained = _gauge(
            "sordino_slo_attainment_ratio",
            "Share of the last minute's requests answered within the SLO (errors count as misses).",
            ["model", "version"],
        )
        for (model, version), (slo_s, ratio) in view.slo.items():
            target.add_metric([model, version], slo_s)
            if ratio is not None:
                attained.add_metric([model, version], ratio)
        yield from (busy, target, attained)

    def _utilisation(self, sample: UtilisationSample) -> Iterator[Metric]:
        total = CounterMetricFamily(
            "sordino_bandwidth_bytes",
            "Bytes moved by path: arena (inputs copied into the shared-memory arena), "
            "worker_hop (inputs read and outputs written by worker processes).",
            labels=["path"],
        )
        rate = _gauge(
            "sordino_bandwidth_bytes_per_second",
            "Bytes moved in the last second, by path.",
            ["path"],
        )
        for path, value in sample.bytes_total.items():
            total.add_metric([path], value)
            rate.add_metric([path], sample.bytes_s.get(path, 0.0))
        yield from (total, rate)
        if sample.capacity_bytes_s is not None:
            capacity = _gauge(
                "sordino_bandwidth_capacity_bytes_per_second",
                "The machine's memory copy bandwidth, measured once at start-up.",
            )
            capacity.add_metric([], sample.capacity_bytes_s)
            yield capacity
        if sample.saturation is not None:
            saturation = _gauge(
                "sordino_bandwidth_saturation_ratio",
                "Bytes moved per second (every path) over the measured copy bandwidth.",
            )
            saturation.add_metric([], sample.saturation)
            yield saturation
        labels = ["model", "version", "instance", "device"]
        busy = _gauge(
            "sordino_instance_busy_ratio",
            "Share of the last second the instance spent running batches (on a GPU: its "
            "stream's utilisation; each instance has its own session and stream).",
            labels,
        )
        busy_s = CounterMetricFamily(
            "sordino_instance_busy_seconds",
            "Seconds the instance has spent running batches (rate() gives its busy share).",
            labels=labels,
        )
        for instance in sample.instances:
            values = [instance.model, instance.version, str(instance.index), instance.device]
            busy.add_metric(values, instance.busy)
            busy_s.add_metric(values, instance.busy_s)
        yield from (busy, busy_s)

    def _resources(self, sample: ResourceSample) -> Iterator[Metric]:
        rss = _gauge("sordino_process_resident_memory_bytes", "Resident memory of the server.")
        rss.add_metric([], sample.rss_bytes)
        cpu = _gauge("sordino_process_cpu_ratio", "CPU time of the server per wall second.")
        cpu.add_metric([], sample.cpu_percent / 100.0)
        yield from (rss, cpu)
        if sample.cpu_temp_c is not None:
            temp = _gauge("sordino_cpu_temperature_celsius", "CPU package temperature.")
            temp.add_metric([], sample.cpu_temp_c)
            yield temp
        if sample.pools:
            reserved = _gauge(
                "sordino_memory_pool_reserved_bytes", "Bytes the pool holds.", ["pool"]
            )
            in_use = _gauge(
                "sordino_memory_pool_in_use_bytes", "Bytes handed out by the pool.", ["pool"]
            )
            frag = _gauge(
                "sordino_memory_pool_fragmentation_ratio",
                "1 - largest free block / total free bytes.",
                ["pool"],
            )
            for pool in sample.pools:
                if pool.reserved_bytes is not None:
                    reserved.add_metric([pool.name], pool.reserved_bytes)
                if pool.in_use_bytes is not None:
                    in_use.add_metric([pool.name], pool.in_use_bytes)
                if pool.fragmentation is not None:
                    frag.add_metric([pool.name], pool.fragmentation)
            yield from (reserved, in_use, frag)
        if sample.gpus:
            families = {
                "memory_used_bytes": _gauge(
                    "sordino_gpu_memory_used_bytes", "GPU memory in use.", ["gpu", "name"]
                ),
                "memory_total_bytes": _gauge(
                    "sordino_gpu_memory_total_bytes", "GPU memory size.", ["gpu", "name"]
                ),
                "temperature_c": _gauge(
                    "sordino_gpu_temperature_celsius", "GPU die temperature.", ["gpu", "name"]
                ),
                "power_w": _gauge("sordino_gpu_power_watts", "GPU board power.", ["gpu", "name"]),
                "utilization": _gauge(
                    "sordino_gpu_utilization_ratio", "GPU busy share (NVML).", ["gpu", "name"]
                ),
            }
            for gpu in sample.gpus:
                for attr, family in families.items():
                    value = getattr(gpu, attr)
                    if value is not None:
                        family.add_metric([str(gpu.index), gpu.name], value)
            yield from families.values()

    def _forecast(self, forecast: Forecast | None) -> Iterator[Metric]:
        qps = _gauge(
            "sordino_forecast_qps",
            "Forecast requests per second over the next hour, from the journal history.",
            ["model", "statistic"],
        )
        memory = _gauge(
            "sordino_forecast_memory_bytes",
            "Forecast server memory over the next hour, from the journal history.",
            ["statistic"],
        )
        if forecast is not None:
            for model, series in forecast.qps.items():
                qps.add_metric([model, "mean"], series.mean)
                qps.add_metric([model, "peak"], series.peak)
            if forecast.memory is not None:
                memory.add_metric(["mean"], forecast.memory.mean)
                memory.add_metric(["peak"], forecast.memory.peak)
        yield from (qps, memory)

    def _profiles(self, profiles: dict[str, OperatorProfile]) -> Iterator[Metric]:
        seconds = _gauge(
            "sordino_operator_seconds",
            "Time per operator type in the model's last profile (sordino profile).",
            ["model", "op"],
        )
        calls = _gauge(
            "sordino_operator_calls", "Operator executions in the last profile.", ["model", "op"]
        )
        launches = _gauge(
            "sordino_kernel_launches",
            "Device kernel launches in the last profile, where the provider reports them.",
            ["model"],
        )
        for model, profile in profiles.items():
            for op in profile.operators:
                seconds.add_metric([model, op.op], op.total_ms / 1000)
                calls.add_metric([model, op.op], op.calls)
            if profile.kernel_launches is not None:
                launches.add_metric([model], profile.kernel_launches)
        yield from (seconds, calls, launches)

    def _journal(self, stats: JournalStatistics) -> Iterator[Metric]:
        rows = CounterMetricFamily(
            "sordino_journal_rows_written", "Series rows committed to the journal."
        )
        rows.add_metric([], stats.rows_written)
        events = CounterMetricFamily(
            "sordino_journal_events_written", "Events committed to the journal."
        )
        events.add_metric([], stats.events_written)
        failures = CounterMetricFamily(
            "sordino_journal_write_failures", "Journal transactions that failed."
        )
        failures.add_metric([], stats.failures)
        lost = CounterMetricFamily(
            "sordino_journal_items_lost",
            "Series seconds and events dropped because their journal write failed.",
        )
        lost.add_metric([], stats.items_lost)
        pending = _gauge("sordino_journal_pending_items", "Items queued for the journal writer.")
        pending.add_metric([], stats.pending)
        yield from (rows, events, failures, lost, pending)
