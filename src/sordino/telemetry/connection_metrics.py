"""Prometheus metrics of the HTTP listener's connections, read at scrape time.

- ``sordino_http_connections``: open now; ``sordino_http_connections_limit{scope}``:
  ``total`` and ``per_client``
- ``sordino_http_connections_refused_total{scope}``: refused at a limit
- ``sordino_http_timeouts_total{phase}``: closed for headers (``header``) or a body
  (``body``) that did not arrive in time

With ``server.frontends`` N > 1 the source sums every process's figures
(``server/connection_tally.py``): the limits are then N × each setting, each front end
applying it on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sordino.records import ConnectionStatistics

__all__ = ["ConnectionCollector"]


class ConnectionCollector(Collector):
    """Exports a :class:`ConnectionStatistics` source."""

    def __init__(self, source: Callable[[], ConnectionStatistics]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        stats = self._source()
        yield GaugeMetricFamily(
            "sordino_http_connections",
            "Open HTTP connections (with front-end processes: summed over them and the engine).",
            value=stats.open,
        )
        limit = GaugeMetricFamily(
            "sordino_http_connections_limit",
            "Open HTTP connections allowed, in total and per client address (with N "
            "front-end processes, each applying the limit on its own: N times the setting).",
            labels=["scope"],
        )
        limit.add_metric(["total"], stats.max_connections)
        limit.add_metric(["per_client"], stats.max_connections_per_client)
        yield limit
        refused = CounterMetricFamily(
            "sordino_http_connections_refused",
            "New HTTP connections answered 503 at a limit.",
            labels=["scope"],
        )
        refused.add_metric(["total"], stats.refused_total)
        refused.add_metric(["per_client"], stats.refused_per_client)
        yield refused
        timeouts = CounterMetricFamily(
            "sordino_http_timeouts",
            "HTTP connections closed because a request's headers or body came too slowly.",
            labels=["phase"],
        )
        timeouts.add_metric(["header"], stats.header_timeouts)
        timeouts.add_metric(["body"], stats.body_timeouts)
        yield timeouts
