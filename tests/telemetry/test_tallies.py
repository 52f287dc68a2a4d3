"""A HistogramTally is exposed exactly as prometheus_client's Histogram would be."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from sordino.telemetry.metrics import LATENCY_BUCKETS
from sordino.telemetry.tallies import HistogramTally

VALUES = (0.0001, 0.0005, 0.003, 0.2, 0.2, 50.0, 1.0, 0.0)


def _without_created_values(text: bytes) -> str:
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text.decode())


def test_the_exposition_is_the_histograms_for_the_same_observations() -> None:
    theirs = CollectorRegistry()
    histogram = Histogram("sordino_x_seconds", "How long.", ["model"], buckets=LATENCY_BUCKETS,
                          registry=theirs)  # fmt: skip
    ours = CollectorRegistry()
    tally = HistogramTally("sordino_x_seconds", "How long.", "model", LATENCY_BUCKETS)
    ours.register(tally)
    for model in ("a", "b"):
        for value in VALUES:
            histogram.labels(model).observe(value)
            tally.labels(model).observe(value)
    assert _without_created_values(generate_latest(ours)) == _without_created_values(
        generate_latest(theirs)
    )


def test_a_bound_is_inclusive_and_a_count_counts_that_many() -> None:
    tally = HistogramTally("sordino_y_seconds", "How long.", "model", (0.1, 1.0))
    tally.labels("m").observe(0.1)
    tally.labels("m").observe(1.5, count=3)
    samples = {
        (s.name, s.labels.get("le")): s.value
        for family in tally.collect()
        for s in family.samples
        if s.labels.get("model") == "m"
    }
    assert samples[("sordino_y_seconds_bucket", "0.1")] == 1
    assert samples[("sordino_y_seconds_bucket", "1.0")] == 1
    assert samples[("sordino_y_seconds_bucket", "+Inf")] == 4
    assert samples[("sordino_y_seconds_count", None)] == 4
    assert samples[("sordino_y_seconds_sum", None)] == 0.1 + 4.5
