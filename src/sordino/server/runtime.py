"""The runtime: the one core behind every protocol.

It loads models into backends, gives each model version a scheduler, and runs a
decoded request through validation, admission and scheduling to a response. HTTP
and gRPC handlers are thin shells over :meth:`Runtime.infer` (and, for streaming
models, ``server/streaming.py``'s :func:`stream_responses`, built on :meth:`Runtime.admit`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sordino.admission.chain import AdmissionChain, AdmissionContext, default_links
from sordino.backends.base import Backend, dummy_inputs
from sordino.clock import Clock, MonotonicClock
from sordino.config import RuntimeConfig
from sordino.errors import ModelNotReady, NotFound, ShuttingDown, SordinoError, Unsupported
from sordino.events import EventSink
from sordino.execution.chain import ChainExecutor
from sordino.inference import InferRequest, InferResponse, ModelKey, ModelMetadata, Tensor
from sordino.models.repository import ModelSource
from sordino.protocol.validate import validate_request
from sordino.records import SchedulerStatistics
from sordino.scheduling.modes import BatchCurve, build_controller, measure_batch_curve
from sordino.scheduling.scheduler import ModelScheduler
from sordino.scheduling.settings import ModelScheduling, scheduling_for
from sordino.server.streaming import stream_spec_for
from sordino.telemetry.execution_metrics import ExecutionCollector
from sordino.telemetry.hub import Telemetry
from sordino.telemetry.metrics import Metrics
from sordino.telemetry.model_stats import ModelStats

__all__ = ["LoadedModel", "Runtime"]

log = logging.getLogger("sordino.runtime")


@dataclass(slots=True)
class LoadedModel:
    """One served model version."""

    source: ModelSource
    key: ModelKey
    metadata: ModelMetadata
    scheduling: ModelScheduling
    scheduler: ModelScheduler
    curve: BatchCurve | None = None
    backends: list[Backend] = field(default_factory=list)
    instances: int = 1

    @property
    def max_batch_size(self) -> int:
        return self.scheduling.max_batch_size


class Runtime:
    """Loads models and serves inference requests through their schedulers."""

    def __init__(
        self,
        config: RuntimeConfig,
        sources: Sequence[ModelSource],
        *,
        clock: Clock | None = None,
        events: EventSink | None = None,
    ) -> None:
        self.config = config
        self.clock: Clock = clock or MonotonicClock()
        self.events = events or EventSink()
        self.metrics = Metrics()
        self.stats = ModelStats()
        self.executor = ChainExecutor(config, clock=self.clock, events=self.events)
        self.admission = AdmissionChain(default_links())
        self.telemetry = Telemetry(
            config.telemetry,
            events=self.events,
            registry=self.metrics.registry,
            models=self.scheduler_statistics,
            instances=self.executor.instances,
            slo_s=lambda key: config.scheduler.slo_p99_ms / 1000,
            clock=self.clock,
        )
        self._sources = list(sources)
        self._models: dict[str, dict[str, LoadedModel]] = {}
        self._priority_rules = {r.tag: r.priority for r in config.scheduler.priority_rules}
        self._started = False
        self._stopping = False
        self.metrics.watch_schedulers(self.scheduler_statistics)
        self.metrics.registry.register(ExecutionCollector(self.executor.statistics))
        # The arena's fragmentation and use reach the journal, the monitor and the dashboard.
        self.telemetry.resources.add_pool("shm_arena", self.executor.arena_statistics)

    # -- lifecycle -------------------------------------------------------------------

    async def start(self, on_loaded: Callable[[LoadedModel], None] | None = None) -> None:
        """Load every model source; call ``on_loaded`` after each one is serving."""
        await self.telemetry.start()
        for source in self._sources:
            model = await self.load(source)
            if on_loaded is not None:
                on_loaded(model)
        self._started = True
        self.events.emit("server_started", "runtime", models=len(self._sources))

    async def stop(self, *, drain: bool = True, timeout_s: float | None = None) -> None:
        """Stop every scheduler and unload every model.

        New requests are refused at once. With ``drain`` queued requests still run;
        those not finished within ``timeout_s`` end with an explicit ShuttingDown
        error. Nothing accepted is left without an answer.
        """
        self._stopping = True
        models = self.models()
        if models:
            closing = [asyncio.ensure_future(m.scheduler.close(drain=drain)) for m in models]
            _, pending = await asyncio.wait(closing, timeout=timeout_s)
            if pending:
                for model in models:
                    await model.scheduler.close(drain=False)
                await asyncio.gather(*pending)
        for model in models:
            await self.unload(model.key.name, model.key.version, drain=False)
        await self.executor.aclose()
        self.events.emit("server_stopped", "runtime")
        await self.telemetry.stop()

    @property
    def stopping(self) -> bool:
        """True once shutdown has started: new requests are refused."""
        return self._stopping

    @property
    def ready(self) -> bool:
        """True once every model has loaded and until shutdown starts."""
        return self._started and not self._stopping

    async def load(self, source: ModelSource) -> LoadedModel:
        """Load one model version, warm it up, and start its scheduler."""
        key = ModelKey(source.name, source.version)
        if source.version in self._models.get(source.name, {}):
            raise ModelNotReady(f"model {key} is already loaded")
        config = source.config
        metadata = await self.executor.load(key, source.path, config)
        instances = self.executor.instances(key)
        if config.streaming is not None:
            spec = stream_spec_for(config.streaming, metadata)
            metadata = dataclasses.replace(metadata, stream=spec)
        scheduling = scheduling_for(
            self.config.scheduler, config, batched=metadata.batched, instances=instances
        )
        try:
            await self.executor.run(key, dummy_inputs(metadata, 1))  # warm-up
            curve = None
            if scheduling.mode in ("auto", "hybrid") and scheduling.policy.max_batch > 1:

                async def run(rows: int) -> None:
                    await self.executor.run(key, dummy_inputs(metadata, rows))

                curve = await measure_batch_curve(run, self.clock, scheduling.policy.max_batch)
        except Exception:
            await self.executor.unload(key)
            raise
        controller = build_controller(scheduling.mode, scheduling.policy, scheduling.slo_s, curve)
        scheduler = ModelScheduler(
            key,
            batched=metadata.batched,
            executor=self.executor,
            controller=controller,
            settings=scheduling.queue,
            clock=self.clock,
            observers=(self.metrics, self.stats, self.telemetry.series),
        )
        scheduler.start()
        model = LoadedModel(
            source, key, metadata, scheduling, scheduler, curve,
            self.executor.local_backends(key), instances,
        )  # fmt: skip
        self._models.setdefault(source.name, {})[source.version] = model
        self.events.emit(
            "model_loaded",
            str(key),
            mode=controller.statistics().effective_mode,
            max_batch=scheduling.policy.max_batch,
            instances=instances,
            isolation=config.isolation,
            slo_p99_ms=scheduling.slo_s * 1000,
        )
        return model

    async def unload(self, name: str, version: str, *, drain: bool = True) -> None:
        """Stop serving one model version; queued requests finish first when ``drain``."""
        versions = self._models.get(name, {})
        model = versions.pop(version, None)
        if model is None:
            raise NotFound(f"model {name!r} version {version!r} is not loaded")
        if not versions:
            self._models.pop(name, None)
        await model.scheduler.close(drain=drain)
        await self.executor.unload(model.key)
        self.stats.forget(model.key)
        self.events.emit("model_unloaded", str(model.key))

    # -- lookup ----------------------------------------------------------------------

    def models(self) -> list[LoadedModel]:
        """Every loaded model version, by name then version."""
        return [
            model
            for name in sorted(self._models)
            for _, model in sorted(self._models[name].items(), key=lambda kv: _version_key(kv[0]))
        ]

    def get(self, name: str, version: str | None = None) -> LoadedModel:
        """Return the model version to serve (the highest loaded when ``version`` is None)."""
        if self._stopping:
            raise ShuttingDown("the server is shutting down; retry on another replica")
        versions = self._models.get(name)
        if not versions:
            known = ", ".join(sorted(self._models)) or "none"
            raise NotFound(f"unknown model {name!r}; loaded models: {known}")
        if version is None or version == "":
            return versions[max(versions, key=_version_key)]
        model = versions.get(version)
        if model is None:
            raise NotFound(
                f"model {name!r} has no version {version!r}; loaded versions: "
                f"{', '.join(sorted(versions, key=_version_key))}"
            )
        return model

    def versions(self, name: str) -> list[str]:
        """Return the loaded versions of ``name``, ascending."""
        return sorted(self._models.get(name, {}), key=_version_key)

    # -- the request path ------------------------------------------------------------

    def admit(self, request: InferRequest) -> tuple[LoadedModel, AdmissionContext]:
        """Find the model, validate ``request`` against it and run admission.

        Returns the model and the admission decisions (priority, deadline); raises the
        :class:`SordinoError` that refuses the request. Nothing is queued yet.
        """
        try:
            model = self.get(request.model, request.version)
            validate_request(request, model.metadata, max_batch_size=model.max_batch_size)
            context = self.admission.admit(
                request,
                AdmissionContext(
                    model=request.model,
                    settings=model.scheduling.queue,
                    priority_rules=self._priority_rules,
                ),
            )
        except SordinoError as exc:
            self._refused(request, exc)
            raise
        return model, context

    async def infer(self, request: InferRequest) -> InferResponse:
        """Validate, admit, queue and run one request; return its response.

        Raises a :class:`SordinoError` whose class says what went wrong; the
        protocol layer maps it to a status. A streaming model is refused: its
        responses come from ``server/streaming.py``'s ``stream_responses``.
        """
        model, context = self.admit(request)
        if model.metadata.stream is not None:
            error = Unsupported(
                f"model {model.key.name!r} streams its responses (one per step); use "
                "ModelStreamInfer over gRPC or POST "
                f"/v2/models/{model.key.name}/generate_stream over HTTP"
            )
            self._refused(request, error)
            raise error
        try:
            item = model.scheduler.submit(
                request.inputs,
                priority=context.priority,
                timeout_s=context.timeout_s,
                request_id=request.id,
            )
        except SordinoError as exc:  # queue full, shutting down: never accepted
            self._refused(request, exc)
            raise
        try:
            outputs = await model.scheduler.result(item)
        except BaseException as exc:
            outcome = "cancelled" if isinstance(exc, asyncio.CancelledError) else "failure"
            self.telemetry.request_finished(
                request.model, _tenant(request), context.priority, outcome
            )
            raise
        self.telemetry.request_finished(
            request.model, _tenant(request), context.priority, "success"
        )
        return self.response(model, request, outputs)

    def _refused(self, request: InferRequest, error: SordinoError) -> None:
        self.metrics.request_rejected(request.model, error.reason)
        self.telemetry.request_finished(request.model, _tenant(request), 0, "rejected")

    def response(
        self, model: LoadedModel, request: InferRequest, outputs: dict[str, Tensor]
    ) -> InferResponse:
        """Build the response to ``request`` from ``outputs``: the outputs it asked for."""
        wanted = [o.name for o in request.outputs] if request.outputs else None
        chosen = {
            spec.name: outputs[spec.name]
            for spec in model.metadata.outputs
            if wanted is None or spec.name in wanted
        }
        return InferResponse(
            model=model.key.name,
            version=model.key.version,
            outputs=chosen,
            output_datatypes={spec.name: spec.datatype for spec in model.metadata.outputs},
            id=request.id,
        )

    # -- statistics ------------------------------------------------------------------

    def scheduler_statistics(self) -> list[SchedulerStatistics]:
        """Return every loaded model's scheduler statistics."""
        return [model.scheduler.statistics() for model in self.models()]

    def triton_statistics(self, name: str | None = None, version: str | None = None) -> Any:
        """Return Triton's statistics-extension JSON for one model or all of them."""
        if name is None:
            keys = [m.key for m in self.models()]
        elif version:
            keys = [self.get(name, version).key]
        else:
            self.get(name)
            keys = [ModelKey(name, v) for v in self.versions(name)]
        return self.stats.triton_json(keys)


def _tenant(request: InferRequest) -> str:
    tenant = request.parameters.get("tenant") or request.headers.get("x-sordino-tenant")
    return tenant if isinstance(tenant, str) and tenant else "default"


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (1 << 62, version)
