"""Prometheus metrics of the memory manager, read from its ``statistics()`` at scrape time.

- ``sordino_memory_tier_{reserved,in_use,peak,largest_free}_bytes{tier,lifetime}`` and
  ``sordino_memory_tier_fragmentation_ratio{tier,lifetime}`` (fragmentation_aware)
- ``sordino_memory_owner_{in_use,peak,quota}_bytes{owner}``,
  ``sordino_memory_quota_waits_total{owner}``, ``sordino_memory_quota_rejections_total{owner}``
  (owners are configured tenants, ``default`` and ``other``: a bounded label)
- ``sordino_memory_overflow_{shrinks,waits,rejections,oversized}_total``
- ``sordino_memory_defrag_runs_total``, ``sordino_memory_defrag_bytes_moved_total``,
  ``sordino_memory_defrag_pause_seconds_total``, ``sordino_memory_defrag_last_pause_seconds``
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sordino.records import MemoryStatistics

__all__ = ["MemoryCollector"]


class MemoryCollector(Collector):
    """Exports a :class:`MemoryStatistics` source."""

    def __init__(self, source: Callable[[], MemoryStatistics]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        stats = self._source()
        tier_labels = ["tier", "lifetime"]
        tier_families = {
            name: GaugeMetricFamily(f"sordino_memory_tier_{name}", text, labels=tier_labels)
            for name, text in (
                ("reserved_bytes", "Arena bytes the tier's chunks hold."),
                ("in_use_bytes", "Bytes of the tier handed out."),
                ("peak_bytes", "Highest in_use_bytes of the tier."),
                ("largest_free_bytes", "Largest free block inside the tier's chunks."),
                ("fragmentation_ratio", "1 - largest free / free, inside the tier's chunks."),
            )
        }
        for tier in stats.tiers:
            values = [tier.tier, tier.lifetime]
            tier_families["reserved_bytes"].add_metric(values, tier.reserved_bytes)
            tier_families["in_use_bytes"].add_metric(values, tier.in_use_bytes)
            tier_families["peak_bytes"].add_metric(values, tier.peak_bytes)
            tier_families["largest_free_bytes"].add_metric(values, tier.largest_free)
            tier_families["fragmentation_ratio"].add_metric(values, tier.fragmentation)
        yield from tier_families.values()
        owner = ["owner"]
        in_use = GaugeMetricFamily(
            "sordino_memory_owner_in_use_bytes",
            "Arena bytes in flight.",
            labels=owner,
        )
        peak = GaugeMetricFamily(
            "sordino_memory_owner_peak_bytes",
            "Highest bytes in flight.",
            labels=owner,
        )
        quota = GaugeMetricFamily(
            "sordino_memory_owner_quota_bytes", "The owner's quota (memory.quotas).", labels=owner
        )
        waits = CounterMetricFamily(
            "sordino_memory_quota_waits", "Requests that waited for their quota.", labels=owner
        )
        refused = CounterMetricFamily(
            "sordino_memory_quota_rejections", "Requests refused by their quota.", labels=owner
        )
        for o in stats.owners:
            in_use.add_metric([o.owner], o.in_use_bytes)
            peak.add_metric([o.owner], o.peak_bytes)
            if o.quota_bytes is not None:
                quota.add_metric([o.owner], o.quota_bytes)
            waits.add_metric([o.owner], o.waits)
            refused.add_metric([o.owner], o.rejections)
        yield from (in_use, peak, quota, waits, refused)
        for name, value, text in (
            ("shrinks", stats.overflow_shrinks, "Batches shrunk to fit the arena."),
            ("waits", stats.overflow_waits, "Batches that waited for arena space."),
            ("rejections", stats.overflow_rejections, "Requests answered 503: arena full."),
            ("oversized", stats.oversized_rejections, "Requests larger than the whole arena."),
        ):
            yield CounterMetricFamily(f"sordino_memory_overflow_{name}", text, value)
        yield CounterMetricFamily(
            "sordino_memory_defrag_runs", "Defragmentation runs.", stats.defrag_runs
        )
        yield CounterMetricFamily(
            "sordino_memory_defrag_bytes_moved", "Bytes moved by defragmentation.",
            stats.defrag_bytes_moved,
        )  # fmt: skip
        yield CounterMetricFamily(
            "sordino_memory_defrag_pause_seconds", "Event-loop pause of every defrag run.",
            stats.defrag_pause_s,
        )  # fmt: skip
        last = stats.last_defrag
        yield GaugeMetricFamily(
            "sordino_memory_defrag_last_pause_seconds", "Pause of the last defrag run.",
            last.pause_s if last is not None else 0.0,
        )  # fmt: skip
