"""The default executor: model instances on a chain of devices, behind circuit breakers.

``await executor.run(model, batch)`` stays the one call the scheduler makes. Behind
it, for each batch:

1. The batch is staged: its tensors are copied once into the shared-memory arena
   (batches the scheduler assembled with :meth:`ChainExecutor.assemble` are already
   there), and blocks are reserved for outputs whose size is known in advance.
2. A tier is chosen: the first device of the chain whose breaker lets traffic
   through and that has a serving instance. The batch waits for an idle instance
   there (a busy primary is not a failing primary).
3. If the model raises there, the failure feeds the device's breaker and the batch is
   retried at once on the next device of the chain; the time this costs is measured
   as the switch time. If the instance itself is lost (crash, hang, timeout), the
   batch is retried once on another serving instance while the lost one restarts.

Only when every device failed does the batch fail, with the last error.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sordino.backends.base import Backend
from sordino.clock import Clock
from sordino.config import ModelConfig, RuntimeConfig, parse_threshold
from sordino.datatypes import to_numpy_dtype
from sordino.errors import (
    InferenceFailed,
    InvalidRequest,
    ModelLoadError,
    ModelNotReady,
    NotFound,
    Unavailable,
)
from sordino.events import EventSink
from sordino.execution.breaker import CircuitBreaker
from sordino.execution.devices import Device, Tier, chain_devices, missing_provider, model_tiers
from sordino.execution.faults import FaultRegistry, FaultSpec, Target, parse_target
from sordino.execution.instances import ProcessInstance, StagedBatch, ThreadInstance
from sordino.execution.profiling import Profiled, ProfileTraces, profile_instances
from sordino.execution.stats import SwitchRecorder
from sordino.execution.worker import WorkerError, WorkerLost
from sordino.execution.worker_main import WorkerSpec
from sordino.inference import ModelKey, ModelMetadata, Tensor
from sordino.memory.allocator import Block
from sordino.memory.arena import Arena, shm_free_bytes
from sordino.memory.tensors import TensorHandle, tensor_nbytes, write_tensor
from sordino.records import ArenaStatistics, BreakerState, DeviceStatistics, ExecutionStatistics

__all__ = ["ChainExecutor"]

log = logging.getLogger("sordino.execution")

Instance = ProcessInstance | ThreadInstance


class _Signal:
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
class _TierSlot:
    name: str
    breaker: CircuitBreaker | None
    instances: list[Instance]


@dataclass(slots=True)
class _Model:
    key: ModelKey
    isolation: str
    metadata: ModelMetadata
    tiers: list[_TierSlot]
    signal: _Signal


class ChainExecutor:
    """Runs batches on worker processes (or threads) across a device fallback chain."""

    def __init__(self, config: RuntimeConfig, *, clock: Clock, events: EventSink) -> None:
        self._config = config
        self._clock = clock
        self._events = events
        self._settings = config.workers
        self.faults = FaultRegistry(clock, events)
        self._models: dict[ModelKey, _Model] = {}
        self._arena: Arena | None = None
        self._assembled: dict[int, tuple[Tensor, Block]] = {}
        self._switches = SwitchRecorder()
        self._retries = 0
        self._unavailable: dict[str, str] = {}
        self._profiling: set[ModelKey] = set()
        self._breakers: dict[str, CircuitBreaker] = {}
        self._chain = chain_devices(config)
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

    # -- loading ---------------------------------------------------------------------

    async def load(self, key: ModelKey, path: Path, config: ModelConfig) -> ModelMetadata:
        """Start ``config.instance_count`` instances of ``key`` on each device it runs on."""
        if key in self._models:
            raise ModelLoadError(f"model {key} is already loaded")
        model_signal = _Signal()
        slots: list[_TierSlot] = []
        opening: list[tuple[_TierSlot, Instance]] = []
        index = 0
        for tier in model_tiers(config, self._chain):
            slot = _TierSlot(tier.name, self._breakers.get(tier.name), [])
            for device in tier.devices:
                if device.name in self._unavailable:
                    continue
                for _ in range(config.instance_count):
                    instance = self._instance(key, index, tier, device, path, config, model_signal)
                    opening.append((slot, instance))
                    index += 1
            slots.append(slot)
        results = await asyncio.gather(
            *(inst.open() for _, inst in opening), return_exceptions=True
        )
        metadata: ModelMetadata | None = None
        errors: list[str] = []
        for (slot, instance), result in zip(opening, results, strict=True):
            if isinstance(result, BaseException):
                errors.append(f"{instance.device.name}: {result}")
                if self._chain is not None:
                    self._mark_unavailable(instance.device.name, str(result))
                await instance.aclose()
                continue
            metadata = metadata or result
            slot.instances.append(instance)
            self._events.emit(
                "worker_started",
                instance.subject,
                "model loaded",
                version=key.version,
                device=instance.device.name,
                isolation=instance.isolation,
                pid=instance.statistics().pid,
            )
        if metadata is None:
            raise ModelLoadError(f"model {key} could not start on any device: {'; '.join(errors)}")
        tiers = [slot for slot in slots if slot.instances]
        self._models[key] = _Model(key, config.isolation, metadata, tiers, model_signal)
        return metadata

    def _instance(
        self,
        key: ModelKey,
        index: int,
        tier: Tier,
        device: Device,
        path: Path,
        config: ModelConfig,
        model_signal: _Signal,
    ) -> Instance:
        if config.isolation == "thread":
            return ThreadInstance(key, index, tier.name, device, str(path))
        spec = WorkerSpec(
            model=key.name,
            version=key.version,
            index=index,
            path=str(path),
            providers=device.providers,
            target=device.target,
            intra_op_threads=device.intra_op_threads,
            arena=self._open_arena().name,
            heartbeat_s=max(0.02, min(1.0, self._settings.heartbeat_timeout / 5)),
            warmup_batches=self._settings.warmup_batches,
        )
        return ProcessInstance(
            key,
            index,
            tier.name,
            device,
            spec,
            settings=self._settings,
            clock=self._clock,
            events=self._events,
            notify=model_signal.fire,
        )

    def _open_arena(self) -> Arena:
        if self._arena is None:
            size = self._settings.shared_memory
            free = shm_free_bytes()
            if free is not None and free < size:
                log.warning(
                    "/dev/shm has %d bytes free, less than workers.shared_memory (%d); using %d",
                    free,
                    size,
                    free // 2,
                )
                size = max(4096, free // 2)
            self._arena = Arena(size)
        return self._arena

    async def unload(self, key: ModelKey) -> None:
        """Stop every instance of ``key``."""
        model = self._models.pop(key, None)
        if model is None:
            return
        await asyncio.gather(*(i.aclose() for t in model.tiers for i in t.instances))
        model.signal.fire()  # waiters find no serving instance and fail explicitly

    async def aclose(self) -> None:
        """Stop every instance and remove the arena."""
        for key in list(self._models):
            await self.unload(key)
        self._assembled.clear()
        if self._arena is not None:
            self._arena.close()

    def instances(self, model: ModelKey) -> int:
        entry = self._models.get(model)
        if entry is None:
            return 0
        return max(len(tier.instances) for tier in entry.tiers)

    def metadata(self, model: ModelKey) -> ModelMetadata:
        return self._model(model).metadata

    def arena_statistics(self) -> ArenaStatistics | None:
        """The shared-memory arena's figures, or None before a worker process needs it."""
        return self._arena.statistics() if self._arena is not None else None

    def local_backends(self, model: ModelKey) -> list[Backend]:
        """The backends of ``model`` that run in this process (thread isolation), in order."""
        entry = self._models.get(model)
        if entry is None:
            return []
        return [
            inst.backend
            for tier in entry.tiers
            for inst in tier.instances
            if isinstance(inst, ThreadInstance)
        ]

    def _model(self, key: ModelKey) -> _Model:
        model = self._models.get(key)
        if model is None:
            raise ModelNotReady(f"model {key} has no loaded instance")
        return model

    # -- staging ---------------------------------------------------------------------

    async def assemble(
        self, model: ModelKey, parts: Sequence[dict[str, Tensor]]
    ) -> dict[str, Tensor]:
        """Concatenate request inputs into one batch, in the arena for worker processes."""
        entry = self._models.get(model)
        batch: dict[str, Tensor] = {}
        for name in parts[0]:
            arrays = [part[name] for part in parts]
            first = arrays[0]
            if entry is None or entry.isolation != "process" or first.dtype == np.object_:
                batch[name] = np.concatenate(arrays)
                continue
            shape = (sum(a.shape[0] for a in arrays), *first.shape[1:])
            nbytes = math.prod(shape) * first.dtype.itemsize
            arena = self._open_arena()
            block = await arena.acquire(nbytes)
            view: Tensor = np.ndarray(shape, first.dtype, arena.buffer, block.offset)
            np.concatenate(arrays, out=view)
            self._assembled[view.ctypes.data] = (view, block)
            batch[name] = view
        return batch

    async def _stage(self, model: _Model, batch: dict[str, Tensor]) -> StagedBatch:
        staged = StagedBatch(arrays=batch)
        if model.isolation != "process":
            return staged
        arena = self._open_arena()
        staged.buffer = arena.buffer
        for name, array in batch.items():
            owned = self._assembled.pop(array.ctypes.data, None) if array.size else None
            if owned is not None and owned[0] is array:
                block = owned[1]
                staged.blocks.append(block)
                staged.handles[name] = TensorHandle(
                    block.offset, int(array.nbytes), array.dtype.str, tuple(array.shape), block.size
                )
                continue
            block = await arena.acquire(tensor_nbytes(array))
            staged.blocks.append(block)
            staged.handles[name] = write_tensor(arena.buffer, block.offset, block.size, array)
        rows = int(next(iter(batch.values())).shape[0]) if model.metadata.batched else 1
        for spec in model.metadata.outputs:
            dims = spec.item_shape if model.metadata.batched else spec.shape
            if spec.datatype == "BYTES" or any(d < 0 for d in dims):
                continue
            size = rows * math.prod(dims) * to_numpy_dtype(spec.datatype).itemsize
            block = await arena.acquire(size)
            staged.blocks.append(block)
            staged.space[spec.name] = TensorHandle.space(block)

        async def allocate(sizes: dict[str, int]) -> dict[str, TensorHandle]:
            space = {}
            for name, size in sizes.items():
                block = await arena.acquire(size)
                staged.blocks.append(block)
                space[name] = TensorHandle.space(block)
            return space

        staged.allocate = allocate
        return staged

    # -- running ---------------------------------------------------------------------

    async def run(self, model: ModelKey, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        entry = self._model(model)
        staged = await self._stage(entry, batch)
        try:
            return await self._dispatch(entry, staged)
        finally:
            self._release(staged)

    def _release(self, staged: StagedBatch) -> None:
        if self._arena is not None:
            for block in staged.blocks:
                self._arena.release(block)

    async def _dispatch(self, model: _Model, batch: StagedBatch) -> dict[str, Tensor]:
        tried: set[str] = set()
        lost: set[int] = set()
        failed_at: float | None = None
        failed_tier = ""
        last_error = ""
        while True:
            choice = await self._choose(model, tried, lost)
            if choice is None:
                raise InferenceFailed(
                    f"model {model.key} failed on every device it runs on: {last_error}"
                )
            slot, instance = choice
            probe = slot.breaker.begin() if slot.breaker is not None else False
            fault = self.faults.pick(model.key.name, instance.index, instance.device.name)
            started = self._clock.now()
            dispatch_s = started - failed_at if failed_at is not None else 0.0
            try:
                outputs = await instance.run(batch, fault)
            except (WorkerError, WorkerLost) as exc:
                now = self._clock.now()
                cause = exc.cause if isinstance(exc, WorkerLost) else str(exc)
                last_error = cause
                if slot.breaker is not None:
                    slot.breaker.record(False, now - started, probe=probe, cause=cause)
                if isinstance(exc, WorkerLost):
                    lost.add(instance.index)
                    if len(lost) > 1:
                        raise InferenceFailed(
                            f"model {model.key}: the batch lost two instances ({cause})"
                        ) from None
                    self._retries += 1
                    self._events.emit(
                        "batch_retried", instance.subject, cause, device=instance.device.name
                    )
                else:
                    tried.add(slot.name)
                    if len(model.tiers) == 1:
                        raise InferenceFailed(
                            f"model {model.key} failed on a batch: {cause}"
                        ) from None
                if failed_at is None:
                    failed_at, failed_tier = now, slot.name
                continue
            finally:
                instance.busy = False
                model.signal.fire()
            now = self._clock.now()
            if slot.breaker is not None:
                slot.breaker.record(True, now - started, probe=probe)
            if failed_at is not None and slot.name != failed_tier:
                switch_s = now - failed_at
                self._switches.record(model.key.name, failed_tier, slot.name, switch_s, dispatch_s)
                self._events.emit(
                    "device_switch",
                    str(model.key),
                    last_error,
                    from_device=failed_tier,
                    to_device=slot.name,
                    switch_s=switch_s,
                    dispatch_s=dispatch_s,
                )
            return outputs

    async def _choose(
        self, model: _Model, tried: set[str], lost: set[int]
    ) -> tuple[_TierSlot, Instance] | None:
        """Wait for an idle serving instance on the best tier; None when none is left.

        Instances that already lost this batch are passed over while another serves.
        """
        while True:
            live = [
                slot
                for slot in model.tiers
                if slot.name not in tried
                and any(i.serving or i.state in ("starting", "restarting") for i in slot.instances)
            ]
            if not live:
                return None

            others = any(i.serving and i.index not in lost for s in live for i in s.instances)
            usable = {
                id(i)
                for s in live
                for i in s.instances
                if i.serving and (i.index not in lost or not others)
            }
            serving = [s for s in live if any(id(i) in usable for i in s.instances)]
            allowed = [s for s in serving if s.breaker is None or s.breaker.allows()]
            candidates = allowed or serving
            if candidates:
                for instance in candidates[0].instances:
                    if id(instance) in usable and not instance.busy:
                        instance.busy = True
                        return candidates[0], instance
            await model.signal.wait()

    # -- profiling -------------------------------------------------------------------

    async def profile(
        self,
        model: ModelKey,
        *,
        seconds: float,
        trace_dir: Path,
        synthetic_batch: Callable[[], dict[str, Tensor]],
    ) -> ProfileTraces:
        """Profile every instance of ``model`` for ``seconds``; see ``execution/profiling``.

        Worker processes and thread instances alike; zero-filled ``synthetic_batch()``
        batches run on the profiling instances (past the breakers and faults) when no
        live batch ran. Raises :class:`Unavailable` when no instance left a trace, or
        while ``model`` is being profiled already (one window at a time per model).
        """
        entry = self._model(model)
        if model in self._profiling:
            raise Unavailable(f"model {model} is being profiled already; retry when that ends")
        instances = [i for tier in entry.tiers for i in tier.instances]

        async def run_synthetic(instance: Profiled) -> object:
            assert isinstance(instance, ProcessInstance | ThreadInstance)
            return await self._run_on(entry, instance, synthetic_batch())

        self._profiling.add(model)
        try:
            return await profile_instances(
                str(model),
                instances,
                seconds=seconds,
                trace_dir=trace_dir,
                clock=self._clock,
                run_synthetic=run_synthetic,
            )
        finally:
            self._profiling.discard(model)

    async def _run_on(
        self, model: _Model, instance: Instance, batch: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """Run ``batch`` on ``instance`` once idle; :class:`WorkerLost` if it stops serving."""
        while instance.busy and instance.serving:
            await model.signal.wait()
        if not instance.serving:
            raise WorkerLost(f"{instance.subject} is {instance.state}, not serving")
        instance.busy = True
        try:
            staged = await self._stage(model, batch)
            try:
                return await instance.run(staged, None)
            finally:
                self._release(staged)
        finally:
            instance.busy = False
            model.signal.fire()

    # -- devices and breakers --------------------------------------------------------

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
        for model in self._models.values():
            model.signal.fire()

    # -- chaos (the control interface the admin API uses) ----------------------------

    def inject_fault(
        self,
        target: str,
        kind: str,
        *,
        rate: float = 1.0,
        latency_s: float = 0.2,
        duration_s: float | None = None,
    ) -> FaultSpec:
        """Inject a fault after checking that its target exists."""
        parsed = parse_target(target)
        self._check_target(parsed, kind)
        return self.faults.inject(
            parsed, kind, rate=rate, latency_s=latency_s, duration_s=duration_s
        )

    def _check_target(self, target: Target, kind: str) -> None:
        instances = [i for m in self._models.values() for t in m.tiers for i in t.instances]
        if target.kind == "device":
            names = sorted({i.device.name for i in instances} | set(self._breakers))
            if target.name not in names:
                raise NotFound(f"no device {target.name!r}; devices: {', '.join(names)}")
            chosen = [i for i in instances if i.device.name == target.name]
        else:
            chosen = [i for i in instances if i.key.name == target.name]
            if not chosen:
                names = sorted({i.key.name for i in instances})
                raise NotFound(f"no model {target.name!r} is loaded; models: {', '.join(names)}")
            if target.index is not None:
                chosen = [i for i in chosen if i.index == target.index]
                if not chosen:
                    raise NotFound(f"model {target.name!r} has no instance {target.index}")
        if kind in ("crash", "hang") and any(i.isolation == "thread" for i in chosen):
            raise InvalidRequest(
                f"a {kind} fault needs process isolation; {target} includes thread-isolated "
                "instances, which run inside the server"
            )

    # -- statistics ------------------------------------------------------------------

    def statistics(self) -> ExecutionStatistics:
        workers = tuple(
            instance.statistics()
            for model in self._models.values()
            for tier in model.tiers
            for instance in tier.instances
        )
        devices = []
        names = list(self._breakers) or sorted({w.device for w in workers})
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
        return ExecutionStatistics(
            workers=workers,
            devices=tuple(devices),
            switches=self._switches.statistics(),
            retries=self._retries,
            arena=self._arena.statistics() if self._arena is not None else None,
            faults_active=len(self.faults.active()),
            faults_applied=self.faults.applied,
        )
