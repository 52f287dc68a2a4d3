"""A Python model's custom metrics (``triton_python_backend_utils.MetricFamily``).

They are kept in this process; after a batch that changed them the backend calls
:func:`publish_metrics`, which writes their snapshot where the server's ``/metrics``
reads it (``sordino.telemetry.model_metrics``). Every public name is importable from
``triton_python_backend_utils``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from sordino.backends.python.triton_errors import TritonModelException

__all__ = [
    "COUNTER",
    "GAUGE",
    "HISTOGRAM",
    "METRICS_DIR_ENV",
    "Metric",
    "MetricFamily",
    "metric_snapshot",
    "publish_metrics",
]

COUNTER = "COUNTER"
GAUGE = "GAUGE"
HISTOGRAM = "HISTOGRAM"

_METRICS_LOCK = threading.Lock()
_FAMILIES: dict[str, MetricFamily] = {}
_CHANGED = threading.Event()
METRICS_DIR_ENV = "SORDINO_MODEL_METRICS_DIR"
"""Where snapshots go (set by the server; ``sordino.telemetry.model_metrics`` reads them)."""


class MetricFamily:
    """A custom metric family (Triton: shown in ``/metrics``; here, sordino's)."""

    COUNTER = COUNTER
    GAUGE = GAUGE
    HISTOGRAM = HISTOGRAM

    def __init__(self, name: str, description: str, kind: str) -> None:
        if kind not in (COUNTER, GAUGE, HISTOGRAM):
            raise TritonModelException(f"metric kind {kind!r}: use COUNTER, GAUGE or HISTOGRAM")
        with _METRICS_LOCK:
            known = _FAMILIES.get(name)
            if known is not None and known.kind != kind:
                raise TritonModelException(
                    f"metric family {name!r} exists with kind {known.kind}, not {kind}"
                )
            self.name: str = name
            self.kind: str = kind
            self.description: str = known.description if known is not None else description
            self._metrics: dict[tuple[tuple[str, str], ...], Metric] = (
                known._metrics if known is not None else {}
            )
            _FAMILIES.setdefault(name, self)

    def Metric(
        self, labels: Mapping[str, str] | None = None, buckets: Sequence[float] | None = None
    ) -> Metric:
        key = tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items()))
        with _METRICS_LOCK:
            metric = self._metrics.get(key)
            if metric is None:
                if self.kind == HISTOGRAM and not buckets:
                    raise TritonModelException("a HISTOGRAM metric needs buckets")
                metric = self._metrics[key] = Metric(self.kind, dict(key), buckets)
        return metric


class Metric:
    """One labelled series of a :class:`MetricFamily`."""

    def __init__(self, kind: str, labels: dict[str, str], buckets: Sequence[float] | None) -> None:
        self.kind, self.labels = kind, labels
        self.buckets = sorted(buckets or ())
        self._value = 0.0
        self._counts = [0] * (len(self.buckets) + 1)
        self._sum = 0.0

    def increment(self, value: float) -> None:
        if self.kind == HISTOGRAM:
            raise TritonModelException("increment is not supported for a HISTOGRAM metric")
        if self.kind == COUNTER and value < 0:
            raise TritonModelException("a COUNTER cannot be incremented by a negative value")
        with _METRICS_LOCK:
            self._value += value
        _CHANGED.set()

    def set(self, value: float) -> None:
        if self.kind != GAUGE:
            raise TritonModelException("set is only supported for a GAUGE metric")
        with _METRICS_LOCK:
            self._value = float(value)
        _CHANGED.set()

    def observe(self, value: float) -> None:
        if self.kind != HISTOGRAM:
            raise TritonModelException("observe is only supported for a HISTOGRAM metric")
        with _METRICS_LOCK:
            index = next((i for i, b in enumerate(self.buckets) if value <= b), len(self.buckets))
            self._counts[index] += 1
            self._sum += value
        _CHANGED.set()

    def value(self) -> float:
        if self.kind == HISTOGRAM:
            raise TritonModelException("value is not supported for a HISTOGRAM metric")
        return self._value

    def state(self) -> dict[str, Any]:
        with _METRICS_LOCK:
            if self.kind == HISTOGRAM:
                return {"buckets": self.buckets, "counts": list(self._counts), "sum": self._sum}
            return {"value": self._value}


def metric_snapshot() -> list[dict[str, Any]]:
    """Every custom metric of this process: family, kind, description, series."""
    return [
        {
            "name": family.name,
            "kind": family.kind,
            "description": family.description,
            "series": [{"labels": m.labels, **m.state()} for m in family._metrics.values()],
        }
        for family in list(_FAMILIES.values())
    ]


def publish_metrics() -> None:
    """Write this process's metrics snapshot for the server, if any changed since the last.

    The file (``<pid>.json`` in the folder the server named) is replaced atomically, so
    a scrape never reads half of it. Without a folder (no server) nothing is written.
    """
    folder = os.environ.get(METRICS_DIR_ENV)
    if not folder or not _CHANGED.is_set():
        return
    _CHANGED.clear()
    path = os.path.join(folder, f"{os.getpid()}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as out:
        json.dump(metric_snapshot(), out)
    os.replace(path + ".tmp", path)
