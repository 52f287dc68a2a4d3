"""Placement: which devices a model's instances go on, and which instance runs a batch.

A loaded model's instances sit in tiers (:class:`TierSlot`), best first: one per
device of the fallback chain, or a single tier without a chain (see
``execution/devices.py``). Each chain device has a circuit breaker; a device whose
execution provider this machine lacks, or where no instance could start, is marked
unavailable once and skipped from then on.

:func:`choose` picks where a batch runs: the first tier whose breaker lets traffic
through and that has a serving instance, then an idle instance there. A busy primary
is not a failing primary, so the batch waits on the model's :class:`Signal` for an
instance to free up rather than moving down the chain.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from sordino.clock import Clock
from sordino.config import ModelConfig, RuntimeConfig, parse_threshold
from sordino.events import EventSink
from sordino.execution.breaker import CircuitBreaker
from sordino.execution.devices import Tier, chain_devices, missing_provider, model_tiers
from sordino.execution.instances import ProcessInstance
from sordino.execution.ray_instance import RayInstance
from sordino.execution.thread_instance import ThreadInstance
from sordino.inference import ModelKey, ModelMetadata
from sordino.records import BreakerState, DeviceStatistics, WorkerStatistics

__all__ = ["Instance", "PlacedModel", "Placement", "Signal", "TierSlot", "choose"]

log = logging.getLogger("sordino.execution")

Instance = ProcessInstance | ThreadInstance | RayInstance


class Signal:
    """Wakes every waiter when an instance frees up or changes state."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def fire(self) -> None:
        for future in self._waiters:
            if not future.done():
                future.set_result(None)
        self._waiters.clear()

    async def wait(self) -> None:
        future = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        await future


@dataclass(slots=True)
class TierSlot:
    """One tier of a loaded model: its name, its device's breaker, its instances."""

    name: str
    breaker: CircuitBreaker | None
    instances: list[Instance]


@dataclass(slots=True)
class PlacedModel:
    """A loaded model: its tiers of instances, best first, and the signal its batches wait on."""

    key: ModelKey
    isolation: str
    metadata: ModelMetadata
    tiers: list[TierSlot]
    signal: Signal

    def instances(self) -> list[Instance]:
        """Every instance of the model, tier by tier."""
        return [instance for tier in self.tiers for instance in tier.instances]


async def choose(
    model: PlacedModel,
    tried: set[str],
    lost: set[int],
    *,
    give_up: Callable[[], bool] | None = None,
    failed: Callable[[Instance], bool] | None = None,
    ejected: Callable[[Instance], bool] | None = None,
) -> tuple[TierSlot, Instance] | None:
    """Wait for an idle serving instance on the best tier; None when none is left.

    Tiers in ``tried`` failed this batch already and are passed over. Instances in
    ``lost`` lost this batch (crash, hang, timeout) and are passed over while another
    serves; when none other does, the batch waits for a lost one to be restarted.
    Instances for which ``failed`` says True (the model failed this batch there, and
    they were not replaced since) are never chosen; those ``ejected`` (outlier
    ejection, ``execution/outliers.py``) only when no other instance is left.
    ``give_up`` is asked each time the wait ends without an instance (the caller fires
    ``model.signal`` when its time is up): once it says True, None is returned. The
    instance returned is marked busy; the caller frees it and fires ``model.signal``.
    """
    quick = _only_instance(model, tried, lost, failed, ejected)
    if quick is not None:
        return quick
    while True:
        live = [
            slot
            for slot in model.tiers
            if slot.name not in tried
            and any(i.serving or i.state in ("starting", "restarting") for i in slot.instances)
        ]
        if not live:
            return None

        def passed_over(i: Instance) -> bool:
            return i.index in lost or (ejected is not None and ejected(i))

        barred = {id(i) for s in live for i in s.instances if failed is not None and failed(i)}
        others = any(
            i.serving and id(i) not in barred and not passed_over(i)
            for s in live
            for i in s.instances
        )
        usable = {
            id(i)
            for s in live
            for i in s.instances
            if i.serving and id(i) not in barred and (not others or not passed_over(i))
        }
        serving = [s for s in live if any(id(i) in usable for i in s.instances)]
        allowed = [s for s in serving if s.breaker is None or s.breaker.allows()]
        candidates = allowed or serving
        if candidates:
            pool = [i for i in candidates[0].instances if id(i) in usable]
            full = any(i.share >= 1 for i in pool)
            if full and len(pool) > 1 and any(i.share < 1 for i in pool):
                # Ramping instances (progressive recovery) are offered each batch first,
                # and take it in their share of the offers.
                pool.sort(key=lambda i: i.share >= 1)
            for instance in pool:
                if instance.busy:
                    continue
                if instance.share < 1 and full:
                    # Ramping up (progressive recovery): offered its share of batches.
                    instance.credit += instance.share
                    if instance.credit < 1 - 1e-9:
                        continue
                    instance.credit -= 1
                instance.busy = True
                return candidates[0], instance
        if give_up is not None and give_up():
            return None
        await model.signal.wait()


def _only_instance(
    model: PlacedModel,
    tried: set[str],
    lost: set[int],
    failed: Callable[[Instance], bool] | None,
    ejected: Callable[[Instance], bool] | None,
) -> tuple[TierSlot, Instance] | None:
    """:func:`choose`'s answer for a model of one tier and one instance, idle and
    serving, on a batch's first try (the usual case); None: ask :func:`choose`'s way.

    The same questions are asked in the same order (each may move a state: an ejection
    over, a breaker's cool-down), and with one instance none of their answers but
    ``failed`` changes the choice: an ejected instance or a device whose breaker is
    open is still taken when no other is left.
    """
    if tried or lost or len(model.tiers) != 1:
        return None
    slot = model.tiers[0]
    if len(slot.instances) != 1:
        return None
    instance = slot.instances[0]
    if not instance.serving or instance.busy:
        return None
    if failed is not None and failed(instance):
        return None
    if ejected is not None:
        ejected(instance)
    if slot.breaker is not None:
        slot.breaker.allows()
    instance.busy = True
    return slot, instance


class Placement:
    """The devices of this runtime: the chain, a breaker per chain device, availability.

    Loaded models register their :class:`Signal` with :meth:`watch`, so a breaker
    changing state wakes the batches waiting in :func:`choose`.
    """

    def __init__(self, config: RuntimeConfig, *, clock: Clock, events: EventSink) -> None:
        self._events = events
        self._chain = chain_devices(config)
        self._breakers: dict[str, CircuitBreaker] = {}
        self._unavailable: dict[str, str] = {}
        self._signals: list[Signal] = []
        strategy = config.scheduler.fallback_chain
        if self._chain is not None and strategy is not None:
            threshold = parse_threshold(strategy.switch_threshold)
            for device in self._chain:
                self._breakers[device.name] = CircuitBreaker(
                    device.name,
                    threshold,
                    clock=clock,
                    min_requests=strategy.min_requests,
                    cooldown_s=strategy.cooldown,
                    probes=strategy.half_open_probes,
                    on_change=self._breaker_changed,
                )
                reason = missing_provider(device)
                if reason is not None:
                    self._mark_unavailable(device.name, reason)

    def tiers(self, config: ModelConfig) -> list[tuple[Tier, TierSlot]]:
        """The tiers a model of ``config`` runs on, best first, each with an empty slot."""
        return [
            (tier, TierSlot(tier.name, self._breakers.get(tier.name), []))
            for tier in model_tiers(config, self._chain)
        ]

    def available(self, device: str) -> bool:
        """Whether instances may start on ``device``."""
        return device not in self._unavailable

    def open_failed(self, device: str, reason: str) -> None:
        """An instance could not start on ``device``: with a chain, the device is skipped."""
        if self._chain is not None:
            self._mark_unavailable(device, reason)

    @property
    def chain(self) -> list[str]:
        """The names of the fallback chain's devices, in order (empty without a chain)."""
        return list(self._breakers)

    def watch(self, signal: Signal) -> None:
        """Fire ``signal`` whenever a breaker changes state."""
        self._signals.append(signal)

    def unwatch(self, signal: Signal) -> None:
        """Stop firing ``signal`` (its model is unloaded)."""
        self._signals = [s for s in self._signals if s is not signal]

    def statistics(self, workers: tuple[WorkerStatistics, ...]) -> tuple[DeviceStatistics, ...]:
        """Each device's availability and breaker: the chain's, or those ``workers`` use."""
        names = list(self._breakers) or sorted({w.device for w in workers})
        devices = []
        for name in names:
            breaker = self._breakers.get(name)
            devices.append(
                DeviceStatistics(
                    name=name,
                    available=name not in self._unavailable,
                    reason=self._unavailable.get(name, ""),
                    breaker=breaker.statistics() if breaker is not None else None,
                )
            )
        return tuple(devices)

    def _mark_unavailable(self, name: str, reason: str) -> None:
        if name in self._unavailable:
            return
        self._unavailable[name] = reason
        log.warning("device %s is unavailable: %s; skipping it", name, reason)
        self._events.emit("device_unavailable", f"device:{name}", reason)

    def _breaker_changed(
        self, breaker: CircuitBreaker, before: BreakerState, after: BreakerState, cause: str
    ) -> None:
        level = logging.WARNING if after == "open" else logging.INFO
        log.log(level, "device %s breaker %s -> %s: %s", breaker.name, before, after, cause)
        self._events.emit(f"breaker_{after}", f"device:{breaker.name}", cause, previous=before)
        for signal in self._signals:
            signal.fire()
