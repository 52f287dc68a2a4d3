"""What every model instance has (:class:`InstanceBase`): its place, state, busy time and
statistics; the kinds are ``thread_instance.py``, ``instances.py`` (a worker process)
and ``ray_instance.py`` (a Ray actor).
"""

from __future__ import annotations

import time

from sordino.execution.devices import Device
from sordino.inference import ModelKey
from sordino.records import InstanceState, WorkerStatistics

__all__ = ["InstanceBase"]


class InstanceBase:
    """A model instance's place (model, index, tier, device), state and statistics."""

    isolation = "thread"

    def __init__(self, key: ModelKey, index: int, tier: str, device: Device) -> None:
        self.key = key
        self.index = index
        self.tier = tier
        self.device = device
        self.state: InstanceState = "starting"
        self._busy_since: float | None = None
        self._busy_s = 0.0
        self.hop_bytes = 0
        """Bytes of batch inputs and outputs that crossed the worker hop (process only)."""
        self.batches = self.failures = self.restarts = 0
        self.last_cause = ""
        self.share = 1.0
        """The share of batches this instance is offered (below 1 while it ramps up)."""
        self.credit = 0.0

    @property
    def subject(self) -> str:
        return f"{self.key.name}/{self.index}"

    @property
    def busy(self) -> bool:
        """Whether a batch is running on this instance now (the executor sets it)."""
        return self._busy_since is not None

    @busy.setter
    def busy(self, value: bool) -> None:
        # Busy time is measured on the performance counter, not the runtime's clock: it
        # is a measurement of real work (the utilisation figures), never a deadline.
        if value and self._busy_since is None:
            self._busy_since = time.perf_counter()
        elif not value and self._busy_since is not None:
            self._busy_s += time.perf_counter() - self._busy_since
            self._busy_since = None

    @property
    def busy_s(self) -> float:
        """Seconds spent running batches so far, the running batch's time included."""
        since = self._busy_since
        return self._busy_s + (time.perf_counter() - since if since is not None else 0.0)

    @property
    def serving(self) -> bool:
        return self.state == "ready"

    def _pid(self) -> int | None:
        return None

    @property
    def pid(self) -> int | None:
        """The process serving now (None in the server's own process or between two)."""
        return self._pid()

    @property
    def profiling(self) -> bool:
        """Whether this instance serves from a profiling session now."""
        return False

    def statistics(self) -> WorkerStatistics:
        return WorkerStatistics(
            model=self.key.name,
            version=self.key.version,
            index=self.index,
            tier=self.tier,
            device=self.device.name,
            isolation=self.isolation,
            state=self.state,
            busy=self.busy,
            pid=self._pid(),
            restarts=self.restarts,
            batches=self.batches,
            failures=self.failures,
            last_cause=self.last_cause,
            profiling=self.profiling,
            busy_s=self.busy_s,
            hop_bytes=self.hop_bytes,
        )
