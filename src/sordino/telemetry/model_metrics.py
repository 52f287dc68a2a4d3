"""Custom metrics that Python models define (Triton's ``pb_utils.MetricFamily``), in /metrics.

A Python model runs in a worker process; its metric families live there. Each worker
that has any writes a snapshot, ``<pid>.json``, into one folder
(:data:`METRICS_DIR_ENV` names it; the runtime sets it before workers start, so every
worker of this server inherits it) after a batch that changed them. The collector reads
the snapshots at each scrape: series with the same family and labels are summed over
the workers (counters and histograms: the model's instances count together, as in
Triton, where the families live in the server) and a gauge takes the newest value.
The snapshot of a process that is gone is removed.

Names are shown as the model gave them (Triton's form, so queries written for Triton
keep working): a counter is therefore exposed as ``untyped``, since the exposition
library would rename a ``counter`` family to ``<name>_total``.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

__all__ = ["METRICS_DIR_ENV", "ModelMetricsCollector", "model_metrics_dir"]

log = logging.getLogger("sordino.telemetry")

METRICS_DIR_ENV = "SORDINO_MODEL_METRICS_DIR"
"""The environment variable naming the snapshot folder (read by the Python backend)."""


def model_metrics_dir() -> Path:
    """The snapshot folder of this process's workers, made (and exported) on first use;
    removed when the process that made it exits."""
    named = os.environ.get(METRICS_DIR_ENV)
    if named:
        return Path(named)
    folder = Path(tempfile.mkdtemp(prefix="sordino-model-metrics-"))
    os.environ[METRICS_DIR_ENV] = str(folder)
    # The process that made it removes it when it exits (workers only write into it).
    atexit.register(shutil.rmtree, folder, True)
    return folder


_TYPES = {"COUNTER": "counter", "GAUGE": "gauge", "HISTOGRAM": "histogram"}
_SHOWN = {"counter": "untyped", "gauge": "gauge", "histogram": "histogram"}


class ModelMetricsCollector(Collector):
    """Yields the Python models' custom metric families from the workers' snapshots."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder

    def _snapshots(self) -> Iterator[tuple[float, list[dict[str, Any]]]]:
        for path in sorted(self._folder.glob("*.json")):
            try:
                if not psutil.pid_exists(int(path.stem)):
                    path.unlink(missing_ok=True)
                    continue
                yield path.stat().st_mtime, json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                log.debug("model metrics snapshot %s skipped: %s", path, exc)

    def collect(self) -> Iterator[Metric]:
        families: dict[str, tuple[str, str, dict[tuple[tuple[str, str], ...], Any]]] = {}
        snapshots = sorted(self._snapshots(), key=lambda item: item[0])
        for _, snapshot in snapshots:
            for family in snapshot:
                kind = _TYPES.get(str(family.get("kind")))
                if kind is None:
                    continue
                name = str(family["name"])
                known = families.setdefault(name, (kind, str(family["description"]), {}))
                if known[0] != kind:
                    continue
                for series in family.get("series", ()):
                    key = tuple(sorted(series.get("labels", {}).items()))
                    _merge(known[2], key, kind, series)
        for name, (kind, description, series) in families.items():
            metric = Metric(name, description, _SHOWN[kind])
            for key, state in series.items():
                labels = dict(key)
                if kind == "histogram":
                    cumulative = 0
                    buckets = [*state["buckets"], float("inf")]
                    for bound, count in zip(buckets, state["counts"], strict=True):
                        cumulative += count
                        le = "+Inf" if bound == float("inf") else repr(float(bound))
                        metric.add_sample(f"{name}_bucket", {**labels, "le": le}, cumulative)
                    metric.add_sample(f"{name}_count", labels, cumulative)
                    metric.add_sample(f"{name}_sum", labels, state["sum"])
                else:
                    metric.add_sample(name, labels, state["value"])
            yield metric


def _merge(
    into: dict[tuple[tuple[str, str], ...], Any], key: Any, kind: str, series: dict[str, Any]
) -> None:
    """Add one worker's ``series`` (snapshots come oldest first: a gauge keeps the last)."""
    known = into.get(key)
    if kind == "histogram":
        if known is None or known["buckets"] != series["buckets"]:
            into[key] = {k: series[k] for k in ("buckets", "counts", "sum")}
        else:
            known["counts"] = [
                a + b for a, b in zip(known["counts"], series["counts"], strict=True)
            ]
            known["sum"] += series["sum"]
    elif kind == "counter" and known is not None:
        known["value"] += series["value"]
    else:
        into[key] = {"value": float(series["value"])}
