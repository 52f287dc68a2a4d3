"""``/metrics`` is rendered at most RENDERS_PER_S times a second; past it, the last render.

A render costs milliseconds of the serving loop (prometheus_client formats and checks
every sample line); before, four clients polling ``/metrics`` in a loop rendered it
~270 times a second and took inference's p99 from 5 to 67 ms.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sordino.config import RuntimeConfig
from sordino.models.repository import builtin_sources
from sordino.telemetry.labels import MetricLabels
from sordino.telemetry.metrics import RENDERS_PER_S, Metrics
from sordino.testing import serve_in_thread
from tests.conftest import thread_isolated


class _Counting(Collector):
    """A gauge whose value is the number of times it was collected."""

    def __init__(self) -> None:
        self.collected = 0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.collected += 1
        yield GaugeMetricFamily("renders_seen", "collections so far", value=self.collected)


def test_a_burst_of_scrapes_renders_at_most_the_bucket_and_then_the_rate() -> None:
    clock = [1000.0]
    metrics = Metrics(MetricLabels(lambda _name: True), clock=lambda: clock[0])
    counting = _Counting()
    metrics.registry.register(counting)  # collected once to describe it
    texts = [metrics.exposition() for _ in range(50)]  # at one instant
    assert counting.collected == 1 + RENDERS_PER_S
    assert texts[-1] == texts[int(RENDERS_PER_S) - 1]  # the last render, repeated
    assert b"renders_seen 11.0" in texts[-1]
    clock[0] += 1 / RENDERS_PER_S  # one render's worth of time later: a fresh one
    assert b"renders_seen 12.0" in metrics.exposition()
    assert b"renders_seen 12.0" in metrics.exposition()  # and none more yet
    clock[0] += 60  # an idle minute refills the bucket, no more
    for _ in range(50):
        metrics.exposition()
    assert counting.collected == 12 + RENDERS_PER_S


def test_scrapes_in_a_loop_get_answers_without_a_render_each() -> None:
    sources = thread_isolated([s for s in builtin_sources() if s.name == "simple"])
    with serve_in_thread(RuntimeConfig(), sources) as running:
        counting = _Counting()
        running.runtime.metrics.registry.register(counting)
        counting.collected = 0
        began = time.monotonic()
        with httpx.Client(base_url=running.url, timeout=10) as client:
            for _ in range(100):
                response = client.get("/metrics")
                assert response.status_code == 200
                assert b"sordino_" in response.content
        elapsed = time.monotonic() - began
    assert counting.collected <= RENDERS_PER_S + elapsed * RENDERS_PER_S + 1
