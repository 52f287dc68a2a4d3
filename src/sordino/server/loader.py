"""The load pipeline: a model source becomes a served model version, and back.

Loading starts the model's instances (the executor), checks a step model's
``streaming:`` configuration against it (:func:`stream_spec_for`), derives its
scheduling (mode, batch policy, queue policy), warms it up with one real batch,
measures its batch-latency curve when the mode needs one, starts its scheduler and
registers it. Unloading drains the scheduler, stops the instances and forgets the
model's statistics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sordino.backends.base import dummy_inputs
from sordino.backends.registry import backend_kind
from sordino.clock import Clock
from sordino.config import RuntimeConfig
from sordino.config.models import ModelConfig, StreamingConfig
from sordino.errors import ModelLoadError, SordinoError
from sordino.events import EventSink
from sordino.execution.chain import ChainExecutor
from sordino.inference import ModelKey, ModelMetadata, StreamSpec, Tensor
from sordino.models.checksums import verify_checksums
from sordino.models.repository import ModelSource
from sordino.records import SchedulerObserver
from sordino.scheduling.backlog import StreamBudget
from sordino.scheduling.modes import build_controller, measure_batch_curve
from sordino.scheduling.scheduler import ModelScheduler
from sordino.scheduling.settings import scheduling_for
from sordino.server.classification import read_labels
from sordino.server.node_policy import node_policy
from sordino.server.registry import LoadedModel, ModelRegistry
from sordino.server.response_cache import ResponseCache, warn_uncached
from sordino.server.sequences import sequences_for
from sordino.telemetry.model_stats import ModelStats

if TYPE_CHECKING:
    from sordino.generation.pipeline import Pipeline

__all__ = ["LOAD_CONCURRENCY", "ModelLoader", "completed", "node_policy", "stream_spec_for"]

log = logging.getLogger("sordino")

LOAD_CONCURRENCY = 4
"""Models whose instances start at the same time in :meth:`ModelLoader.load_all`
(Triton's default ``--model-load-thread-count``): enough to overlap the worker
processes' start-up on a few cores without starting hundreds of processes at once."""


class ModelLoader:
    """Loads model versions into the executor and the registry, and unloads them."""

    def __init__(
        self,
        config: RuntimeConfig,
        *,
        executor: ChainExecutor,
        registry: ModelRegistry,
        observers: Sequence[SchedulerObserver],
        stats: ModelStats,
        clock: Clock,
        events: EventSink,
        make_pipeline: Callable[[LoadedModel], Pipeline] | None = None,
        response_cache: ResponseCache | None = None,
    ) -> None:
        """``response_cache``: forgets the answers of each version unloaded."""
        self._make_pipeline = make_pipeline
        self._cache = response_cache
        self._config = config
        self._streams = StreamBudget(
            config.server.max_stream_backlog, config.server.max_total_stream_backlog
        )
        self._executor = executor
        self._registry = registry
        self._observers = tuple(observers)
        self._stats = stats
        self._clock = clock
        self._events = events

    def use_config(self, config: RuntimeConfig) -> None:
        """Schedule models loaded from now on under ``config`` (hot reconfiguration)."""
        self._config = config
        self._streams.per_request = config.server.max_stream_backlog
        self._streams.total = config.server.max_total_stream_backlog

    async def load(self, source: ModelSource) -> LoadedModel:
        """Load one model version, warm it up, and start its scheduler."""
        started = await self._start(source, self._new_key(source))
        return await self._serve(source, *started)

    async def reload(self, source: ModelSource) -> LoadedModel:
        """Load ``source``'s version again while the load it replaces serves (Triton's
        reload): the new load starts and warms up beside the old one, takes its place
        in one step, and the old one then finishes the requests it accepted and stops.
        Requests are answered throughout. If the new load fails, the old one serves on
        as it was and the error is raised."""
        old = self._registry.loaded(source.name, source.version)
        key = ModelKey(source.name, source.version, old.key.generation + 1)
        started = await self._start(source, key)
        model = await self._serve(source, *started)  # serves from here on
        # Its statistics start again (as a reload's do on Triton); a version's answers
        # kept in the response cache are the old load's, never hit again (the key
        # carries the generation): they go with it below.
        self._stats.forget(old.key)
        await self._stop(old, drain=True, replaced=True)
        return model

    async def update_instances(self, source: ModelSource) -> bool:
        """Give the served version of ``source`` the instance count it asks for without
        reloading it, as Triton updates a model whose configuration changed in its
        instance count alone: instances are started, or stopped (idle ones first), and
        the others serve on. False, having changed nothing, for a model this cannot be
        done to (a sequence or iterative one, or one on a device chain of several
        tiers): reload it then. When fewer instances start than asked for, those that
        did are stopped again and :class:`ModelLoadError` says so."""
        model = self._registry.loaded(source.name, source.version)
        key, before = model.key, model.instances
        if model.sequences is not None or model.pipeline is not None:
            return False
        if self._executor.tiers(key) != 1:
            return False
        wanted = source.config.instance_count
        await self._executor.scale(key, wanted - before, minimum=wanted, maximum=wanted)
        if (started := self._executor.instances(key)) != wanted:
            await self._executor.scale(key, before - started, minimum=before, maximum=before)
            raise ModelLoadError(
                f"model {key}: {started} of the {wanted} instances asked for started; it "
                f"serves on with {self._executor.instances(key)} (the log says why)"
            )
        config = completed(source.config, model.metadata)  # as its load completed it
        node = node_policy(self._config, source, batched=model.metadata.batched)
        model.reschedule(
            scheduling_for(
                self._config.scheduler,
                config,
                batched=model.metadata.batched,
                instances=wanted,
                node=node,
            )
        )
        model.source, model.instances = source, wanted
        self._events.emit("model_updated", str(key), f"instances {before} -> {wanted}")
        return True

    async def load_all(
        self,
        sources: Sequence[ModelSource],
        on_loaded: Callable[[LoadedModel], None] | None = None,
        *,
        concurrency: int = LOAD_CONCURRENCY,
        failed: dict[str, str] | None = None,
    ) -> list[LoadedModel]:
        """Load ``sources`` as :meth:`load` one after another would, in less time.

        The slow part of a load, starting a model's instances (worker processes that
        import their runtime and open the model), runs for up to ``concurrency`` models
        at once. Then, in the order given, each model is warmed up, has its batch
        curve measured, its scheduler started and is registered (``on_loaded`` is called):
        a curve is measured while no other model is starting, and a model that uses
        another at load (an iterative model's text encoder) finds it served, as before.

        On a failure the first failing model in the order given is raised (its error
        names it; later failures are logged), the instances of every model not yet
        serving are stopped, and the models already serving stay (the caller stops them).
        With ``failed`` (``server.exit_on_error`` false, as Triton's ``--exit-on-error``),
        a model that fails is left out instead, its error logged and kept there by name,
        and the others load.
        """
        seen: set[tuple[str, str]] = set()
        for source in sources:
            if (source.name, source.version) in seen:
                raise ModelLoadError(
                    f"model {source.name} version {source.version} is given twice; "
                    "rename one of them"
                )
            seen.add((source.name, source.version))
        gate = asyncio.Semaphore(max(1, concurrency))

        async def start(source: ModelSource) -> tuple[ModelKey, ModelConfig, ModelMetadata]:
            key = self._new_key(source)
            async with gate:
                return await self._start(source, key)

        starting = [asyncio.ensure_future(start(source)) for source in sources]
        loaded: list[LoadedModel] = []
        try:
            results = await asyncio.gather(*starting, return_exceptions=True)
            failures = [r for r in results if isinstance(r, BaseException)]
            if failed is None or any(not isinstance(r, Exception) for r in failures):
                for later in failures[1:]:
                    log.error("start-up: %s", later)
                if failures:
                    raise failures[0]
            for source, started in zip(sources, results, strict=True):
                try:
                    if isinstance(started, BaseException):
                        raise started
                    model = await self._serve(source, *started)
                except Exception as exc:
                    if failed is None:
                        raise
                    log.error("start-up: %s; serving the others (exit_on_error false)", exc)
                    failed[source.name] = str(exc)
                    continue
                loaded.append(model)
                if on_loaded is not None:
                    on_loaded(model)
        except BaseException:  # a failure, or start-up cancelled (Ctrl-C)
            for task in starting:
                task.cancel()
            await asyncio.gather(*starting, return_exceptions=True)
            serving = {model.key for model in loaded}
            for task in starting:
                if not task.cancelled() and task.exception() is None:
                    key = task.result()[0]
                    if key not in serving:
                        await self._executor.unload(key)
            raise
        return loaded

    def _new_key(self, source: ModelSource) -> ModelKey:
        """The key of ``source``'s version, which must not be loaded yet."""
        key = ModelKey(source.name, source.version)
        if self._registry.contains(source.name, source.version):
            raise ModelLoadError(
                f"model {key} is already loaded; unload it first or load another version"
            )
        return key

    async def _start(
        self, source: ModelSource, key: ModelKey
    ) -> tuple[ModelKey, ModelConfig, ModelMetadata]:
        """Start ``source``'s instances as ``key``: its key, its configuration (completed
        by the backend's own) and its metadata. Its files are checked against its
        checksums first, as Triton's checksum agent checks them before each load."""
        config = source.config
        if config.checksums:
            await asyncio.to_thread(verify_checksums, source)
        metadata = await self._executor.load(key, source.path, config)
        if config.input or config.output:
            from sordino.backends.onnx_pbtxt import check_declared

            try:
                check_declared(config, metadata)
            except ModelLoadError:
                await self._executor.unload(key)
                raise
        return key, completed(config, metadata), metadata

    def _check_answers(self, key: ModelKey, config: ModelConfig, decoupled: bool) -> None:
        """Refuse on a decoupled model (any number of responses) what needs one answer a
        request: ``response_cache``, as Triton does, and ``preserve_ordering``; say when
        the server has no cache to keep the model's answers in."""
        ordered = config.dynamic_batching.preserve_ordering
        asked = [name for name, on in (("response_cache", config.response_cache),
                                       ("preserve_ordering", ordered)) if on]  # fmt: skip
        if decoupled and asked:
            raise ModelLoadError(
                f"model {key}: {' and '.join(asked)} is not supported for a decoupled model "
                f"(it may send any number of responses); remove {' and '.join(asked)}"
            )
        if config.response_cache and self._cache is None:
            warn_uncached(f"model {key}")

    async def _serve(
        self, source: ModelSource, key: ModelKey, config: ModelConfig, metadata: ModelMetadata
    ) -> LoadedModel:
        """Warm up the started model ``key``, start its scheduler and register it; on any
        failure its scheduler and instances are stopped."""
        scheduler: ModelScheduler | None = None
        try:
            instances = self._executor.instances(key)
            if config.streaming is not None:
                spec = stream_spec_for(config.streaming, metadata)
                metadata = dataclasses.replace(metadata, stream=spec)
            self._check_answers(key, config, metadata.decoupled)
            node = node_policy(self._config, source, batched=metadata.batched)
            scheduling = scheduling_for(
                self._config.scheduler,
                config,
                batched=metadata.batched,
                instances=instances,
                node=node,
            )
            # A kind that is not warmed up (Python models) has no measured batch curve either.
            warm_up = backend_kind(config.backend, model=str(key)).warm_up
            curve = None
            # A decoupled model's answers to made-up inputs would have nowhere to go.
            warm_up = warm_up and not metadata.decoupled
            if warm_up:
                await self._warm_up(key, dummy_inputs(metadata, 1))
            if (
                warm_up
                and scheduling.mode in ("auto", "hybrid")
                and scheduling.policy.max_batch > 1
            ):

                async def run(rows: int) -> None:
                    await self._warm_up(key, dummy_inputs(metadata, rows))

                curve = await measure_batch_curve(run, self._clock, scheduling.policy.max_batch)
            if config.model_warmup:
                await self._run_samples(key, source, metadata, scheduling.max_batch_size, instances)
            controller = build_controller(
                scheduling.mode, scheduling.policy, scheduling.slo_s, curve
            )
            scheduler = ModelScheduler(
                key,
                batched=metadata.batched,
                executor=self._executor,
                controller=controller,
                settings=scheduling.queue,
                clock=self._clock,
                observers=self._observers,
                stream_budget=self._streams,
            )
            scheduler.start()
            model = LoadedModel(source, key, metadata, scheduling, scheduler, curve, instances)
            kind = backend_kind(config.backend, model=repr(key.name))
            model.request_facts, model.outputs_as_made = kind.request_facts, kind.outputs_as_made
            model.labels = read_labels(source)
            if config.sequence_batching is not None:
                model.sequences = sequences_for(
                    config.sequence_batching,
                    metadata,
                    max_batch_size=scheduling.max_batch_size,
                    instances=instances,
                    events=self._events,
                    folder=source.folder,
                    undeclared=config.backend == "python",
                )
                model.metadata = model.sequences.metadata
            if config.iterative is not None:
                if self._make_pipeline is None:
                    raise ModelLoadError(f"model {key}: iterative models are not supported here")
                # Clients see the generator (prompt in, image out); the scheduler runs the
                # denoiser.
                model.pipeline = self._make_pipeline(model)
                model.metadata = model.pipeline.metadata
        except BaseException:  # a failed check or warm-up, or start-up cancelled (Ctrl-C)
            if scheduler is not None:
                await scheduler.close(drain=False)
            await self._executor.unload(key)
            raise
        self._registry.add(model)
        self._events.emit(
            "model_loaded",
            str(key),
            mode=controller.statistics().effective_mode,
            max_batch=scheduling.policy.max_batch,
            instances=instances,
            isolation=config.isolation,
            slo_p99_ms=scheduling.slo_s * 1000,
        )
        return model

    async def _run_samples(
        self,
        key: ModelKey,
        source: ModelSource,
        metadata: ModelMetadata,
        max_batch_size: int,
        instances: int,
    ) -> None:
        """Run the model's ``model_warmup`` samples, each ``count`` times on each
        instance (as many at once as there are instances), before it serves."""
        from sordino.server.warmup import warmup_requests

        if metadata.decoupled:
            raise ModelLoadError(
                f"model {key}: model_warmup on a decoupled model is not supported; remove it"
            )
        requests = warmup_requests(
            source.config.model_warmup,
            metadata,
            max_batch_size=max_batch_size,
            folder=source.folder,
        )
        for request in requests:
            try:
                for _ in range(request.runs):
                    runs = (self._warm_up(key, request.inputs) for _ in range(instances))
                    await asyncio.gather(*runs)
            except SordinoError as exc:
                raise ModelLoadError(
                    f"model {key}: model_warmup {request.name!r} failed: {exc}"
                ) from exc

    async def _warm_up(self, key: ModelKey, inputs: dict[str, Tensor]) -> None:
        outputs = await self._executor.run(key, [inputs])
        outputs.release()

    async def unload(self, name: str, version: str, *, drain: bool = True) -> None:
        """Stop serving one model version; queued requests finish first when ``drain``."""
        model = self._registry.remove(name, version)
        await self._stop(model, drain=drain)
        self._stats.forget(model.key)

    async def _stop(self, model: LoadedModel, *, drain: bool, replaced: bool = False) -> None:
        """Stop a load no longer in the registry (``replaced``: by a reload's new one):
        its scheduler (draining it or not), then its instances."""
        await model.scheduler.close(drain=drain, replaced=replaced)
        await self._executor.unload(model.key)
        if self._cache is not None:  # a version loaded again may answer otherwise
            self._cache.forget(model.key)
        cause = "reloaded: its new load serves" if replaced else ""
        self._events.emit("model_unloaded", str(model.key), cause)


def completed(config: ModelConfig, metadata: ModelMetadata) -> ModelConfig:
    """``config`` completed by the backend's own configuration (``metadata.extra``: a
    Python model's ``auto_complete_config``): its ``max_batch_size`` when the config
    sets none, and a dynamic batcher it added."""
    declared = metadata.extra.get("max_batch_size")
    if config.max_batch_size is None and declared is not None:
        config = config.model_copy(update={"max_batch_size": int(declared)})
    if config.dynamic_batching.enabled is False and metadata.extra.get("dynamic_batching") == "on":
        # config.pbtxt had no dynamic batcher; auto_complete_config added one (its
        # delay, as on Triton: 0 unless it set one).
        delay = int(metadata.extra.get("max_queue_delay_microseconds", "0"))
        batching = config.dynamic_batching.model_copy(
            update={"enabled": None, "max_queue_delay_microseconds": delay}
        )
        config = config.model_copy(update={"dynamic_batching": batching})
    return config


def stream_spec_for(config: StreamingConfig, metadata: ModelMetadata) -> StreamSpec:
    """Check a model's ``streaming:`` configuration against the model; return its spec.

    Every carried output must exist and match the input it feeds (datatype and
    shape), and ``done`` must be a BOOL output. Raises ModelLoadError naming the
    mismatch otherwise.
    """
    model = metadata.name
    for output_name, input_name in config.carry.items():
        output = metadata.output(output_name)
        target = metadata.input(input_name)
        if output is None:
            raise ModelLoadError(
                f"model {model!r}: streaming.carry names output {output_name!r}, but the "
                f"model's outputs are {', '.join(s.name for s in metadata.outputs)}"
            )
        if target is None:
            raise ModelLoadError(
                f"model {model!r}: streaming.carry feeds input {input_name!r}, but the "
                f"model's inputs are {', '.join(s.name for s in metadata.inputs)}"
            )
        if (output.datatype, output.shape) != (target.datatype, target.shape):
            raise ModelLoadError(
                f"model {model!r}: streaming.carry feeds output {output_name!r} "
                f"({output.datatype} {list(output.shape)}) into input {input_name!r} "
                f"({target.datatype} {list(target.shape)}); they must match"
            )
    done = metadata.output(config.done)
    if done is None or done.datatype != "BOOL":
        raise ModelLoadError(
            f"model {model!r}: streaming.done must name a BOOL output; "
            f"{config.done!r} is {'not an output' if done is None else done.datatype}"
        )
    if config.emit is not None:
        emit = metadata.output(config.emit)
        if emit is None or emit.datatype != "BOOL":
            raise ModelLoadError(
                f"model {model!r}: streaming.emit must name a BOOL output; "
                f"{config.emit!r} is {'not an output' if emit is None else emit.datatype}"
            )
    carried = set(config.carry.values())
    for name in config.state:
        if name not in carried:
            raise ModelLoadError(
                f"model {model!r}: streaming.state lists {name!r}, which no carried output "
                f"feeds; state inputs are among {', '.join(sorted(carried))}"
            )
    return StreamSpec(
        carry=tuple(config.carry.items()),
        done=config.done,
        max_steps=config.max_steps,
        emit=config.emit,
        state=config.state,
    )
