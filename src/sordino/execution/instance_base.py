"""What every model instance has (:class:`InstanceBase`): its place, state, busy time and
statistics; the kinds are ``thread_instance.py``, ``instances.py`` (a worker process)
and ``ray_instance.py`` (a Ray actor).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sordino.execution.devices import Device
from sordino.inference import ModelKey
from sordino.records import InstanceState, WorkerStatistics

__all__ = ["READY_CHECK_S", "InstanceBase", "retrieved"]

READY_CHECK_S = 5.0
"""How long a readiness check waits for the model's ``is_ready()`` (Triton's 5 s)."""


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
        self._checking: asyncio.Future[str | None] | None = None

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

    @property
    def checks_ready(self) -> bool:
        """Whether the model serving here checks its own readiness (``is_ready()``)."""
        return False

    async def _check_ready(self) -> str | None:
        """Ask the model serving here whether it is ready (only when :attr:`checks_ready`)."""
        raise NotImplementedError

    async def readiness(self) -> str | None:
        """Why this instance is not ready, or None: not serving, or its model's own check
        said no, failed or did not answer within :data:`READY_CHECK_S`.

        As Triton does, one check at a time: a check asked while one runs waits for that
        one's answer (a model's ``is_ready()`` that hangs is asked nothing more until it
        answers, and every check meanwhile says not ready).
        """
        if not self.serving:
            return f"the instance is {self.state}"
        if not self.checks_ready:
            return None
        checking = self._checking
        if checking is None or checking.done():
            checking = self._checking = asyncio.ensure_future(self._check_ready())
            checking.add_done_callback(retrieved)  # (an answer nobody waited for)
        try:
            return await asyncio.wait_for(asyncio.shield(checking), READY_CHECK_S)
        except TimeoutError:
            return f"its is_ready() did not answer within {READY_CHECK_S:g} s"
        except Exception as exc:  # the worker lost meanwhile, the actor gone, ...
            return f"its readiness could not be checked: {exc}"

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


def retrieved(future: asyncio.Future[Any]) -> None:
    """Read what a future nobody awaits ended with (a done callback), so that asyncio
    does not report its exception as never retrieved."""
    if not future.cancelled():
        future.exception()
