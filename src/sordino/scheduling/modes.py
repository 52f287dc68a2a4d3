"""Scheduler modes: how each one turns the configured numbers into a batch policy.

==================  ===========================================================
mode                what it does
==================  ===========================================================
manual              the configured numbers exactly (Triton's dynamic batcher)
conservative        batch cap halved, queue capped at 4 batches per instance:
                    headroom over throughput
ultra_low_latency   never waits to fill a batch (delay 0); still runs together
                    whatever queued while the model was busy
adaptive            AIMD toward ``slo_p99_ms``: the batch cap and the wait grow
                    additively while p99 has room and are cut multiplicatively
                    when p99 passes the SLO; never waits when the arrival rate
                    says the wait cannot fill the batch
auto                measures the model's batch-latency curve at load and caps the
                    batch at the smallest size reaching 95 % of the best measured
                    throughput; if batching does not pay (that size is 1, or the
                    speedup at the largest size is < 1.5x) it runs as
                    ultra_low_latency, otherwise as adaptive under that cap
hybrid              measures the curve and caps the batch at the largest size whose
                    latency fits in a quarter of the SLO, then tunes the wait
                    adaptively under that cap
==================  ===========================================================
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from sordino.clock import Clock
from sordino.config import SchedulerMode as Mode
from sordino.records import ControllerStatistics
from sordino.scheduling.batcher import BatchPolicy

__all__ = [
    "AimdController",
    "BatchCurve",
    "Mode",
    "ModeController",
    "StaticController",
    "build_controller",
    "measure_batch_curve",
]

AUTO_MIN_SPEEDUP = 1.5
AUTO_THROUGHPUT_SHARE = 0.95
CONSERVATIVE_BATCHES_QUEUED = 4
HYBRID_SLO_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class BatchCurve:
    """Measured latency (seconds) of one batch at each batch size."""

    sizes: tuple[int, ...]
    latencies_s: tuple[float, ...]

    def speedup(self) -> float:
        """Return throughput at the largest size over throughput at size 1."""
        if len(self.sizes) < 2 or self.latencies_s[-1] <= 0:
            return 1.0
        per_item_1 = self.latencies_s[0] / self.sizes[0]
        per_item_n = self.latencies_s[-1] / self.sizes[-1]
        return per_item_1 / per_item_n if per_item_n > 0 else 1.0

    def throughput_knee(self, share: float = AUTO_THROUGHPUT_SHARE) -> int:
        """Return the smallest size reaching ``share`` of the best measured rows/s.

        Past it a bigger batch only adds latency; on a model where batching hurts
        (common for convolutions on a CPU) this is 1.
        """
        rates = [
            s / lat if lat > 0 else 0.0 for s, lat in zip(self.sizes, self.latencies_s, strict=True)
        ]
        best = max(rates, default=0.0)
        for size, rate in zip(self.sizes, rates, strict=True):
            if rate >= share * best:
                return size
        return self.sizes[-1] if self.sizes else 1

    def largest_within(self, budget_s: float) -> int:
        """Return the largest measured size whose batch latency fits ``budget_s`` (at least 1)."""
        fitting = [
            s for s, lat in zip(self.sizes, self.latencies_s, strict=True) if lat <= budget_s
        ]
        return max(fitting) if fitting else 1


class ModeController(Protocol):
    """Owns the current batch policy of one model and may adapt it from observations."""

    def policy(self) -> BatchPolicy:
        """Return the batch policy to use for the next decision."""
        ...

    def observe(self, now: float, latency_s: float, *, backlog_rows: int = 0) -> None:
        """Record one finished request's latency; ``backlog_rows`` are queued behind it."""
        ...

    def statistics(self) -> ControllerStatistics:
        """Return what the controller is doing now."""
        ...


class StaticController:
    """A fixed policy (manual, conservative, ultra_low_latency)."""

    def __init__(self, mode: str, policy: BatchPolicy, effective_mode: str | None = None) -> None:
        self._mode = mode
        self._effective = effective_mode or mode
        self._policy = policy

    def policy(self) -> BatchPolicy:
        return self._policy

    def observe(self, now: float, latency_s: float, *, backlog_rows: int = 0) -> None:
        return None

    def statistics(self) -> ControllerStatistics:
        return ControllerStatistics(
            self._mode, self._effective, self._policy.max_batch, self._policy.max_delay_s, None, 0
        )


class AimdController:
    """Additive-increase, multiplicative-decrease tuning toward a p99 latency target.

    Every ``interval_s`` with at least ``min_samples`` latencies in the last
    ``window_s``: p99 above the SLO cuts the batch cap by ``decrease`` and halves the
    wait; p99 under ``headroom`` x SLO grows the cap by one and the wait by an eighth
    of its ceiling. Both stay within the configured ceilings. Under overload — a full
    batch or more queued — the cap grows instead, whatever the p99: then the latency
    is queueing, and only bigger batches serve more rows per second.
    """

    def __init__(
        self,
        mode: str,
        ceiling: BatchPolicy,
        slo_s: float,
        *,
        effective_mode: str = "adaptive",
        window_s: float = 2.0,
        interval_s: float = 0.5,
        min_samples: int = 20,
        decrease: float = 0.75,
        headroom: float = 0.7,
    ) -> None:
        self._mode = mode
        self._effective = effective_mode
        self._ceiling = ceiling
        self._slo_s = slo_s
        self._window_s = window_s
        self._interval_s = interval_s
        self._min_samples = min_samples
        self._decrease = decrease
        self._headroom = headroom
        # The window's samples as two columns of C doubles, the live ones from
        # ``_first`` on: a request adds two floats, not a tuple for the collector, and
        # the p99 is a partial sort of a numpy view rather than a sort of a list.
        self._times = array("d")
        self._latencies = array("d")
        self._first = 0
        self._next_adjust: float | None = None
        self._p99: float | None = None
        self._adjustments = 0
        self._backlog = 0
        self._policy = replace(ceiling, predictive=True)

    def policy(self) -> BatchPolicy:
        return self._policy

    def observe(self, now: float, latency_s: float, *, backlog_rows: int = 0) -> None:
        self._times.append(now)
        self._latencies.append(latency_s)
        self._backlog = backlog_rows
        if self._next_adjust is None:
            self._next_adjust = now + self._interval_s
        if now < self._next_adjust:
            return
        self._next_adjust = now + self._interval_s
        p99 = self._window_p99(now)
        if p99 is None:
            return
        self._p99 = p99
        current = self._policy
        if self._backlog >= current.max_batch:
            # Overloaded: a full batch is already waiting, so the latency is queueing, not
            # batch size. A smaller batch would only serve fewer rows per second and make
            # the queue longer; grow toward the ceiling instead (and never wait to fill).
            cap = min(self._ceiling.max_batch, max(current.max_batch + 1, self._backlog))
            delay = current.max_delay_s
        elif p99 > self._slo_s:
            cap = max(1, math.floor(current.max_batch * self._decrease))
            delay = current.max_delay_s / 2
        elif p99 < self._headroom * self._slo_s:
            cap = min(self._ceiling.max_batch, current.max_batch + 1)
            delay = min(
                self._ceiling.max_delay_s, current.max_delay_s + self._ceiling.max_delay_s / 8
            )
        else:
            return
        if cap != current.max_batch or delay != current.max_delay_s:
            self._adjustments += 1
            self._policy = replace(
                current, max_batch=cap, max_delay_s=delay, min_batch=min(current.min_batch, cap)
            )

    def _window_p99(self, now: float) -> float | None:
        """The p99 of the latencies observed in the last ``window_s`` (the sample at
        rank ⌈0.99·n⌉ of n), having forgotten the older ones; None under ``min_samples``."""
        times, latencies = self._times, self._latencies
        first = bisect_left(times, now - self._window_s, self._first)
        if first > len(times) // 2:  # forget the expired half: the columns stay small
            del times[:first], latencies[:first]
            first = 0
        self._first = first
        count = len(times) - first
        if count < self._min_samples:
            return None
        rank = min(count - 1, math.ceil(0.99 * count) - 1)
        window = np.frombuffer(latencies, dtype=np.float64)[first:]
        p99 = float(np.partition(window, rank)[rank])
        del window  # the columns cannot grow while a view of them is held
        return p99

    def statistics(self) -> ControllerStatistics:
        return ControllerStatistics(
            self._mode,
            self._effective,
            self._policy.max_batch,
            self._policy.max_delay_s,
            self._p99,
            self._adjustments,
        )


def build_controller(
    mode: Mode, configured: BatchPolicy, slo_s: float, curve: BatchCurve | None = None
) -> ModeController:
    """Return the controller implementing ``mode`` over the ``configured`` numbers.

    ``auto`` and ``hybrid`` need the model's measured ``curve``; without one (a model
    that does not batch) they fall back to the configured numbers.
    """
    if configured.max_batch <= 1:
        return StaticController(mode, replace(configured, max_batch=1, max_delay_s=0.0), "manual")
    if mode == "manual":
        return StaticController(mode, configured)
    if mode == "conservative":
        return StaticController(mode, conservative_policy(configured))
    if mode == "ultra_low_latency":
        return StaticController(mode, ultra_low_latency_policy(configured))
    if mode == "adaptive":
        return AimdController(mode, configured, slo_s)
    if curve is None:
        return AimdController(mode, configured, slo_s)
    if mode == "auto":
        cap = min(configured.max_batch, curve.throughput_knee())
        if cap == 1 or curve.speedup() < AUTO_MIN_SPEEDUP:
            policy = ultra_low_latency_policy(_capped(configured, cap))
            return StaticController(mode, policy, "ultra_low_latency")
        return AimdController(mode, _capped(configured, cap), slo_s)
    cap = min(configured.max_batch, curve.largest_within(slo_s * HYBRID_SLO_SHARE))
    return AimdController(mode, _capped(configured, cap), slo_s, effective_mode="adaptive")


def _capped(configured: BatchPolicy, cap: int) -> BatchPolicy:
    return replace(
        configured,
        max_batch=cap,
        min_batch=min(configured.min_batch, cap),
        preferred=tuple(p for p in configured.preferred if p <= cap),
    )


def conservative_policy(configured: BatchPolicy) -> BatchPolicy:
    """Halve the batch cap (at least 1): smaller batches leave latency headroom."""
    return _capped(configured, max(1, configured.max_batch // 2))


def conservative_queue_size(max_queue_size: int, max_batch: int, instances: int) -> int:
    """Cap the queue at a few batches per instance so a backlog cannot build up."""
    return max(1, min(max_queue_size, CONSERVATIVE_BATCHES_QUEUED * max_batch * instances))


def ultra_low_latency_policy(configured: BatchPolicy) -> BatchPolicy:
    """Never wait: run whatever is queued the moment the model is free."""
    return replace(configured, min_batch=1, max_delay_s=0.0, preferred=(), predictive=False)


async def measure_batch_curve(
    run: Callable[[int], Awaitable[None]],
    clock: Clock,
    max_batch: int,
    *,
    repeats: int = 3,
) -> BatchCurve:
    """Time ``run(batch_size)`` at 1, 2, 4, ... up to ``max_batch``; keep each size's median."""
    sizes: list[int] = []
    size = 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    sizes.append(max_batch)
    latencies: list[float] = []
    await run(1)  # warm-up: first runs pay for lazy initialisation
    for size in sizes:
        samples = []
        for _ in range(repeats):
            start = clock.now()
            await run(size)
            samples.append(clock.now() - start)
        latencies.append(sorted(samples)[len(samples) // 2])
    return BatchCurve(tuple(sizes), tuple(latencies))
