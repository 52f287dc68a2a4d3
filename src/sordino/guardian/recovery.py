"""Progressive recovery: a restarted or added instance earns its traffic.

After ``restart_worker`` or ``scale_workers +N`` each new instance first gets no live
traffic while it runs ``recovery.warmup_requests`` zero-filled one-row requests; then
it is offered a growing share of batches (``recovery.ramp``: 10 % → 50 % → 100 %),
one step every ``recovery.ramp_step``, each step only after the deep health check of
its model passes (held, and retried, while it fails). This is what keeps a recovery
from becoming a storm: a cold or sick instance never takes a full share at once.
When the instance is the model's only serving one it is never held back (the share
only applies while another instance can take the batches).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from sordino.clock import Clock
from sordino.config.self_healing import RecoveryConfig
from sordino.events import EventSink
from sordino.execution.chain import ChainExecutor
from sordino.execution.placement import Instance
from sordino.inference import ModelKey

__all__ = ["Recovery"]

Health = Callable[[ModelKey], Awaitable[str | None]]
"""The deep health check of one model: None when it passes, else why it failed."""


class Recovery:
    """Warms up and ramps instances in; one call per action, in the background."""

    def __init__(
        self,
        config: RecoveryConfig,
        *,
        executor: ChainExecutor,
        health: Health,
        clock: Clock,
        events: EventSink,
        start_timeout_s: float,
    ) -> None:
        self._config = config
        self._executor = executor
        self._health = health
        self._clock = clock
        self._events = events
        self._start_timeout = start_timeout_s

    async def __call__(self, key: ModelKey, instances: Sequence[Instance]) -> None:
        for instance in instances:
            instance.share = 0.0
            instance.credit = 0.0
        try:
            for instance in instances:
                await self._ramp(key, instance)
        finally:
            for instance in instances:
                instance.share = 1.0

    async def _ramp(self, key: ModelKey, instance: Instance) -> None:
        started = self._clock.now()
        waited = 0.0
        # A restarted instance is not serving yet: wait for its new worker.
        while not instance.serving and not _stopped(instance):
            if waited > self._start_timeout:
                return
            await self._clock.sleep(0.05)
            waited += 0.05
        if _stopped(instance):
            return
        warmed = await self._executor.warm_up(key, instance, self._config.warmup_requests)
        steps: list[float] = []
        held = 0
        for share in self._config.ramp:
            while (problem := await self._health(key)) is not None:
                held += 1
                self._events.emit(
                    "recovery_held", instance.subject, f"deep health check failed: {problem}"
                )
                await self._clock.sleep(self._config.ramp_step)
                if _stopped(instance):
                    return
            instance.share = share
            steps.append(share)
            if share < 1.0:
                await self._clock.sleep(self._config.ramp_step)
        self._events.emit(
            "recovery_done",
            instance.subject,
            f"warmed with {warmed} requests, ramped {' → '.join(f'{s:.0%}' for s in steps)}",
            warmup_requests=warmed,
            ramp=steps,
            held_steps=held,
            took_s=self._clock.now() - started,
        )


def _stopped(instance: Instance) -> bool:
    return instance.state == "stopped"
