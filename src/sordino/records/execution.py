"""What execution reports: model instances (workers), device breakers, device switches,
outlier ejection, and the executor's figures that gather them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sordino.records.memory import ArenaStatistics

__all__ = [
    "BreakerState",
    "BreakerStatistics",
    "DeviceStatistics",
    "ExecutionStatistics",
    "InstanceState",
    "OutlierStatistics",
    "SwitchStatistics",
    "WorkerStatistics",
]


InstanceState = Literal["starting", "ready", "restarting", "stopped"]


BreakerState = Literal["closed", "open", "half_open"]


@dataclass(frozen=True, slots=True)
class WorkerStatistics:
    """One model instance: where it runs, whether it serves, how often it was replaced."""

    model: str
    version: str
    index: int
    tier: str
    device: str
    isolation: str
    state: InstanceState
    busy: bool
    pid: int | None
    restarts: int
    batches: int
    failures: int
    last_cause: str
    profiling: bool
    node: str = ""
    """The Ray node the instance's actor runs on (executor.kind: ray); "" for this machine."""
    busy_s: float = 0.0
    """Seconds this instance has spent running batches since it was placed (its busy
    share over a window is the growth of this figure over the window's length)."""
    hop_bytes: int = 0
    """Bytes of tensors that crossed the worker hop: each batch's inputs the worker
    process read from the arena and the outputs it wrote back (0 in the server's process)."""


@dataclass(frozen=True, slots=True)
class BreakerStatistics:
    """A snapshot of one breaker and the window it judges by."""

    name: str
    state: BreakerState
    window_requests: int
    window_failures: int
    error_rate: float
    opened: int
    closed: int
    probes_in_flight: int
    probe_successes: int
    since: float


@dataclass(frozen=True, slots=True)
class DeviceStatistics:
    """A device: whether this machine has it, and its breaker (chains only)."""

    name: str
    available: bool
    reason: str
    breaker: BreakerStatistics | None


@dataclass(frozen=True, slots=True)
class SwitchStatistics:
    """Batches of one model moved from one device to the next after a failure.

    ``total_s``/``max_s``/``last_s``: time from the failure on ``from_device`` to the
    result from ``to_device``; ``dispatch_total_s``: from the failure to the batch
    being handed to the next device (the switch itself, without the fallback's compute).
    """

    model: str
    from_device: str
    to_device: str
    count: int
    total_s: float
    max_s: float
    last_s: float
    dispatch_total_s: float


@dataclass(frozen=True, slots=True)
class OutlierStatistics:
    """One instance as outlier ejection sees it (``execution/outliers.py``).

    ``consecutive_failures``: batches failed by the instance itself (another instance
    ran them), in a row; ``ejections``: times it was ejected; ``ejected_until``: the
    clock time its ejection ends, None while it is in placement.
    """

    model: str
    version: str
    index: int
    consecutive_failures: int
    ejections: int
    ejected_until: float | None
    last_cause: str


@dataclass(frozen=True, slots=True)
class ExecutionStatistics:
    """Everything the executor knows about its workers, devices, switches and arena."""

    workers: tuple[WorkerStatistics, ...]
    devices: tuple[DeviceStatistics, ...]
    switches: tuple[SwitchStatistics, ...]
    retries: int
    arena: ArenaStatistics | None
    faults_active: int
    faults_applied: int
    outliers: tuple[OutlierStatistics, ...] = ()
    """Instances that failed a batch of their own or were ejected (none before that)."""
    arena_bytes: int = 0
    """Bytes staging copied into the shared-memory arena (batch inputs not already there)."""
