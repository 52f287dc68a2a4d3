"""Progressive recovery: a restarted or added instance earns its traffic.

After ``restart_worker`` or ``scale_workers +N`` each new instance first gets no live
traffic while it runs ``recovery.warmup_requests`` zero-filled one-row requests; then
it is offered a growing share of batches (``recovery.ramp``: 10 % → 50 % → 100 %),
one step every ``recovery.ramp_step``, each step only after the deep health check of
its model passes (held, and retried every step, while it fails; after 30 failed
checks the instance is let in, so a model that stays sick is left to the triggers).
This is what keeps a recovery from becoming a storm: a cold or sick instance never
takes a full share at once. When the instance is the model's only serving one it is
never held back (the share only applies while another instance can take the batches).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence

from sordino.clock import Clock
from sordino.config.self_healing import RecoveryConfig
from sordino.events import EventSink
from sordino.execution.chain import ChainExecutor
from sordino.execution.placement import Instance
from sordino.inference import ModelKey

__all__ = ["Recovery"]

_MAX_HELD_TRIES = 30
"""Deep health checks a ramp step waits for before the instance is let in anyway."""

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
        self._generation: dict[int, int] = {}

    async def __call__(self, key: ModelKey, instances: Sequence[Instance]) -> None:
        # A newer recovery of the same instance (restarted again) supersedes this one.
        mine: dict[int, int] = {}
        for instance in instances:
            mine[id(instance)] = self._generation[id(instance)] = (
                self._generation.get(id(instance), 0) + 1
            )
            instance.share = 0.0
            instance.credit = 0.0
        try:
            for instance in instances:
                await self._ramp(key, instance, functools.partial(self._current, instance, mine))
        finally:
            for instance in instances:
                if self._current(instance, mine):
                    instance.share = 1.0
                    del self._generation[id(instance)]

    def _current(self, instance: Instance, mine: dict[int, int]) -> bool:
        return self._generation.get(id(instance)) == mine[id(instance)]

    async def _ramp(self, key: ModelKey, instance: Instance, current: Callable[[], bool]) -> None:
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
            tries = 0
            while (problem := await self._health(key)) is not None:
                if tries == 0:  # once per step: the check is retried every ramp_step
                    self._events.emit(
                        "recovery_held",
                        instance.subject,
                        f"held at {instance.share:.0%}: deep health check failed: {problem}",
                    )
                tries += 1
                held += 1
                if tries >= _MAX_HELD_TRIES:
                    self._events.emit(
                        "recovery_gave_up",
                        instance.subject,
                        f"the deep health check failed {tries} times; the instance takes its "
                        "full share again (the guardian's triggers watch it from here)",
                    )
                    return
                await self._clock.sleep(self._config.ramp_step)
                if _stopped(instance) or not current():
                    return
            if not current():
                return
            instance.share = share
            steps.append(share)
            if share < 1.0:
                await self._clock.sleep(self._config.ramp_step)
                if not current():
                    return
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
