"""Prometheus metrics of the memory manager, read from its ``statistics()`` at scrape time.

- ``sordino_memory_tier_{reserved,in_use,peak,largest_free}_bytes{tier,lifetime}`` and
  ``sordino_memory_tier_fragmentation_ratio{tier,lifetime}`` (fragmentation_aware)
- ``sordino_memory_owner_{in_use,peak,quota}_bytes{owner}``,
  ``sordino_memory_quota_waits_total{owner}``, ``sordino_memory_quota_rejections_total{owner}``
  (owners are configured tenants, ``default`` and ``other``: a bounded label)
- ``sordino_memory_model_pool_{in_use,peak,quota}_bytes{model}``,
  ``sordino_memory_model_pool_{waits,rejections}_total{model}``: the node pools
  (``nodes[].runtime.memory_pool``; only configured models: a bounded label)
- ``sordino_memory_overflow_{shrinks,waits,rejections,oversized}_total``
- ``sordino_memory_defrag_runs_total``, ``sordino_memory_defrag_bytes_moved_total``,
  ``sordino_memory_defrag_pause_seconds_total``, ``sordino_memory_defrag_last_pause_seconds``
- ``sordino_memory_pool_{capacity,target,predicted_peak}_bytes``,
  ``sordino_memory_pool_resizes_total``, ``sordino_memory_pool_resizes_deferred_total``
  (pool_size auto: the prediction next to reality)
- ``sordino_memory_worker_rss_bytes{model,version,instance}`` (a worker process's
  resident memory: its ONNX Runtime arenas included; ONNX Runtime does not expose the
  arena's size), ``sordino_memory_worker_gpu_present{model,version,instance}`` (0: the
  CUDA provider is absent), ``sordino_memory_worker_gpu_bytes{...}`` (NVML, only
  with the CUDA provider)
- ``sordino_memory_plan_{planned_peak,naive,max_planned_peak,region,region_peak}_bytes{model}``
  and ``sordino_memory_plan_region_fallbacks{model}`` (tensor lifetime planning of
  multi-step models, and the region their outputs really used)
- ``sordino_memory_compaction_{steps,bytes_moved,pause_seconds}_total`` (incremental
  compaction at batch boundaries)
- ``sordino_memory_node_{reserved,in_use,peak,largest_free}_bytes{node}``,
  ``sordino_memory_node_fragmentation_ratio{node}``,
  ``sordino_memory_node_{overflow_waits,overflow_rejections}_total{node}``,
  ``sordino_memory_node_owner_{in_use,peak,quota}_bytes{node,owner}`` and
  ``sordino_memory_node_quota_{waits,rejections}_total{node,owner}``: each Ray node's
  pool (``executor.kind: ray``; ``node`` is the Ray node id, as in ``sordino_node_*``)
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
        yield from _model_pools(stats)
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
        yield from _pool(stats)
        yield from _workers(stats)
        yield from _plans(stats)
        yield from _nodes(stats)


def _pool(stats: MemoryStatistics) -> Iterator[Metric]:
    pool = stats.pool
    if pool is None:
        return
    yield GaugeMetricFamily(
        "sordino_memory_pool_capacity_bytes", "The arena's size now.", pool.capacity_bytes
    )
    if pool.target_bytes is not None:
        yield GaugeMetricFamily(
            "sordino_memory_pool_target_bytes", "pool_size auto's target.", pool.target_bytes
        )
    if pool.predicted_peak_bytes is not None:
        yield GaugeMetricFamily(
            "sordino_memory_pool_predicted_peak_bytes",
            "Arena bytes in flight at the forecast's peak (Little's law).",
            pool.predicted_peak_bytes,
        )
    yield CounterMetricFamily(
        "sordino_memory_pool_resizes", "Arena segments replaced.", pool.resizes
    )
    yield CounterMetricFamily(
        "sordino_memory_pool_resizes_deferred",
        "Resizes put off: no quiet moment came.",
        pool.deferred,
    )


def _workers(stats: MemoryStatistics) -> Iterator[Metric]:
    labels = ["model", "version", "instance"]
    rss = GaugeMetricFamily(
        "sordino_memory_worker_rss_bytes",
        "A worker process's resident memory (its ONNX Runtime arenas included).",
        labels=labels,
    )
    gpu = GaugeMetricFamily(
        "sordino_memory_worker_gpu_present",
        "1 when the worker's model runs with the CUDA provider, 0 when it is absent.",
        labels=labels,
    )
    gpu_bytes = GaugeMetricFamily(
        "sordino_memory_worker_gpu_bytes",
        "GPU memory a worker process holds (NVML); only where the CUDA provider is used.",
        labels=labels,
    )
    for worker in stats.workers:
        values = [worker.model, worker.version, str(worker.instance)]
        if worker.rss_bytes is not None:
            rss.add_metric(values, worker.rss_bytes)
        gpu.add_metric(values, 0 if worker.gpu == "absent" else 1)
        if worker.gpu_bytes is not None:
            gpu_bytes.add_metric(values, worker.gpu_bytes)
    yield from (rss, gpu, gpu_bytes)


def _plans(stats: MemoryStatistics) -> Iterator[Metric]:
    families = {
        name: GaugeMetricFamily(f"sordino_memory_plan_{name}_bytes", text, labels=["model"])
        for name, text in (
            ("planned_peak", "The last request's steps laid out in one region (greedy by size)."),
            ("naive", "The last request's step tensors summed, none reused."),
            ("max_planned_peak", "The largest planned region of any request."),
            ("region", "The last request's output region as reserved (its plan)."),
            ("region_peak", "The most bytes of that region its steps used at once."),
        )
    }
    fallbacks = GaugeMetricFamily(
        "sordino_memory_plan_region_fallbacks",
        "Output blocks of the last request that did not fit its region.",
        labels=["model"],
    )
    for plan in stats.plans:
        families["planned_peak"].add_metric([plan.model], plan.planned_peak_bytes)
        families["naive"].add_metric([plan.model], plan.naive_bytes)
        families["max_planned_peak"].add_metric([plan.model], plan.max_planned_peak_bytes)
        families["region"].add_metric([plan.model], plan.region_bytes)
        families["region_peak"].add_metric([plan.model], plan.region_peak_bytes)
        fallbacks.add_metric([plan.model], plan.region_fallbacks)
    yield from families.values()
    yield fallbacks
    compaction = stats.compaction
    if compaction is not None:
        yield CounterMetricFamily(
            "sordino_memory_compaction_steps",
            "Batch boundaries that ran a step of incremental compaction.",
            compaction.steps,
        )
        yield CounterMetricFamily(
            "sordino_memory_compaction_bytes_moved",
            "Bytes moved by incremental compaction.",
            compaction.bytes_moved,
        )
        yield CounterMetricFamily(
            "sordino_memory_compaction_pause_seconds",
            "Event-loop pause of every compaction step.",
            compaction.pause_s,
        )


def _model_pools(stats: MemoryStatistics) -> Iterator[Metric]:
    if not stats.pools:
        return
    model = ["model"]
    families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        "in_use": GaugeMetricFamily(
            "sordino_memory_model_pool_in_use_bytes", "Node pool bytes in flight.", labels=model
        ),
        "peak": GaugeMetricFamily(
            "sordino_memory_model_pool_peak_bytes", "Highest node pool bytes in flight.",
            labels=model,
        ),
        "quota": GaugeMetricFamily(
            "sordino_memory_model_pool_quota_bytes", "The node's memory_pool.", labels=model
        ),
        "waits": CounterMetricFamily(
            "sordino_memory_model_pool_waits", "Requests that waited for the node pool.",
            labels=model,
        ),
        "rejections": CounterMetricFamily(
            "sordino_memory_model_pool_rejections", "Requests refused by the node pool.",
            labels=model,
        ),
    }  # fmt: skip
    for p in stats.pools:
        families["in_use"].add_metric([p.owner], p.in_use_bytes)
        families["peak"].add_metric([p.owner], p.peak_bytes)
        families["quota"].add_metric([p.owner], p.quota_bytes or 0)
        families["waits"].add_metric([p.owner], p.waits)
        families["rejections"].add_metric([p.owner], p.rejections)
    yield from families.values()


def _nodes(stats: MemoryStatistics) -> Iterator[Metric]:
    node = ["node"]
    pool = {
        name: GaugeMetricFamily(f"sordino_memory_node_{name}", text, labels=node)
        for name, text in (
            ("reserved_bytes", "The Ray node pool's size."),
            ("in_use_bytes", "Bytes of the node pool held by running batches."),
            ("peak_bytes", "Highest in_use_bytes of the node pool."),
            ("largest_free_bytes", "Largest free block of the node pool."),
            ("fragmentation_ratio", "1 - largest free / free, in the node pool."),
        )
    }
    waits = CounterMetricFamily(
        "sordino_memory_node_overflow_waits",
        "Batches that waited for node pool space.",
        labels=node,
    )
    refused = CounterMetricFamily(
        "sordino_memory_node_overflow_rejections",
        "Batches answered 503: the node pool stayed full.",
        labels=node,
    )
    owner = ["node", "owner"]
    owners = {
        name: GaugeMetricFamily(f"sordino_memory_node_owner_{name}_bytes", text, labels=owner)
        for name, text in (
            ("in_use", "The owner's bytes in flight in the node pool."),
            ("peak", "The owner's highest bytes in flight in the node pool."),
            ("quota", "The owner's quota in each node pool (memory.quotas)."),
        )
    }
    quota_waits = CounterMetricFamily(
        "sordino_memory_node_quota_waits",
        "Batches that waited for a quota on the node.",
        labels=owner,
    )
    quota_refused = CounterMetricFamily(
        "sordino_memory_node_quota_rejections",
        "Batches refused by a quota on the node.",
        labels=owner,
    )
    for n in stats.nodes:
        arena = n.arena
        pool["reserved_bytes"].add_metric([n.node], arena.reserved_bytes)
        pool["in_use_bytes"].add_metric([n.node], arena.in_use_bytes)
        pool["peak_bytes"].add_metric([n.node], arena.peak_bytes)
        pool["largest_free_bytes"].add_metric([n.node], arena.largest_free)
        pool["fragmentation_ratio"].add_metric([n.node], arena.fragmentation)
        waits.add_metric([n.node], n.overflow_waits)
        refused.add_metric([n.node], n.overflow_rejections)
        for o in n.owners:
            values = [n.node, o.owner]
            owners["in_use"].add_metric(values, o.in_use_bytes)
            owners["peak"].add_metric(values, o.peak_bytes)
            if o.quota_bytes is not None:
                owners["quota"].add_metric(values, o.quota_bytes)
            quota_waits.add_metric(values, o.waits)
            quota_refused.add_metric(values, o.rejections)
    yield from pool.values()
    yield from (waits, refused, *owners.values(), quota_waits, quota_refused)
