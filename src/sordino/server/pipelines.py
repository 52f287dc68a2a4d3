"""Pipelines served as models: each node through its own model's scheduler and policy.

:func:`build_pipeline` checks a :class:`~sordino.config.pipelines.PipelineConfig`
against the loaded models — every node's model is loaded and not iterative, every
wired tensor exists, and the datatype and item shape of an output match the input it
feeds — and returns a :class:`~sordino.server.registry.LoadedModel` whose scheduler
is a real :class:`ModelScheduler` over a :class:`PipelineExecutor`. A batch of
pipeline requests runs node by node in dependency order: each node's inputs are
submitted to the node model's scheduler at the node's priority (and deadline), where
they batch with that model's other traffic, charged to the node pool of the model
(``runtime.memory_pool``) while they run; its outputs (views on the arena) feed the
next nodes as they are, by reference, and are released after their last reader ran
(see :class:`PipelineExecutor`). An error names the pipeline and the node.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from sordino.admission.chain import parse_priority
from sordino.clock import Clock
from sordino.config import ModelConfig, SchedulerConfig
from sordino.config.models import DynamicBatchingConfig
from sordino.config.pipelines import PIPELINE_INPUTS, NodeConfig, PipelineConfig
from sordino.errors import (
    InferenceFailed,
    InvalidRequest,
    ModelLoadError,
    RateLimited,
    Replaced,
    ShuttingDown,
    SordinoError,
    Unavailable,
)
from sordino.execution.batch import NO_CONTEXT, BatchContext
from sordino.execution.chain import ChainExecutor
from sordino.execution.executor import MemoryFit
from sordino.execution.staging import row_bytes
from sordino.inference import ModelKey, ModelMetadata, RequestFacts, Tensor
from sordino.memory.planner import plan_greedy_by_size
from sordino.memory.quotas import QuotaLedger
from sordino.memory.refs import Tensors, TensorsBuilder
from sordino.models.repository import ModelSource
from sordino.records import PipelineStatistics, SchedulerObserver
from sordino.scheduling.modes import build_controller
from sordino.scheduling.scheduler import ModelScheduler
from sordino.scheduling.settings import scheduling_for
from sordino.server.pipeline_wiring import outputs_of, source_of, tensors_of
from sordino.server.registry import LoadedModel, ModelRegistry

__all__ = ["PipelineExecutor", "build_pipeline", "outer_first", "pipeline_statistics"]

CONCURRENT_BATCHES = 4


_INPUT = "."
"""Prefix of a pipeline input's key among a batch's live tensors (node names never
start with a dot)."""


class PipelineExecutor:
    """Runs a batch of pipeline requests through the nodes (the scheduler's executor).

    Tensors travel between nodes as they lie: a node's input is a view of its
    producer's output block in the arena, holding that block's lease, so the next
    node's staging passes it to the worker by reference when the node runs it as a
    batch of its own (a merged batch needs one new block: one copy, counted). Each
    batch's tensors are released after the last node that reads them has run (the
    lifetime plan is computed once, from the wiring); the pipeline's outputs are the
    final nodes' output views, so nothing is copied out either.
    """

    def __init__(
        self,
        config: PipelineConfig,
        registry: ModelRegistry,
        models: Mapping[str, ModelMetadata],
        *,
        executor: ChainExecutor | None = None,
        pools: QuotaLedger | None = None,
    ) -> None:
        """``models`` is each node's model metadata; ``executor`` gives the arena
        (None: every tensor stays where the node models leave it); ``pools`` charges
        each node's request to its model's node pool (``runtime.memory_pool``)."""
        self.config = config
        self._pools = pools
        self._registry = registry
        self._executor = executor
        self._order = config.order()
        self._last: dict[str, LoadedModel] = {}
        # Each node input -> (key of the live tensors it reads, tensor name there).
        self._wiring: list[dict[str, tuple[str, str]]] = []
        self._optional: list[frozenset[str]] = []  # each node's optional inputs
        readers: dict[str, list[int]] = {}
        for index, node in enumerate(self._order):
            wiring: dict[str, tuple[str, str]] = {}
            for spec in models[node.name].inputs:
                producer, output = source_of(node, spec.name)
                if producer == PIPELINE_INPUTS:
                    wiring[spec.name] = (_INPUT + output, output)
                else:
                    wiring[spec.name] = (producer, output)
            for key, _ in wiring.values():
                readers.setdefault(key, []).append(index)
            self._wiring.append(wiring)
            self._optional.append(frozenset(s.name for s in models[node.name].inputs if s.optional))
        self._outputs = {
            name: (node, output) for name, (node, output, _) in outputs_of(config, models).items()
        }
        # Each node's outputs that the pipeline reads or returns.
        used = {pair for wiring in self._wiring for pair in wiring.values()}
        used |= set(self._outputs.values())
        self._made = {
            node.name: [s.name for s in models[node.name].outputs if (node.name, s.name) in used]
            for node in self._order
        }
        kept = {key for key, _ in self._outputs.values()}
        end = len(self._order) - 1
        # The lifetime plan: each key's tensors live until its last reader has run.
        self._until = {key: end if key in kept else max(at) for key, at in readers.items()}
        self._until.update({key: end for key in kept})
        self._release_after: dict[int, list[str]] = {}
        for key, last in self._until.items():
            if key not in kept:
                self._release_after.setdefault(last, []).append(key)
        self._readers = {key[1:]: at for key, at in readers.items() if key.startswith(_INPUT)}
        self._batches = self._handed_over = self._entered = 0
        self._plan = (0, 0)

    def _model(self, name: str) -> LoadedModel:
        """The node's model; while the server drains, the one still registered (an
        inner pipeline drains after this one), else the one it last used."""
        try:
            model = self._registry.get(name)
        except ShuttingDown:
            found = self._registry.newest(name) or self._last.get(name)
            if found is not None:
                return found
            raise
        self._last[name] = model
        return model

    def steps(self) -> list[dict[str, object]]:
        """The steps of a Triton ensemble configuration: as its ``ensemble_scheduling``
        was written (each with Triton's fields), else the nodes, in the order they run,
        a tensor between nodes named ``NODE.OUTPUT``."""
        if self.config.ensemble_steps is not None:
            written = json.loads(self.config.ensemble_steps)
            return [
                {
                    "model_name": step["model_name"],
                    "model_version": step.get("model_version", -1),
                    "input_map": step.get("input_map") or {},
                    "output_map": step.get("output_map") or {},
                    "model_namespace": step.get("model_namespace", ""),
                }
                for step in written["step"]
            ]
        names = {key: name for name, key in self._outputs.items()}
        steps: list[dict[str, object]] = []
        for node, wiring in zip(self._order, self._wiring, strict=True):
            inputs = {
                model_input: key.removeprefix(_INPUT)
                if key.startswith(_INPUT)
                else names.get((key, tensor), f"{key}.{tensor}")
                for model_input, (key, tensor) in wiring.items()
            }
            outputs = {
                output: names.get((node.name, output), f"{node.name}.{output}")
                for output in self._made[node.name]
            }
            steps.append(
                {
                    "model_name": node.model,
                    "model_version": -1,
                    "input_map": inputs,
                    "output_map": outputs,
                }
            )
        return steps

    def instances(self, model: ModelKey) -> int:
        return CONCURRENT_BATCHES

    def memory_fit(self, model: ModelKey, part: Mapping[str, Tensor]) -> MemoryFit | None:
        return None  # each node's own scheduler protects the arena

    def statistics(self) -> PipelineStatistics:
        """Batches run, how node inputs travelled, and the last batch's lifetime plan."""
        recopied = 0
        if self._executor is not None:
            counts = self._executor.staging.arena_inputs
            recopied = sum(counts[model, True] for model in {n.model for n in self._order})
        planned, naive = self._plan
        return PipelineStatistics(
            self.config.name,
            self._batches,
            self._handed_over,
            self._entered,
            recopied,
            planned,
            naive,
        )

    async def run(
        self,
        model: ModelKey,
        parts: Sequence[Mapping[str, Tensor]],
        context: BatchContext = NO_CONTEXT,
    ) -> Tensors:
        """Run the batch of ``parts`` node by node; return the final nodes' outputs.

        ``context`` is not passed on: each node's batch is a request of its own to
        that node's scheduler, which builds that batch's context.

        The parts stay the caller's; the outputs (views of the final nodes' output
        blocks, holding them) are the caller's to release.
        """
        self._batches += 1
        live: dict[str, Tensors] = {}
        sizes: dict[str, tuple[int, int]] = {}  # key -> (bytes, index of its first use)
        try:
            self._enter(parts, live)
            for key, tensors in live.items():
                sizes[key] = (_nbytes(tensors), 0)
            for index, node in enumerate(self._order):
                inputs = Tensors.compose(self._node_inputs(index, live))
                self._handed_over += sum(1 for name in inputs if inputs.ref(name).in_arena)
                outputs = await self._run_node(node, inputs, self._made[node.name])
                live[node.name] = outputs
                sizes[node.name] = (_nbytes(outputs), index)
                for key in self._release_after.get(index, ()):
                    left = live.pop(key, None)  # (None: an optional input left out)
                    if left is not None:
                        left.release()
            self._plan = self._lay_out(sizes)
            # An output a node's model did not return is left out (as Triton does).
            return Tensors.compose(
                {
                    name: (live[key], tensor)
                    for name, (key, tensor) in self._outputs.items()
                    if tensor in live[key]
                }
            )
        finally:
            for tensors in live.values():
                tensors.release()

    def _node_inputs(self, index: int, live: dict[str, Tensors]) -> dict[str, tuple[Tensors, str]]:
        """Where node ``index`` reads each input; raises InferenceFailed for a required
        one that a node before it did not return (an optional one is left out, as a
        pipeline input the request left out is)."""
        wired: dict[str, tuple[Tensors, str]] = {}
        for name, (key, tensor) in self._wiring[index].items():
            source = live.get(key)
            if source is None:
                continue  # an optional pipeline input the request left out
            if tensor not in source:
                if name in self._optional[index]:
                    continue
                node = self._order[index]
                producer = next(n for n in self._order if n.name == key)
                raise InferenceFailed(
                    f"pipeline {self.config.name}: node {key} (model {producer.model}) "
                    f"did not return output {tensor}, which node {node.name} (model "
                    f"{node.model}) needs as its input {name}"
                )
            wired[name] = (source, tensor)
        return wired

    def _enter(self, parts: Sequence[Mapping[str, Tensor]], live: dict[str, Tensors]) -> None:
        """The batch's pipeline inputs as live tensors, each written at most once.

        One request's input read by one node is passed as it lies: the node's staging
        writes it into the arena once, as for any model. A batch of several requests,
        or an input several nodes read, is written into the arena here, once, so every
        node after that reads it by reference.
        """
        first = parts[0]
        for name in first:
            key = _INPUT + name
            readers = self._readers.get(name, ())
            if len(parts) == 1 and len(readers) <= 1:
                live[key] = Tensors.compose({name: (Tensors.of(first), name)})
                continue
            if len(parts) == 1 and isinstance(first, Tensors) and first.ref(name).in_arena:
                live[key] = Tensors.compose({name: (first, name)})
                continue
            arrays = [np.asarray(part[name]) for part in parts]
            arena = None
            if self._executor is not None and readers:
                reader = self._model(self._order[readers[0]].model)
                arena = self._executor.input_arena(reader.key)
            builder = TensorsBuilder(arena)
            try:
                if arrays[0].dtype == np.object_:
                    builder.put(name, np.concatenate(arrays))
                else:
                    shape = (sum(a.shape[0] for a in arrays), *arrays[0].shape[1:])
                    view = builder.empty(name, arrays[0].dtype.newbyteorder("="), shape)
                    np.concatenate(arrays, out=view)
            except BaseException:
                builder.abandon()
                raise
            tensors = builder.finish()
            if tensors.ref(name).in_arena:
                self._entered += 1
            live[key] = tensors

    def _lay_out(self, sizes: Mapping[str, tuple[int, int]]) -> tuple[int, int]:
        """The batch's tensors laid out by lifetime: (planned peak, naive sum) bytes."""
        tensors = [
            (size, first, self._until.get(key, first)) for key, (size, first) in sizes.items()
        ]
        plan, peak = plan_greedy_by_size(tensors)
        return peak, sum(planned.size for planned in plan)

    async def _run_node(self, node: NodeConfig, inputs: Tensors, wanted: Sequence[str]) -> Tensors:
        """Submit ``inputs`` (the node's request takes them over) and await its outputs.

        A model that reads its requests' facts is asked for ``wanted`` only (the
        outputs the pipeline reads or returns), as Triton's ensemble asks a step for
        its ``output_map``'s keys (``requested_output_names()``).
        """
        where = f"pipeline {self.config.name}, node {node.name} (model {node.model})"
        submitted = False
        try:
            served = self._model(node.model)
            priority = parse_priority(
                node.runtime.priority or 0, served.scheduling.queue, f"{where}: priority"
            )
            nbytes, charged = 0, None
            if self._pools is not None:
                nbytes = _rows(inputs, served) * row_bytes(inputs, served.metadata)
                charged = await self._pools.acquire(node.model, nbytes)
            try:
                facts = RequestFacts(outputs=tuple(wanted)) if served.request_facts else None
                try:
                    request = served.scheduler.submit(
                        inputs, priority=priority, timeout_s=node.runtime.timeout, facts=facts
                    )
                except Replaced:  # reloaded while the charge waited: its new load
                    served = self._model(node.model)
                    request = served.scheduler.submit(
                        inputs, priority=priority, timeout_s=node.runtime.timeout, facts=facts
                    )
                submitted = True
                return await served.scheduler.result(request)
            finally:
                if self._pools is not None and charged is not None:
                    self._pools.release(charged, nbytes)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{where}: {exc}") from exc
        except Unavailable as exc:
            raise Unavailable(f"{where}: {exc}") from exc
        except RateLimited as exc:
            raise RateLimited(f"{where}: {exc}", retry_after_s=exc.retry_after_s) from exc
        except SordinoError as exc:
            raise InferenceFailed(f"{where}: {exc}") from exc
        finally:
            if not submitted:
                inputs.release()


def _rows(inputs: Mapping[str, Tensor], model: LoadedModel) -> int:
    if model.metadata.batched and inputs:
        return max(1, int(next(iter(inputs.values())).shape[0]))
    return 1


def _nbytes(tensors: Tensors) -> int:
    return sum(int(array.nbytes) for array in tensors.values())


def pipeline_statistics(models: Iterable[LoadedModel]) -> tuple[PipelineStatistics, ...]:
    """The statistics of each pipeline among ``models``."""
    return tuple(
        executor.statistics()
        for model in models
        if isinstance(executor := model.scheduler.executor, PipelineExecutor)
    )


def outer_first(pipelines: Sequence[LoadedModel]) -> list[list[LoadedModel]]:
    """``pipelines`` in layers to drain one after the other: each layer holds those that
    no pipeline of a later layer runs as a node (an ensemble before its inner ones)."""
    left = list(pipelines)
    layers: list[list[LoadedModel]] = []
    while left:
        inner = {
            node.model
            for p in left
            if isinstance(executor := p.scheduler.executor, PipelineExecutor)
            for node in executor.config.nodes
        }
        layer = [p for p in left if p.key.name not in inner] or left  # (no cycle is built)
        layers.append(layer)
        left = [p for p in left if p not in layer]
    return layers


def build_pipeline(
    config: PipelineConfig,
    registry: ModelRegistry,
    scheduler: SchedulerConfig,
    *,
    clock: Clock,
    observers: Sequence[SchedulerObserver],
    executor: ChainExecutor | None = None,
    pools: QuotaLedger | None = None,
    replacing: LoadedModel | None = None,
) -> LoadedModel:
    """Check ``config`` against the loaded models and return the pipeline as a model
    (``pools``: the node pools its nodes' requests are charged to; ``replacing``: the
    pipeline of that name it is built to replace)."""
    where = f"pipeline {config.name}"
    if registry.versions(config.name) and replacing is None:
        raise ModelLoadError(f"{where}: a model of that name is already served")
    models: dict[str, ModelMetadata] = {}
    caps: list[int] = []
    for node in config.nodes:
        if not registry.versions(node.model):
            raise ModelLoadError(
                f"{where}, node {node.name}: model {node.model!r} is not loaded; load it too "
                "(a pipeline's nodes are served models)"
            )
        served = registry.get(node.model)
        meta = served.metadata
        if served.pipeline is not None or meta.stream is not None or meta.decoupled:
            raise ModelLoadError(
                f"{where}, node {node.name}: model {node.model} is iterative, streaming or "
                "decoupled; pipeline nodes must be one-shot models (not supported yet)"
            )
        models[node.name] = served.metadata
        caps.append(served.max_batch_size if served.metadata.batched else 0)
    inputs, outputs_specs = tensors_of(config, models)
    batching = [cap for cap in caps if cap]
    # Unset: batch when a node does.
    batched = bool(batching) if config.max_batch_size is None else config.max_batch_size > 0
    if config.max_batch_size:
        for node, cap in zip(config.nodes, caps, strict=True):
            if cap and cap < config.max_batch_size:
                raise ModelLoadError(
                    f"{where} allows a batch of {config.max_batch_size}, but node {node.name}'s "
                    f"model {node.model} allows only {cap}: lower the pipeline's "
                    "max_batch_size or raise the model's"
                )
    rows = config.max_batch_size or (min(batching) if batching else 0)
    # A node that does not batch takes each request whole: the pipeline runs one
    # request at a time (its nodes' own schedulers still batch across requests).
    whole = batched and len(batching) < len(caps)
    key = ModelKey(config.name, "1", replacing.key.generation + 1 if replacing else 0)
    metadata = ModelMetadata(
        config.name,
        "1",
        "ensemble",  # Triton's platform for models chained by its ensemble scheduler
        tuple(inputs.values()),
        tuple(outputs_specs.values()),
        batched=batched,
    )
    model_config = ModelConfig(
        name=config.name,
        max_batch_size=rows if batched else None,
        dynamic_batching=DynamicBatchingConfig(enabled=False if whole else None),
        response_cache=config.response_cache,
    )
    scheduling = scheduling_for(
        scheduler, model_config, batched=batched, instances=CONCURRENT_BATCHES
    )
    controller = build_controller(scheduling.mode, scheduling.policy, scheduling.slo_s)
    engine = ModelScheduler(
        key,
        batched=batched,
        executor=PipelineExecutor(config, registry, models, executor=executor, pools=pools),
        controller=controller,
        settings=scheduling.queue,
        clock=clock,
        observers=observers,
    )
    engine.start()
    origin = ModelSource(config.name, "1", Path(f"<pipeline {config.name}>"), model_config)
    return LoadedModel(origin, key, metadata, scheduling, engine, None, CONCURRENT_BATCHES)
