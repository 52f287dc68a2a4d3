"""Prometheus metrics of the configured tenants, read at scrape time.

- ``sordino_tenant_in_flight{tenant}``: requests holding a slot now
- ``sordino_tenant_weight{tenant}``: its fair-share weight
- ``sordino_tenant_admitted_total{tenant}``: requests past the tenant's limits
- ``sordino_tenant_refused_total{tenant,limit}``: refused by ``rate``,
  ``concurrency`` or ``breaker``
- ``sordino_tenant_breaker_open{tenant}`` (1 while open) and
  ``sordino_tenant_breaker_trips_total{tenant}``

Only configured tenants appear (a bounded label set). A tenant's key reads only its own
series (``server/auth.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sordino.records import TenantStatistics

__all__ = ["TenantCollector"]


class TenantCollector(Collector):
    """Exports a source of :class:`TenantStatistics`."""

    def __init__(self, source: Callable[[], Sequence[TenantStatistics]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        stats = self._source()
        tenant = ["tenant"]
        in_flight = GaugeMetricFamily(
            "sordino_tenant_in_flight", "Requests of the tenant in flight.", labels=tenant
        )
        weight = GaugeMetricFamily(
            "sordino_tenant_weight", "The tenant's fair-share weight.", labels=tenant
        )
        admitted = CounterMetricFamily(
            "sordino_tenant_admitted", "Requests past the tenant's limits.", labels=tenant
        )
        refused = CounterMetricFamily(
            "sordino_tenant_refused",
            "Requests refused by the tenant's rate, concurrency or breaker.",
            labels=["tenant", "limit"],
        )
        breaker = GaugeMetricFamily(
            "sordino_tenant_breaker_open", "1 while the tenant's breaker is open.", labels=tenant
        )
        trips = CounterMetricFamily(
            "sordino_tenant_breaker_trips", "Times the tenant's breaker opened.", labels=tenant
        )
        for s in stats:
            in_flight.add_metric([s.tenant], s.in_flight)
            weight.add_metric([s.tenant], s.weight)
            admitted.add_metric([s.tenant], s.admitted)
            refused.add_metric([s.tenant, "rate"], s.refused_rate)
            refused.add_metric([s.tenant, "concurrency"], s.refused_concurrency)
            refused.add_metric([s.tenant, "breaker"], s.refused_breaker)
            breaker.add_metric([s.tenant], 1.0 if s.breaker_open else 0.0)
            trips.add_metric([s.tenant], s.breaker_trips)
        yield from (in_flight, weight, admitted, refused, breaker, trips)
