"""Request histograms that sordino counts itself and Prometheus reads at scrape time.

``prometheus_client``'s ``Histogram.observe`` takes a lock, checks observability and
updates a sum and a bucket through value objects: ~0.8 µs, three times for every request
that succeeds (queue, compute and total time), on the engine's one loop. A
:class:`HistogramTally` keeps plain counts instead (a bisect and two additions, ~0.15 µs)
and is exported through the client's public custom-collector API in the same exposition
as a ``Histogram`` of the same name, buckets and labels (the ``_bucket``, ``_count`` and
``_sum`` samples and the ``_created`` gauge). Observations happen on the event loop's
thread; a scrape on another thread reads counts that may be one observation apart
between buckets, as a ``Histogram``'s may.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["HistogramTally", "Tally"]


class Tally:
    """One label set's counts: per bucket (the last is ``+Inf``), their sum, when created."""

    __slots__ = ("_bounds", "counts", "created", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.created = time.time()

    def observe(self, value: float, count: int = 1) -> None:
        """Count ``count`` observations of ``value`` (a bucket's bound is inclusive)."""
        self.counts[bisect_left(self._bounds, value)] += count
        self.total += value * count


class HistogramTally(Collector):
    """A histogram family labelled by one label, exported as ``Histogram`` would be."""

    def __init__(self, name: str, documentation: str, label: str, buckets: Sequence[float]):
        self.name = name
        self.documentation = documentation
        self.label = label
        self.bounds = tuple(float(b) for b in buckets)
        # As Histogram writes its bounds (the same ``le`` strings).
        les = [str(floatToGoString(b)) for b in self.bounds]  # type: ignore[no-untyped-call]
        self._les = [*les, "+Inf"]
        self._tallies: dict[str, Tally] = {}

    def labels(self, value: str) -> Tally:
        """The tally of ``value`` (made at its first use, as a ``Histogram``'s child)."""
        tally = self._tallies.get(value)
        if tally is None:
            tally = self._tallies[value] = Tally(self.bounds)
        return tally

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        created = GaugeMetricFamily(f"{self.name}_created", self.documentation, labels=[self.label])
        for value, tally in list(self._tallies.items()):
            cumulative, buckets = 0, []
            for le, count in zip(self._les, list(tally.counts), strict=True):
                cumulative += count
                buckets.append((le, float(cumulative)))
            family.add_metric([value], buckets, tally.total)
            created.add_metric([value], tally.created)
        yield family
        yield created
