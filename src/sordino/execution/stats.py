"""The statistics records of the execution layer (what telemetry exports)."""

from __future__ import annotations

from dataclasses import dataclass

from sordino.execution.breaker import BreakerStatistics
from sordino.execution.instances import WorkerStatistics
from sordino.memory.arena import ArenaStatistics

__all__ = [
    "DeviceStatistics",
    "ExecutionStatistics",
    "SwitchRecorder",
    "SwitchStatistics",
    "WorkerStatistics",
]


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
class ExecutionStatistics:
    """Everything the executor knows about its workers, devices, switches and arena."""

    workers: tuple[WorkerStatistics, ...]
    devices: tuple[DeviceStatistics, ...]
    switches: tuple[SwitchStatistics, ...]
    retries: int
    arena: ArenaStatistics | None
    faults_active: int
    faults_applied: int


class SwitchRecorder:
    """Counts and times device switches per (model, from, to)."""

    def __init__(self) -> None:
        self._data: dict[tuple[str, str, str], list[float]] = {}

    def record(
        self, model: str, source: str, target: str, switch_s: float, dispatch_s: float
    ) -> None:
        entry = self._data.setdefault((model, source, target), [0, 0.0, 0.0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += switch_s
        entry[2] = max(entry[2], switch_s)
        entry[3] = switch_s
        entry[4] += dispatch_s

    def statistics(self) -> tuple[SwitchStatistics, ...]:
        return tuple(
            SwitchStatistics(model, source, target, int(v[0]), v[1], v[2], v[3], v[4])
            for (model, source, target), v in sorted(self._data.items())
        )
