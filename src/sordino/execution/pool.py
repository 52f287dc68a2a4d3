"""The instance pool: each loaded model's instances on its devices, started and stopped.

:class:`InstancePool` loads a model (``instance_count`` instances on each device of its
chain that is available), unloads it, scales its first tier and answers which instances
a model has. Instances come from an injected :data:`InstanceFactory`: the executor's
own makes worker processes or threads (``execution/instances.py``), the Ray executor's
makes actors. Running batches on them is the dispatcher's job (``execution/dispatch.py``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sordino.backends.base import Backend
from sordino.backends.registry import check_backend_kind
from sordino.config import ModelConfig
from sordino.errors import ModelLoadError, ModelNotReady
from sordino.events import EventSink
from sordino.execution.devices import Device
from sordino.execution.outliers import OutlierDetector
from sordino.execution.placement import Instance, PlacedModel, Placement, Signal, TierSlot
from sordino.execution.thread_instance import ThreadInstance
from sordino.inference import ModelKey, ModelMetadata

__all__ = ["InstanceFactory", "InstancePool"]

InstanceFactory = Callable[[ModelKey, int, str, Device, Path, ModelConfig, Signal], Instance]
"""Makes instance ``index`` of a model: (key, index, tier, device, path, config, the
model's signal, fired when an instance changes state)."""


class InstancePool:
    """The instances of every loaded model, by tier (device) of its chain."""

    def __init__(
        self,
        factory: InstanceFactory,
        *,
        placement: Placement,
        outliers: OutlierDetector,
        events: EventSink,
    ) -> None:
        self._factory = factory
        self._placement = placement
        self._outliers = outliers
        self._events = events
        self.models: dict[tuple[ModelKey, int], PlacedModel] = {}
        """Each loaded model, by :attr:`ModelKey.slot`: a version being reloaded has two
        (the one serving and the one warming up), told apart by their generation."""
        self.sources: dict[tuple[ModelKey, int], tuple[Path, ModelConfig]] = {}
        """Where each loaded model came from (what :meth:`scale` starts more of)."""

    async def load(self, key: ModelKey, path: Path, config: ModelConfig) -> ModelMetadata:
        """Start ``config.instance_count`` instances of ``key`` on each device it runs on."""
        if key.slot in self.models:
            raise ModelLoadError(f"model {key} is already loaded")
        check_backend_kind(config.backend, model=str(key))
        model_signal = Signal()
        slots: list[TierSlot] = []
        opening: list[tuple[TierSlot, Instance]] = []
        index = 0
        for tier, slot in self._placement.tiers(config):
            for device in tier.devices:
                if not self._placement.available(device.name):
                    continue
                for _ in range(config.instance_count):
                    instance = self._factory(
                        key, index, tier.name, device, path, config, model_signal
                    )
                    opening.append((slot, instance))
                    index += 1
            slots.append(slot)
        results = await self._open_all([instance for _, instance in opening])
        metadata: ModelMetadata | None = None
        errors: list[str] = []
        for (slot, instance), result in zip(opening, results, strict=True):
            if isinstance(result, BaseException):
                errors.append(f"{instance.device.name}: {result}")
                self._placement.open_failed(instance.device.name, str(result))
                await instance.aclose()
                continue
            metadata = metadata or result
            slot.instances.append(instance)
            self._started(key, instance, "model loaded")
        if metadata is None:
            raise ModelLoadError(f"model {key} could not start on any device: {_listed(errors)}")
        tiers = [slot for slot in slots if slot.instances]
        self.models[key.slot] = PlacedModel(key, config.isolation, metadata, tiers, model_signal)
        self.sources[key.slot] = (path, config)
        self._placement.watch(model_signal)
        return metadata

    async def unload(self, key: ModelKey) -> None:
        """Stop every instance of ``key``."""
        model = self.models.pop(key.slot, None)
        self.sources.pop(key.slot, None)
        if model is None:
            return
        self._placement.unwatch(model.signal)
        self._outliers.forget(key)
        await asyncio.gather(*(i.aclose() for i in model.instances()))
        model.signal.fire()  # waiters find no serving instance and fail explicitly

    def entry(self, key: ModelKey) -> PlacedModel | None:
        """Loaded model ``key`` (that generation of it), or None."""
        return self.models.get(key.slot)

    def reported(self) -> list[PlacedModel]:
        """The loaded models as statistics show them: one per version. While a version
        is reloaded, the load that came first (serving, then draining) until it is gone:
        the two loads' instances share their names (model, version, index)."""
        first: dict[ModelKey, PlacedModel] = {}
        for entry in self.models.values():
            seen = first.get(entry.key)
            if seen is None or entry.key.generation < seen.key.generation:
                first[entry.key] = entry
        return list(first.values())

    def instances(self, model: ModelKey) -> int:
        """How many instances ``model`` has on its largest tier (0: not loaded)."""
        entry = self.models.get(model.slot)
        if entry is None:
            return 0
        return max(len(tier.instances) for tier in entry.tiers)

    def metadata(self, model: ModelKey) -> ModelMetadata:
        return self.model(model).metadata

    def local_backends(self, model: ModelKey) -> list[Backend]:
        """The backends of ``model`` that run in this process (thread isolation), in order."""
        entry = self.models.get(model.slot)
        if entry is None:
            return []
        return [inst.backend for inst in entry.instances() if isinstance(inst, ThreadInstance)]

    def model(self, key: ModelKey) -> PlacedModel:
        """Loaded model ``key``; :class:`ModelNotReady` when it is not loaded."""
        model = self.models.get(key.slot)
        if model is None:
            raise ModelNotReady(
                f"Request for unknown model: '{key.name}' version {key.version} is not at "
                f"ready state (sordino: model {key} has no loaded instance)"
            )
        return model

    def serving(self, key: ModelKey) -> int:
        """How many instances of ``key`` can take a batch now."""
        entry = self.models.get(key.slot)
        return sum(1 for i in entry.instances() if i.serving) if entry is not None else 0

    def find_model(self, name: str) -> ModelKey | None:
        """The loaded version of model ``name`` (the newest when several are; of a
        version being reloaded, its newest load), or None."""
        keys = sorted(
            (entry.key for entry in self.models.values() if entry.key.name == name),
            key=lambda k: (k.version, k.generation),
        )
        return keys[-1] if keys else None

    async def tell_log(self, settings: dict[str, Any]) -> None:
        """Every worker process and Ray actor of every model logs as the server now does
        (a thread instance logs with the server)."""
        told = [
            tell(settings)
            for entry in self.models.values()
            for instance in entry.instances()
            if (tell := getattr(instance, "tell_log", None)) is not None
        ]
        await asyncio.gather(*told)

    def instance(self, key: ModelKey, index: int) -> Instance | None:
        """Instance ``index`` of ``key``, or None."""
        entry = self.models.get(key.slot)
        if entry is None:
            return None
        return next((i for i in entry.instances() if i.index == index), None)

    async def scale(
        self, key: ModelKey, delta: int, *, minimum: int, maximum: int
    ) -> list[Instance]:
        """Add (``delta`` > 0) or remove instances of ``key`` on its first tier.

        The count stays within ``minimum``..``maximum``. Returns the instances added
        (serving, after their worker started) or removed (stopped).
        """
        entry = self.model(key)
        path, config = self.sources[key.slot]
        slot = entry.tiers[0]
        count = len(slot.instances)
        target = max(minimum, min(maximum, count + delta))
        if target > count:
            base = max(i.index for i in entry.instances()) + 1
            device = slot.instances[0].device
            fresh = [
                self._factory(key, base + n, slot.name, device, path, config, entry.signal)
                for n in range(target - count)
            ]
            results = await self._open_all(fresh)
            added: list[Instance] = []
            for instance, result in zip(fresh, results, strict=True):
                if isinstance(result, BaseException):
                    # As at load: with a chain, a device that cannot start an instance
                    # is skipped from now on.
                    self._placement.open_failed(instance.device.name, str(result))
                    await instance.aclose()
                    self._events.emit("worker_start_failed", instance.subject, str(result))
                    continue
                slot.instances.append(instance)
                added.append(instance)
                self._started(key, instance, "scaled up")
            entry.signal.fire()
            return added
        removed = sorted(slot.instances, key=lambda i: (i.busy, -i.index))[: count - target]
        for instance in removed:
            slot.instances.remove(instance)
        await asyncio.gather(*(i.aclose() for i in removed))
        for instance in removed:
            self._events.emit(
                "worker_stopped", instance.subject, "scaled down", version=key.version
            )
        entry.signal.fire()
        return removed

    async def _open_all(self, instances: list[Instance]) -> list[ModelMetadata | BaseException]:
        """Open ``instances`` together: each one's metadata, or why it could not start.

        Interrupted (the server stops), it stops the workers already spawned (or
        spawning) before the cancellation goes on."""
        try:
            return await asyncio.gather(*(i.open() for i in instances), return_exceptions=True)
        except asyncio.CancelledError:
            await asyncio.gather(*(i.aclose() for i in instances), return_exceptions=True)
            raise

    def _started(self, key: ModelKey, instance: Instance, cause: str) -> None:
        """Tell the events an instance of ``key`` serves now (``worker_started``)."""
        self._events.emit(
            "worker_started",
            instance.subject,
            cause,
            version=key.version,
            device=instance.device.name,
            isolation=instance.isolation,
            pid=instance.statistics().pid,
        )


def _listed(errors: list[str]) -> str:
    """Each instance's error once, with how many instances gave it when several did."""
    counts = Counter(errors)
    return "; ".join(e if counts[e] == 1 else f"{e} ({counts[e]} instances)" for e in counts)
