"""The default executor: model instances on a chain of devices, behind circuit breakers.

``await executor.run(model, parts, context) -> outputs`` is the one call the scheduler
makes, with each request's inputs as one part and the batch's
:class:`~sordino.execution.batch.BatchContext`, which goes down with the staged batch
(``StagedBatch.context``) to staging, the chaos faults and the instances. Behind it,
for each batch:

1. The batch is staged (``execution/staging.py``): inputs already in the
   shared-memory arena go to the worker by reference, others are copied in once, and
   blocks are reserved for outputs whose size is known in advance. The outputs come
   back as views of those blocks (a :class:`~sordino.memory.refs.Tensors` that holds
   them); nothing is copied out.
2. A tier is chosen (``execution/placement.py``): the first device of the chain whose
   breaker lets traffic through and that has a serving instance. The batch waits for
   an idle instance there (a busy primary is not a failing primary).
3. If the model raises there, the failure feeds the device's breaker and the batch is
   retried at once on another instance of the device, if one serves (an instance
   whose batches others run is ejected for a while, ``execution/outliers.py``), then
   on the next device of the chain; the time this costs is measured
   as the switch time. If the instance itself is lost (crash, hang, timeout), the
   batch is retried once on another serving instance while the lost one restarts;
   when no other instance serves, on the restarted one (if it serves again within
   ``workers.start_timeout``).

Only when every device failed does the batch fail, with the last error.

:class:`ChainExecutor` stages batches and composes the parts that do the rest, each
with one job: the instance pool (``execution/pool.py``: load, unload, scale, with
the instance factory injected, :meth:`ChainExecutor._instance` here, Ray actors in
``ray_executor.py``), the dispatcher (``execution/dispatch.py``: steps 2-3 above),
the controls the guardian and the admin API use (``execution/controls.py``: restarts,
device switches, warm-up, chaos faults, profiling windows) and the statistics
(``execution/stats.py``). Its public methods are the callers' one interface to them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sordino.backends.base import Backend
from sordino.backends.registry import run_options
from sordino.clock import Clock
from sordino.config import ModelConfig, RuntimeConfig
from sordino.errors import InferenceFailed
from sordino.events import EventSink
from sordino.execution.batch import NO_CONTEXT, BatchContext
from sordino.execution.controls import ExecutorControls
from sordino.execution.decoupled import ResponseChannel
from sordino.execution.devices import Device
from sordino.execution.dispatch import Dispatcher
from sordino.execution.executor import MemoryFit
from sordino.execution.faults import FaultRegistry, FaultSpec
from sordino.execution.instances import ProcessInstance
from sordino.execution.model_calls import CallServer
from sordino.execution.outliers import OutlierDetector
from sordino.execution.placement import Instance, Placement, Signal
from sordino.execution.pool import InstancePool
from sordino.execution.profiling import ProfileTraces
from sordino.execution.staging import Staging, row_bytes
from sordino.execution.stats import worker_memory
from sordino.execution.thread_instance import ThreadInstance
from sordino.execution.worker_main import WorkerSpec
from sordino.inference import ModelKey, ModelMetadata, Tensor
from sordino.memory.arena import Arena
from sordino.memory.owner import ArenaOwner
from sordino.memory.refs import Tensors
from sordino.memory.segments import SEGMENTS_DIR
from sordino.records import (
    ArenaStatistics,
    ExecutionStatistics,
    NodeMemoryStatistics,
    WorkerMemory,
)

__all__ = ["ChainExecutor"]


class ChainExecutor:
    """Runs batches on worker processes (or threads) across a device fallback chain."""

    def __init__(
        self,
        config: RuntimeConfig,
        *,
        clock: Clock,
        events: EventSink,
        arena: ArenaOwner | None = None,
    ) -> None:
        """``arena`` is the memory manager's :class:`~sordino.memory.owner.ArenaOwner`
        (``MemoryManager.owner``), which holds the arena batches are staged in; without
        one (an executor on its own) the executor makes one and removes its arena in
        :meth:`aclose`."""
        self._config = config
        self._clock = clock
        self._events = events
        self._settings = config.workers
        self.faults = FaultRegistry(clock, events)
        self._own_arena = arena is None
        if arena is None:
            arena = ArenaOwner(
                self._settings.shared_memory,
                registry=config.server.data_dir / SEGMENTS_DIR,
                memory=config.memory,
            )
        self._arena = arena
        self._staging = Staging(arena)
        self.overflow = arena.overflow
        self._placement = Placement(config, clock=clock, events=events)
        self._outliers = OutlierDetector(
            self._settings.outlier_ejection, clock=clock, events=events
        )
        self._dispatcher = Dispatcher(
            config,
            clock=clock,
            events=events,
            faults=self.faults,
            outliers=self._outliers,
            staging=self._staging,
        )
        self._pool = InstancePool(
            self._instance, placement=self._placement, outliers=self._outliers, events=events
        )
        self._controls = ExecutorControls(
            self._pool,
            placement=self._placement,
            faults=self.faults,
            dispatcher=self._dispatcher,
            clock=clock,
        )
        self._model_calls: CallServer | None = None

    def serve_model_calls(self, server: CallServer | None) -> None:
        """Answer the calls models make to other models (BLS) with ``server`` from now on
        (instances already running included)."""
        self._model_calls = server

    def _call_server(self) -> CallServer | None:
        return self._model_calls

    # -- loading ---------------------------------------------------------------------

    async def load(self, key: ModelKey, path: Path, config: ModelConfig) -> ModelMetadata:
        """Start ``config.instance_count`` instances of ``key`` on each device it runs on."""
        return await self._pool.load(key, path, config)

    def _instance(
        self,
        key: ModelKey,
        index: int,
        tier: str,
        device: Device,
        path: Path,
        config: ModelConfig,
        model_signal: Signal,
    ) -> Instance:
        if config.isolation == "thread":
            return ThreadInstance(
                key,
                index,
                tier,
                device,
                str(path),
                run=run_options(config),
                calls=self._call_server,
                execution_timeout=self._settings.execution_timeout,
                start_timeout=self._settings.start_timeout,
            )
        spec = WorkerSpec(
            model=key.name,
            version=key.version,
            index=index,
            path=str(path),
            run=run_options(config),
            providers=device.providers,
            target=device.target,
            intra_op_threads=device.intra_op_threads,
            arena=self._arena.arena.name,
            heartbeat_s=max(0.02, min(1.0, self._settings.heartbeat_timeout / 5)),
            warmup_batches=self._settings.warmup_batches,
            nice=self._settings.nice,
        )
        return ProcessInstance(
            key,
            index,
            tier,
            device,
            spec,
            settings=self._settings,
            clock=self._clock,
            events=self._events,
            notify=model_signal.fire,
            calls=self._call_server,
        )

    async def unload(self, key: ModelKey) -> None:
        """Stop every instance of ``key``."""
        await self._pool.unload(key)

    async def aclose(self) -> None:
        """Stop every instance; remove the arena if this executor made it (else its
        owner, the memory manager, does)."""
        for entry in list(self._pool.models.values()):
            await self.unload(entry.key)
        if self._own_arena:
            self._arena.close()

    def instances(self, model: ModelKey) -> int:
        return self._pool.instances(model)

    def tiers(self, model: ModelKey) -> int:
        """How many tiers of its device chain ``model`` has instances on (0: none)."""
        entry = self._pool.entry(model)
        return len(entry.tiers) if entry is not None else 0

    def metadata(self, model: ModelKey) -> ModelMetadata:
        return self._pool.metadata(model)

    def arena_statistics(self) -> ArenaStatistics | None:
        """The shared-memory arena's figures, or None before a worker process needs it."""
        return self._arena.statistics()

    @property
    def staging(self) -> Staging:
        """Where batches enter the arena."""
        return self._staging

    def memory_fit(self, model: ModelKey, part: Mapping[str, Tensor]) -> MemoryFit | None:
        """How rows like ``part``'s fit the arena (None: thread isolation).

        Without overflow protection ``free`` is the arena's whole size: batches are not
        shrunk to the space free now, but never made larger than the arena, and a
        request larger than the arena is still refused (it could never run).
        """
        entry = self._pool.entry(model)
        if entry is None or entry.isolation != "process":
            return None
        arena = self._arena.existing()
        capacity = self._arena.capacity()
        free = capacity
        if arena is not None and self._arena.protected:
            free = arena.allocator.largest_free()
        return MemoryFit(row_bytes(part, entry.metadata), free, capacity, self.overflow)

    def local_backends(self, model: ModelKey) -> list[Backend]:
        """The backends of ``model`` that run in this process (thread isolation), in order."""
        return self._pool.local_backends(model)

    async def readiness(self, model: ModelKey) -> str | None:
        """Why ``model`` is not ready by its own word (Triton's ``is_ready()``), or None.

        Each serving instance whose model checks its readiness is asked, all at once; the
        first (by index) that says no, fails or does not answer in time says why. Whether
        any instance serves at all is :func:`sordino.server.guarding.unready`'s to say.
        """
        entry = self._pool.entry(model)
        if entry is None:
            return None
        asked = [i for i in entry.instances() if i.serving and i.checks_ready]
        answers = await asyncio.gather(*(i.readiness() for i in asked))
        said = zip(asked, answers, strict=True)
        return next((f"instance {i.index}: {why}" for i, why in said if why), None)

    # -- running ---------------------------------------------------------------------

    def input_arena(self, model: ModelKey) -> Arena | None:
        """The arena ``model``'s batches are staged in (None for thread isolation).

        Tensors already there (placed with :class:`~sordino.memory.refs.TensorsBuilder`)
        reach the worker without a copy when they run as a batch of their own.
        """
        entry = self._pool.entry(model)
        if entry is None or entry.isolation != "process":
            return None
        return self._arena.arena

    async def run(
        self,
        model: ModelKey,
        parts: Sequence[Mapping[str, Tensor]],
        context: BatchContext = NO_CONTEXT,
    ) -> Tensors:
        """Run ``parts`` (each request's inputs) as one batch; return its outputs.

        The parts stay the caller's; the outputs are the caller's to release (for a
        worker process they are views of arena blocks that they hold).
        """
        entry = self._pool.model(model)
        staged = await self._staging.stage(
            parts, entry.metadata, in_arena=entry.isolation == "process", context=context
        )
        try:
            return self._staging.outputs(staged, await self._dispatcher.dispatch(entry, staged))
        finally:
            self._staging.release(staged)

    async def run_decoupled(
        self,
        model: ModelKey,
        parts: Sequence[Mapping[str, Tensor]],
        channel: ResponseChannel,
        context: BatchContext = NO_CONTEXT,
    ) -> None:
        """Run ``parts`` as one batch of a decoupled model; its responses go to ``channel``.

        Returns once the model's ``execute`` returned (the instance is free for another
        batch); responses may come after. The requests still open when
        ``workers.execution_timeout`` has passed end with an error (see
        ``execution/decoupled.py``). Raises as :meth:`run` does when the batch failed;
        a batch that has streamed a response is never run again elsewhere.
        """
        entry = self._pool.model(model)
        if not entry.metadata.decoupled:
            raise InferenceFailed(f"model {model} is not decoupled; it answers through run()")
        staged = await self._staging.stage(
            parts, entry.metadata, in_arena=entry.isolation == "process", context=context
        )
        staged.channel = channel
        channel.limit(self._clock, self._settings.execution_timeout)
        try:
            await self._dispatcher.dispatch(entry, staged)
        finally:
            self._staging.release(staged)

    # -- profiling -------------------------------------------------------------------

    async def profile(
        self,
        model: ModelKey,
        *,
        seconds: float,
        trace_dir: Path,
        synthetic_batch: Callable[[], dict[str, Tensor]],
    ) -> ProfileTraces:
        """Profile every instance of ``model`` for ``seconds``
        (:meth:`ExecutorControls.profile`)."""
        return await self._controls.profile(
            model, seconds=seconds, trace_dir=trace_dir, synthetic_batch=synthetic_batch
        )

    async def tell_log(self, settings: dict[str, Any]) -> None:
        """The models' worker processes log as the server now does (the logging
        extension changed it; ``telemetry/log_settings.py``)."""
        await self._pool.tell_log(settings)

    # -- the guardian's controls ------------------------------------------------------

    def serving(self, key: ModelKey) -> int:
        """How many instances of ``key`` can take a batch now."""
        return self._pool.serving(key)

    @property
    def has_device_chain(self) -> bool:
        """True when a fallback chain gives models more than one device to run on."""
        return len(self._placement.chain) > 1

    def find_model(self, name: str) -> ModelKey | None:
        """The loaded version of model ``name`` (the newest when several are), or None."""
        return self._pool.find_model(name)

    def instance(self, key: ModelKey, index: int) -> Instance | None:
        """Instance ``index`` of ``key``, or None."""
        return self._pool.instance(key, index)

    async def restart_instance(self, key: ModelKey, index: int, *, cause: str) -> bool:
        """Replace instance ``index`` of ``key`` with a fresh worker; False if it cannot
        (:meth:`ExecutorControls.restart_instance`)."""
        return await self._controls.restart_instance(key, index, cause=cause)

    async def scale(
        self, key: ModelKey, delta: int, *, minimum: int, maximum: int
    ) -> list[Instance]:
        """Add (``delta`` > 0) or remove instances of ``key`` on its first tier.

        The count stays within ``minimum``..``maximum``. Returns the instances added
        (serving, after their worker started) or removed (stopped).
        """
        return await self._pool.scale(key, delta, minimum=minimum, maximum=maximum)

    def switch_device(self, key: ModelKey, *, cause: str) -> tuple[str, str] | None:
        """Open the breaker of the device serving ``key`` now; (from, to) or None
        (:meth:`ExecutorControls.switch_device`)."""
        return self._controls.switch_device(key, cause=cause)

    def restore_device(self, key: ModelKey, device: str, *, cause: str) -> bool:
        """Close the breaker :meth:`switch_device` opened on ``device``; False if not open."""
        return self._controls.restore_device(key, device, cause=cause)

    async def warm_up(self, key: ModelKey, instance: Instance, batches: int) -> int:
        """Run ``batches`` zero-filled one-row batches on ``instance``; return how many ran."""
        return await self._controls.warm_up(key, instance, batches)

    # -- chaos (the control interface the admin API uses) ----------------------------

    def inject_fault(
        self,
        target: str,
        kind: str,
        *,
        rate: float = 1.0,
        latency_s: float = 0.2,
        duration_s: float | None = None,
        celsius: float | None = None,
        tenant: str | None = None,
    ) -> FaultSpec:
        """Inject a fault after checking that its target exists (see ``check_target``)."""
        return self._controls.inject_fault(
            target,
            kind,
            rate=rate,
            latency_s=latency_s,
            duration_s=duration_s,
            celsius=celsius,
            tenant=tenant,
        )

    # -- statistics ------------------------------------------------------------------

    def worker_memory(self) -> tuple[WorkerMemory, ...]:
        """Per worker process: its resident memory and its ONNX Runtime arenas
        (:func:`~sordino.execution.stats.worker_memory`)."""
        return worker_memory(i for model in self._pool.reported() for i in model.instances())

    def node_memory(self) -> tuple[NodeMemoryStatistics, ...]:
        """The Ray nodes' memory pools: none here (:class:`RayExecutor` has them)."""
        return ()

    def statistics(self) -> ExecutionStatistics:
        workers = tuple(
            instance.statistics()
            for model in self._pool.reported()
            for instance in model.instances()
        )
        return ExecutionStatistics(
            workers=workers,
            devices=self._placement.statistics(workers),
            switches=self._dispatcher.switches.statistics(),
            retries=self._dispatcher.retries,
            arena=self._arena.statistics(),
            faults_active=len(self.faults.active()),
            faults_applied=self.faults.applied,
            outliers=self._outliers.statistics(),
            arena_bytes=self._staging.bytes_copied,
        )
