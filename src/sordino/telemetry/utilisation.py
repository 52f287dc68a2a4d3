"""Bandwidth saturation and per-instance busy share, sampled once a second.

The executor counts what it moves and how long each instance computes
(``ExecutionStatistics.arena_bytes``, ``WorkerStatistics.hop_bytes`` and ``busy_s``:
cumulative figures, cheap to keep on the request path). :class:`UtilisationMeter`
turns their growth over each closed second into rates:

- **bandwidth** by path — ``arena`` (batch inputs staging copied into the shared-memory
  arena) and ``worker_hop`` (inputs a worker process read from the arena and outputs it
  wrote back) — and their sum against the machine's copy bandwidth
  (:func:`copy_bandwidth`, measured once per process): ``saturation = moved / capacity``.
  Host↔device copies are not counted: ONNX Runtime makes them inside ``run()`` and
  reports no count, so that path is absent (``None``), never a made-up zero;
- **busy share** of each instance: the growth of its ``busy_s`` over the second. Each
  instance has a session of its own, so on a GPU its busy share is its compute stream's
  utilisation; there is one stream per instance and no finer figure.

Every ``JOURNAL_EVERY_S`` seconds the means over those seconds are journaled as one
``utilisation`` event, which ``sordino diagnose`` and ``sordino postmortem`` read.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sordino.records import ExecutionStatistics

__all__ = [
    "JOURNAL_EVERY_S",
    "PATHS",
    "InstanceBusy",
    "UtilisationMeter",
    "UtilisationSample",
    "copy_bandwidth",
    "utilisation_payload",
]

JOURNAL_EVERY_S = 10
PATHS = ("arena", "worker_hop")
_PROBE_BYTES = 8 * 2**20
_PROBE_REPEATS = 5
_KEEP_S = 60


@functools.cache
def copy_bandwidth(nbytes: int = _PROBE_BYTES, repeats: int = _PROBE_REPEATS) -> float:
    """This machine's memory copy bandwidth in bytes per second (measured once, cached).

    The best of ``repeats`` copies of ``nbytes`` between two numpy buffers: the rate the
    runtime's own copies (numpy into the arena) can reach at most. A few milliseconds.
    """
    source = np.ones(nbytes, dtype=np.uint8)
    target = np.empty_like(source)
    np.copyto(target, source)  # touch the pages first: page faults are not bandwidth
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - started)
    return nbytes / max(best, 1e-9)


@dataclass(frozen=True, slots=True)
class InstanceBusy:
    """One instance's share of a second spent running batches, and its total busy time."""

    model: str
    version: str
    index: int
    device: str
    busy: float
    busy_s: float


@dataclass(frozen=True, slots=True)
class UtilisationSample:
    """The rates over one closed second ending at ``t`` and the totals so far.

    ``bytes_s`` and ``bytes_total`` are by path (``PATHS``); ``device_bytes_s`` is None
    (host↔device copies are not observable here). ``saturation`` is the sum of the
    paths' rates over ``capacity_bytes_s``, None until the copy probe has run.
    """

    t: float
    bytes_s: dict[str, float]
    bytes_total: dict[str, int]
    capacity_bytes_s: float | None
    saturation: float | None
    instances: tuple[InstanceBusy, ...]
    device_bytes_s: float | None = None

    @property
    def moved_bytes_s(self) -> float:
        return sum(self.bytes_s.values())


def _totals(stats: ExecutionStatistics) -> dict[str, int]:
    return {"arena": stats.arena_bytes, "worker_hop": sum(w.hop_bytes for w in stats.workers)}


class UtilisationMeter:
    """Rates from the executor's cumulative counters, one sample per closed second."""

    def __init__(self, *, perf: Callable[[], float] = time.perf_counter) -> None:
        self._source: Callable[[], ExecutionStatistics] | None = None
        self._perf = perf
        self.capacity_bytes_s: float | None = None
        self._last: tuple[float, dict[str, int], dict[tuple[str, str, int], float]] | None = None
        self._samples: deque[UtilisationSample] = deque(maxlen=_KEEP_S)

    def watch(self, source: Callable[[], ExecutionStatistics]) -> None:
        """Read the executor's statistics from ``source`` (the runtime calls this once)."""
        self._source = source

    def probe(self) -> float:
        """Measure (once per process) and keep the machine's copy bandwidth."""
        self.capacity_bytes_s = copy_bandwidth()
        return self.capacity_bytes_s

    def tick(self, t: float) -> UtilisationSample | None:
        """Sample the counters now; the rates are over the time since the last tick."""
        if self._source is None:
            return None
        stats = self._source()
        now = self._perf()
        totals = _totals(stats)
        busy = {(w.model, w.version, w.index): w.busy_s for w in stats.workers}
        last, self._last = self._last, (now, totals, busy)
        if last is None:
            return None
        then, before, busy_before = last
        elapsed = max(now - then, 1e-6)
        rates = {p: max(0, totals[p] - before.get(p, 0)) / elapsed for p in PATHS}
        capacity = self.capacity_bytes_s
        instances = tuple(
            InstanceBusy(
                w.model,
                w.version,
                w.index,
                w.device,
                # A replaced instance starts again from 0: its share is from then on.
                min(1.0, max(0.0, w.busy_s - busy_before.get(key, 0.0)) / elapsed),
                w.busy_s,
            )
            for w in stats.workers
            for key in [(w.model, w.version, w.index)]
        )
        sample = UtilisationSample(
            t=t,
            bytes_s=rates,
            bytes_total=totals,
            capacity_bytes_s=capacity,
            saturation=sum(rates.values()) / capacity if capacity else None,
            instances=instances,
        )
        self._samples.append(sample)
        return sample

    def last(self) -> UtilisationSample | None:
        """The latest sample (None before two ticks)."""
        return self._samples[-1] if self._samples else None

    def recent(self, seconds: int) -> list[UtilisationSample]:
        """The samples of the last ``seconds`` ticks, oldest first."""
        return list(self._samples)[-seconds:] if seconds > 0 else []


def utilisation_payload(samples: list[UtilisationSample]) -> dict[str, Any]:
    """Means over ``samples``: the figures of one ``utilisation`` event and of the snapshot.

    ``bandwidth``: bytes per second by path, their sum, the capacity and the saturation;
    ``instances``: each instance's mean busy share (``"model/version/index"`` keys).
    """
    if not samples:
        return {}
    last = samples[-1]
    rates = {p: float(np.mean([s.bytes_s.get(p, 0.0) for s in samples])) for p in PATHS}
    moved = sum(rates.values())
    capacity = last.capacity_bytes_s
    shares: dict[str, list[float]] = {}
    devices: dict[str, str] = {}
    for sample in samples:
        for busy in sample.instances:
            key = f"{busy.model}/{busy.version}/{busy.index}"
            shares.setdefault(key, []).append(busy.busy)
            devices[key] = busy.device
    return {
        "seconds": len(samples),
        "bandwidth": {
            "bytes_s": rates,
            "moved_bytes_s": moved,
            "bytes_total": dict(last.bytes_total),
            "device_bytes_s": None,
            "capacity_bytes_s": capacity,
            "saturation": moved / capacity if capacity else None,
        },
        "instances": {
            key: {"busy": float(np.mean(values)), "device": devices[key]}
            for key, values in shares.items()
        },
    }
