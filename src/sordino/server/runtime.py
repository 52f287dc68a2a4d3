"""The runtime: the composition root that builds the serving core and runs its lifecycle.

It wires the parts together and owns start and stop; it holds no request logic:

- :class:`~sordino.server.registry.ModelRegistry` — the loaded model versions;
- :class:`~sordino.server.loader.ModelLoader` — model source → served version, and back;
- :class:`~sordino.server.service.InferenceService` — the request path the HTTP and
  gRPC transports call (validation, admission, the scheduler, responses);
- the executor (worker instances on a device chain), telemetry (metrics, series,
  journal) and the admission chain.

A few one-line delegates (``infer``, ``get``, ``load``, …) keep embedding code and
tests short; the transports use ``runtime.service``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any

from sordino.admission.chain import AdmissionChain, default_links
from sordino.admission.gate import TrafficGate
from sordino.admission.tenants import Tenants
from sordino.clock import Clock, MonotonicClock
from sordino.config import RuntimeConfig
from sordino.config.pipelines import nodes_first
from sordino.control.admin import admin_token
from sordino.errors import ModelLoadError, SordinoError
from sordino.events import EventSink
from sordino.execution.chain import ChainExecutor
from sordino.execution.ray_executor import RayExecutor
from sordino.generation.degrade import StepDegrader
from sordino.generation.metrics import GenerationCollector
from sordino.generation.pipeline import Pipeline, check_denoiser
from sordino.guardian import Guardian
from sordino.inference import InferRequest, InferResponse, ModelKey, Tensor
from sordino.memory.manager import MemoryManager
from sordino.memory.planner import StepPlanner
from sordino.memory.refs import Tensors
from sordino.memory.segments import SEGMENTS_DIR, StaleSegment, remove_stale_segments
from sordino.models.repository import ModelSource
from sordino.records import SchedulerStatistics
from sordino.server.ensemble_control import serve_pipeline
from sordino.server.guarding import open_guardian, versions_ready
from sordino.server.inference_parts import InferenceParts
from sordino.server.loader import LOAD_CONCURRENCY, ModelLoader
from sordino.server.model_calls import ModelCalls
from sordino.server.pipelines import outer_first, pipeline_statistics
from sordino.server.quant_guard import QuantGuard
from sordino.server.registry import LoadedModel, ModelRegistry
from sordino.server.response_cache import ResponseCache
from sordino.server.result_cache import ResultCache
from sordino.server.service import InferenceService
from sordino.server.shm import SystemSharedMemory
from sordino.server.tracing import Tracer
from sordino.telemetry.execution_metrics import ExecutionCollector
from sordino.telemetry.hub import Telemetry
from sordino.telemetry.labels import MetricLabels
from sordino.telemetry.memory_metrics import MemoryCollector
from sordino.telemetry.metrics import Metrics
from sordino.telemetry.model_metrics import ModelMetricsCollector, model_metrics_dir
from sordino.telemetry.model_stats import ModelStats
from sordino.telemetry.observers import SchedulerObservers
from sordino.telemetry.pipeline_metrics import PipelineCollector
from sordino.telemetry.tenant_metrics import TenantCollector
from sordino.telemetry.timings import TimingSeries
from sordino.telemetry.triton_metrics import TritonCollector

__all__ = ["LoadedModel", "Runtime"]

log = logging.getLogger("sordino")


class Runtime:
    """Builds the serving core for ``config`` and ``sources``; starts and stops it."""

    def __init__(
        self,
        config: RuntimeConfig,
        sources: Sequence[ModelSource],
        *,
        clock: Clock | None = None,
        events: EventSink | None = None,
    ) -> None:
        if config.tenants:
            # A tenant's memory_quota is a memory.quotas entry for every part that reads them,
            # and blocks are zeroed before changing hands (unless memory.zero_on_free says no).
            memory = config.memory_with_tenant_quotas
            if memory.zero_on_free is None:
                memory = memory.model_copy(update={"zero_on_free": True})
            config = config.model_copy(update={"memory": memory})
        self.config = config
        self.clock: Clock = clock or MonotonicClock()
        self.events = events or EventSink()
        self.registry = ModelRegistry()
        # Client-chosen model names and tenants never make unbounded label values.
        labels = MetricLabels(
            self.registry.has,
            # Configured tenants are labels too: their names are the operator's, not a client's.
            (*config.telemetry.tenant_labels, *(t.name for t in config.tenants)),
        )
        self.metrics = Metrics(labels)
        self.stats = ModelStats()
        # Tensor lifetime planning of multi-step requests (a scheduler observer).
        self.step_plans = StepPlanner()
        # The memory manager owns the arena; the executor stages batches in it.
        self.memory = MemoryManager(
            config.memory,
            clock=self.clock,
            events=self.events,
            capacity=config.workers.shared_memory,
            registry=config.server.data_dir / SEGMENTS_DIR,
            forecast=lambda: self.telemetry.forecast,
            plans=self.step_plans.statistics,
            pools={
                model: (policy.node, policy.memory_pool)
                for model, policy in config.node_policies.items()
                if policy.memory_pool is not None
            },
        )
        executor = RayExecutor if config.executor.kind == "ray" else ChainExecutor
        self.executor = executor(
            config, clock=self.clock, events=self.events, arena=self.memory.owner
        )
        self.memory.watch(self.executor)  # framework memory per worker, Ray node pools
        self.telemetry = Telemetry(
            config.telemetry,
            events=self.events,
            registry=self.metrics.registry,
            models=self.registry.scheduler_statistics,
            instances=self.executor.instances,
            slo_s=lambda key: config.scheduler.slo_p99_ms / 1000,
            clock=self.clock,
            labels=labels,
        )
        # Body read times and lateness per second, for the guardian's triggers.
        self.timings = TimingSeries()
        # Off unless the guardian's cache_recent_results turns it on for a model.
        self.result_cache = ResultCache()
        # Each tenant has its own regions while tenants are configured (self.tenants, below).
        self.shared_memory = SystemSharedMemory(isolated=lambda: self.tenants.enabled)
        """Clients' registered system shared-memory regions (Triton's extension)."""
        # One observer per scheduler, calling only the stores that use each event.
        self.observers = (
            SchedulerObservers(
                self.metrics, self.stats, self.telemetry.series, self.telemetry.availability,
                self.telemetry.recent_requests, self.timings, self.step_plans,
                self.memory,  # incremental compaction at batch boundaries
            ),
        )  # fmt: skip
        self.pipelines: list[LoadedModel] = []
        size = config.server.response_cache_size
        self.response_cache = ResponseCache(size) if size else None
        """Triton's response cache, for the models that enable it (``--cache-config``)."""
        self.loader = ModelLoader(
            config,
            executor=self.executor,
            registry=self.registry,
            observers=self.observers,
            stats=self.stats,
            clock=self.clock,
            events=self.events,
            make_pipeline=self._make_pipeline,
            response_cache=self.response_cache,
        )
        # Quantized models checked against their float reference (--quant-aware).
        self.quant_guard = QuantGuard(
            config.quant_guard,
            events=self.events,
            registry=self.metrics.registry,
            load=self.loader.load,
            unload=self.loader.unload,
            run=self._run_model,
            sleep=self.clock.sleep,
        )
        # Degrade instead of drop, for every iterative model (the guardian's degrade_steps).
        self.step_degrader = StepDegrader()
        # The guardian's hand on admission: throttle, shed, skip non-critical.
        self.gate = TrafficGate(
            config.self_healing.non_critical_tags, exempt=config.guardian.exclude_models
        )
        self.guardian: Guardian | None = None
        # Who a request is (its API key) and its tenant's limits (docs/tenants.md).
        self.tenants = Tenants(
            config.tenants,
            required=config.auth.required,
            admin_keys=config.auth.admin_keys,
            admin_token=admin_token(config.server.admin_token),
            breaker=config.auth.breaker,
            clock=self.clock.now,
        )
        self.service = InferenceService(
            self.registry,
            admission=AdmissionChain(
                [*default_links(), self.tenants.cap_priority, self.gate, self.tenants]
            ),
            priority_rules={r.tag: r.priority for r in config.scheduler.priority_rules},
            metrics=self.metrics,
            stats=self.stats,
            telemetry=self.telemetry,
            # Ray node pools charge memory.quotas per node, per batch (execution/ray_pool.py).
            quotas=self.memory.quotas if config.memory.quotas and not _node_pools(config) else None,
            learn=self.memory.learn if config.memory.enabled else None,
            tenants=self.tenants,
            pools=self.memory.pools if self.memory.pools.statistics(limited_only=True) else None,
            response_cache=self.response_cache,
        )
        self.service.tracer = Tracer(config.server.trace, self.registry.has)
        # What the inference endpoints use of all this, and nothing else.
        self.inference = InferenceParts(
            self.service, self.registry, self.tenants, self.shared_memory,
            self.result_cache, self.timings, config.server.max_request_size,
        )  # fmt: skip
        # Python models' calls to other models (BLS) take the service's path.
        self.model_calls = ModelCalls(  # model control: later
            self.service, self.registry, lambda name, version: versions_ready(self, name, version)
        )
        serve_model_calls = getattr(self.executor, "serve_model_calls", None)
        if serve_model_calls is not None:  # not the Ray executor: its models cannot call
            serve_model_calls(self.model_calls)
        self._sources = list(sources)
        self._started = False
        self.failed_at_start: dict[str, str] = {}
        """Models left out at start (``server.exit_on_error`` false): their errors by
        name, until one loads (model control takes them in)."""
        self.metrics.watch_schedulers(self.registry.scheduler_statistics)
        self.metrics.registry.register(ExecutionCollector(self.executor.statistics))
        # Bandwidth through the arena and the worker hop, and each instance's busy share.
        self.telemetry.utilisation.watch(self.executor.statistics)
        self.metrics.registry.register(MemoryCollector(self.memory.statistics))
        self.metrics.registry.register(TenantCollector(self.tenants.statistics))
        # Python models' custom metrics: their workers write snapshots where this reads.
        self.metrics.registry.register(ModelMetricsCollector(model_metrics_dir()))
        cache = self.response_cache
        self.metrics.registry.register(
            TritonCollector(self.stats, self._queued, cache.statistics if cache else None)
        )
        self.metrics.registry.register(
            PipelineCollector(lambda: pipeline_statistics(self.pipelines))
        )
        self.metrics.registry.register(
            GenerationCollector(
                self.step_degrader,
                lambda: [m.pipeline for m in self.registry.models() if m.pipeline is not None],
            )
        )
        # The arena's fragmentation and use reach the journal, the monitor and the dashboard.
        self.telemetry.resources.add_pool("shm_arena", self.executor.arena_statistics)
        watch_node_pools = getattr(self.executor, "watch_node_pools", None)
        if watch_node_pools is not None:  # the Ray executor: each node's pool, as it appears
            watch_node_pools(self.telemetry.resources.add_pool)
        # A chaos temperature fault stands in for the sensor (tests without hardware).
        self.telemetry.resources.temperature_override = self.executor.faults.temperature

    # -- iterative models --------------------------------------------------------------

    def _make_pipeline(self, model: LoadedModel) -> Pipeline:
        """The generator in front of an iterative model's denoiser (see ``generation/``)."""
        config = model.source.config.iterative
        assert config is not None
        denoiser = model.metadata
        check_denoiser(model.key, config, denoiser)
        key = model.key
        if config.export is not None:
            from sordino.generation.stable_diffusion import StableDiffusion
            from sordino.generation.stable_diffusion_3 import StableDiffusion3
            from sordino.generation.stable_diffusion_xl import StableDiffusionXL
            from sordino.models.diffusers_export import export_kind

            encoder = self.registry.get(config.text_encoder or "").metadata.input("input_ids")
            timestep = denoiser.input(config.timestep_input)
            kind: type[StableDiffusion] = StableDiffusion
            if export_kind(config.export) == "sd3":
                kind = StableDiffusion3
            elif config.text_encoder_2:
                kind = StableDiffusionXL
            return kind(
                key,
                config,
                scheduler=model.scheduler,
                arena=lambda: self.executor.input_arena(key),
                degrader=self.step_degrader,
                run_model=self._run_model,
                description=model.source.description,
                reuse_policy=self.config.memory.reuse_strategy,
                input_ids_dtype=encoder.datatype if encoder is not None else "INT64",
                timestep_dtype=timestep.datatype if timestep is not None else "FP32",
            )
        return Pipeline(
            key,
            config,
            scheduler=model.scheduler,
            arena=lambda: self.executor.input_arena(key),
            degrader=self.step_degrader,
            run_model=self._run_model,
            description=model.source.description,
            reuse_policy=self.config.memory.reuse_strategy,
        )

    async def _run_model(self, name: str, inputs: Mapping[str, Tensor]) -> Tensors:
        """Run a pre or post model of a pipeline (text encoder, decoder) once."""
        model = self.registry.get(name)
        return await model.scheduler.infer(
            Tensors.of(inputs), priority=model.scheduling.queue.default_priority
        )

    # -- lifecycle -------------------------------------------------------------------

    async def start(self, on_loaded: Callable[[LoadedModel], None] | None = None) -> None:
        """Load every model source; call ``on_loaded`` after each one is serving.

        The models' instances start concurrently (one model at a time on the Ray
        executor), then each model is warmed up and registered in the order given
        (:meth:`ModelLoader.load_all`).

        First the shared-memory segments left in ``server.data_dir`` by a server that
        ended without closing them (SIGKILL, a crash) are removed, each reported.
        """
        self.remove_stale_segments()
        healing = self.config.guardian
        if not healing.enabled and (healing.triggers or healing.alert_channels):
            log.warning(
                "self_healing lists %d trigger(s) and %d alert channel(s) but the guardian "
                "is off (enabled: false or --guardian-mode false), so none acts or is sent "
                "to: drop them, or start with --guardian-mode true",
                len(healing.triggers),
                len(healing.alert_channels),
            )
        if healing.enabled:
            # Built first: an action this build cannot carry out fails start-up at once.
            self.guardian = open_guardian(self)
        await self.telemetry.start()
        await self.memory.start()
        self._sources = await self.quant_guard.screen(self._sources)
        # The Ray executor checks that a model's actors fit beside those of the models
        # loaded before it (RayExecutor._check_fits): its models start one at a time.
        concurrency = 1 if self.config.executor.kind == "ray" else LOAD_CONCURRENCY
        failed = None if self.config.server.exit_on_error else self.failed_at_start
        await self.loader.load_all(self._sources, on_loaded, concurrency=concurrency, failed=failed)
        self._check_nodes()
        for pipeline in nodes_first(self.config.pipelines):
            serve_pipeline(self, pipeline)
        self._started = True
        self.quant_guard.start()
        self.events.emit("server_started", "runtime", models=len(self._sources))
        if self.guardian is not None:
            await self.guardian.start()

    def _check_nodes(self) -> None:
        """Refuse a top-level node whose model is not served (a fixed set of models), or
        note it (the model may be loaded later, explicit and poll modes)."""
        for node in self.config.nodes:
            if self.registry.versions(node.model_name):
                continue
            message = (
                f"node {node.name}: no model {node.model_name!r} is loaded; a node's policy is "
                "that of the served model it names: add the model (models: [{name: "
                f"{node.model_name}, path: ...}}]) or name a served one with the node's model:"
            )
            if self.config.server.model_control_mode == "none":
                raise ModelLoadError(message)
            log.warning("%s (it applies once the model is loaded)", message)

    async def stop(self, *, drain: bool = True, timeout_s: float | None = None) -> None:
        """Stop every scheduler and unload every model.

        New requests are refused at once. With ``drain`` queued requests still run;
        those not finished within ``timeout_s`` (one budget for pipelines and models
        together) end with an explicit ShuttingDown error, running batches included
        (they are cancelled, whatever they wait for). Nothing accepted is left without
        an answer, and the drain never outlasts ``timeout_s``.
        """
        self.registry.stopping = True
        deadline = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s

        def left() -> float | None:
            if deadline is None:
                return None
            return max(0.0, deadline - asyncio.get_running_loop().time())

        await self.quant_guard.stop()
        if self.guardian is not None:
            await self.guardian.stop()
        # Pipelines drain first, an ensemble before those it runs (which stay registered
        # for it meanwhile): their requests still need the node models.
        for layer in outer_first(self.pipelines):
            for pipeline in layer:
                self.registry.remove(pipeline.key.name, pipeline.key.version)
            closing = [asyncio.ensure_future(p.scheduler.close(drain=drain)) for p in layer]
            _, pending = await asyncio.wait(closing, timeout=left())
            for pipeline in layer if pending else ():
                await pipeline.scheduler.close(drain=False)
            await asyncio.gather(*closing, return_exceptions=True)
        self.pipelines.clear()
        models = self.registry.models()
        if models:
            closing = [asyncio.ensure_future(m.scheduler.close(drain=drain)) for m in models]
            _, pending = await asyncio.wait(closing, timeout=left())
            if pending:
                for model in models:
                    await model.scheduler.close(drain=False)
                await asyncio.gather(*pending, return_exceptions=True)
        for model in models:
            await self.loader.unload(model.key.name, model.key.version, drain=False)
        await self.memory.stop()
        await self.executor.aclose()
        self.memory.close()  # the arena, once no worker maps it
        self.events.emit("server_stopped", "runtime")
        await self.telemetry.stop()
        self.service.tracer.close()  # the traces not yet written

    def remove_stale_segments(self) -> list[StaleSegment]:
        """Remove the arena segments of dead servers on this data dir; log and report each."""
        removed = remove_stale_segments(self.config.server.data_dir / SEGMENTS_DIR)
        for segment in removed:
            size = f"{segment.size_bytes / 2**20:.0f} MiB" if segment.size_bytes else "?"
            cause = f"left by pid {segment.pid}, which is gone"
            if segment.removed:
                log.warning("removed shared-memory segment %s (%s) %s", segment.name, size, cause)
            else:
                log.info("removed the record of shared-memory segment %s (%s)", segment.name, cause)
            self.events.emit(
                "stale_segment_removed",
                segment.name,
                cause,
                pid=segment.pid,
                size_bytes=segment.size_bytes,
                segment_existed=segment.removed,
            )
        return removed

    @property
    def stopping(self) -> bool:
        """True once shutdown has started: new requests are refused."""
        return self.registry.stopping

    @property
    def ready(self) -> bool:
        """True once every model has loaded (or was left out) and until shutdown starts."""
        return self._started and not self.registry.stopping

    def left_out(self) -> dict[str, str]:
        """The models left out at start that keep the server not ready (Triton's
        ``--strict-readiness``, ``server.strict_readiness``): their errors by name."""
        return self.failed_at_start if self.config.server.strict_readiness else {}

    # -- delegates -------------------------------------------------------------------

    def use_config(self, config: RuntimeConfig) -> None:
        """Serve under ``config`` from now on (hot reconfiguration, ``server/reconfigure.py``).

        Models loaded later are scheduled under it; the running parts are retuned by
        the reconfigurer itself.
        """
        self.config = config
        self.loader.use_config(config)

    async def load(self, source: ModelSource) -> LoadedModel:
        """Load one model version (see :class:`ModelLoader`)."""
        return await self.loader.load(source)

    async def unload(self, name: str, version: str, *, drain: bool = True) -> None:
        """Stop serving one model version (see :class:`ModelLoader`)."""
        await self.loader.unload(name, version, drain=drain)

    def models(self) -> list[LoadedModel]:
        return self.registry.models()

    def get(self, name: str, version: str | None = None) -> LoadedModel:
        return self.registry.get(name, version)

    def versions(self, name: str) -> list[str]:
        return self.registry.versions(name)

    def scheduler_statistics(self) -> list[SchedulerStatistics]:
        return self.registry.scheduler_statistics()

    async def infer(self, request: InferRequest) -> InferResponse:
        """Run one request (see :meth:`InferenceService.infer`); release the response."""
        return await self.service.infer(request)

    def responses(
        self, request: InferRequest
    ) -> AsyncGenerator[tuple[InferResponse | SordinoError, bool], None]:
        return self.service.responses(request)

    def _queued(self) -> list[tuple[ModelKey, int]]:
        """Each loaded model version and its requests queued now."""
        return [(m.key, m.scheduler.queued) for m in self.registry.models()]

    def triton_statistics(self, name: str | None = None, version: str | None = None) -> Any:
        return self.service.triton_statistics(name, version)


def _node_pools(config: RuntimeConfig) -> bool:
    """Whether the Ray executor's node pools account memory (and its quotas) per node."""
    return config.executor.kind == "ray" and config.executor.node_pool
