"""Reading a running server's Prometheus counters in tests."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sordino.testing import RunningServer


def counter_sum(
    server: RunningServer,
    family: str,
    where: Callable[[dict[str, str]], bool] = lambda labels: True,
) -> int:
    """The sum of ``family``'s ``_total`` samples in ``server``'s registry whose labels
    pass ``where`` (0 when the family has no sample yet)."""
    text = generate_latest(server.runtime.metrics.registry).decode()
    for metric in text_string_to_metric_families(text):
        if metric.name == family:
            totals = [s for s in metric.samples if s.name.endswith("_total")]
            return sum(int(s.value) for s in totals if where(s.labels))
    return 0
