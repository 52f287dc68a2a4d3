"""A latency-injecting executor for tests, until the real chaos injector exists.

:class:`LatencyChaos` wraps a runtime's executor: while an injection is active for a
model, each of its batches takes ``latency_s`` longer (on the runtime's clock, so
for real on a real server). Like a chaos injection it leaves a trace: a
``chaos_injected`` event when it starts and a ``chaos_cleared`` event when it ends,
so diagnose can correlate the latency it causes with its cause.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sordino.clock import Clock
from sordino.events import EventSink
from sordino.inference import ModelKey, Tensor

__all__ = ["LatencyChaos", "install_latency_chaos"]


@dataclass(slots=True)
class _Injection:
    latency_s: float
    until: float
    worker: int


class LatencyChaos:
    """An executor wrapper adding latency to one model's batches for a while."""

    def __init__(self, inner: Any, *, events: EventSink, clock: Clock) -> None:
        self._inner = inner
        self._events = events
        self._clock = clock
        self._active: dict[str, _Injection] = {}
        self.delayed_batches = 0

    def inject(self, model: str, latency_s: float, duration_s: float, *, worker: int = 0) -> None:
        """Add ``latency_s`` to every batch of ``model`` for the next ``duration_s``."""
        now = self._clock.now()
        self._active[model] = _Injection(latency_s, now + duration_s, worker)
        self._events.emit(
            "chaos_injected",
            f"worker {model}#{worker}",
            f"latency +{latency_s * 1000:.0f} ms for {duration_s:g} s",
            fault="latency",
            model=model,
            worker=worker,
            latency_ms=latency_s * 1000,
            duration_s=duration_s,
        )
        self._clock.call_at(now + duration_s, self._clear(model, now + duration_s))

    def _clear(self, model: str, until: float) -> Callable[[], None]:
        def clear() -> None:
            injection = self._active.get(model)
            if injection is not None and injection.until == until:
                del self._active[model]
                self._events.emit(
                    "chaos_cleared",
                    f"worker {model}#{injection.worker}",
                    "injection ended",
                    fault="latency",
                    model=model,
                )

        return clear

    async def run(self, model: ModelKey, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        outputs: dict[str, Tensor] = await self._inner.run(model, batch)
        injection = self._active.get(model.name)
        if injection is not None and self._clock.now() < injection.until:
            self.delayed_batches += 1
            await self._clock.sleep(injection.latency_s)
        return outputs

    def instances(self, model: ModelKey) -> int:
        return int(self._inner.instances(model))

    def __getattr__(self, name: str) -> Any:
        # register, unregister, statistics, ...: everything else is the real executor's.
        return getattr(self._inner, name)


def install_latency_chaos(runtime: Any) -> LatencyChaos:
    """Wrap ``runtime``'s executor (call before ``runtime.start()``) and return the wrapper."""
    chaos = LatencyChaos(runtime.executor, events=runtime.events, clock=runtime.clock)
    runtime.executor = chaos
    return chaos
