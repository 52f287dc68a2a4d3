"""Pipelines served as models: each node through its own model's scheduler and policy.

:func:`build_pipeline` checks a :class:`~sordino.config.pipelines.PipelineConfig`
against the loaded models — every node's model is loaded and not iterative, every
wired tensor exists, and the datatype and item shape of an output match the input it
feeds — and returns a :class:`~sordino.server.registry.LoadedModel` whose scheduler
is a real :class:`ModelScheduler` over a :class:`PipelineExecutor`. A batch of
pipeline requests runs node by node in dependency order: each node's inputs are
submitted to the node model's scheduler at the node's priority (and deadline), where
they batch with that model's other traffic; its outputs (views on the arena) feed the
next nodes as they are. An error names the pipeline and the node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from sordino.admission.chain import parse_priority
from sordino.clock import Clock
from sordino.config import ModelConfig, SchedulerConfig
from sordino.config.pipelines import NodeConfig, PipelineConfig
from sordino.errors import (
    InferenceFailed,
    InvalidRequest,
    ModelLoadError,
    ShuttingDown,
    SordinoError,
    Unavailable,
)
from sordino.execution.executor import MemoryFit
from sordino.inference import ModelKey, ModelMetadata, Tensor, TensorSpec
from sordino.memory.refs import Tensors
from sordino.models.repository import ModelSource
from sordino.records import SchedulerObserver
from sordino.scheduling.modes import build_controller
from sordino.scheduling.scheduler import ModelScheduler
from sordino.scheduling.settings import scheduling_for
from sordino.server.registry import LoadedModel, ModelRegistry

__all__ = ["PipelineExecutor", "build_pipeline"]

CONCURRENT_BATCHES = 4


class PipelineExecutor:
    """Runs a batch of pipeline requests through the nodes (the scheduler's executor)."""

    def __init__(self, config: PipelineConfig, registry: ModelRegistry) -> None:
        self.config = config
        self._registry = registry
        self._order = config.order()
        consumed = {source for node in config.nodes for source in node.inputs.values()}
        self._consumed = consumed
        self._last: dict[str, LoadedModel] = {}

    def _model(self, name: str) -> LoadedModel:
        """The node's model; while the server drains, the one it last used."""
        try:
            model = self._registry.get(name)
        except ShuttingDown:
            if name in self._last:
                return self._last[name]
            raise
        self._last[name] = model
        return model

    def instances(self, model: ModelKey) -> int:
        return CONCURRENT_BATCHES

    def memory_fit(self, model: ModelKey, part: Mapping[str, Tensor]) -> MemoryFit | None:
        return None  # each node's own scheduler protects the arena

    async def run(self, model: ModelKey, parts: Sequence[Mapping[str, Tensor]]) -> Tensors:
        batch = {
            name: np.concatenate([np.asarray(part[name]) for part in parts]) for name in parts[0]
        }
        produced: dict[str, Tensors] = {}
        try:
            for node in self._order:
                inputs: dict[str, Tensor] = {}
                served = self._model(node.model)
                for spec in served.metadata.inputs:
                    source = node.inputs.get(spec.name)
                    if source is None:
                        inputs[spec.name] = batch[spec.name]
                    else:
                        producer, _, output = source.partition(".")
                        inputs[spec.name] = produced[producer][output]
                produced[node.name] = await self._run_node(node, inputs)
            outputs: dict[str, Tensor] = {}
            for node in self._order:
                for name, array in produced[node.name].items():
                    if f"{node.name}.{name}" not in self._consumed:
                        outputs[name] = np.array(array)
            return Tensors.of(outputs)
        finally:
            for tensors in produced.values():
                tensors.release()

    async def _run_node(self, node: NodeConfig, inputs: Mapping[str, Tensor]) -> Tensors:
        where = f"pipeline {self.config.name}, node {node.name} (model {node.model})"
        try:
            served = self._model(node.model)
            priority = parse_priority(
                node.runtime.priority, served.scheduling.queue, f"{where}: priority"
            )
            return await served.scheduler.infer(
                Tensors.of(inputs), priority=priority, timeout_s=node.runtime.timeout
            )
        except InvalidRequest as exc:
            raise InvalidRequest(f"{where}: {exc}") from exc
        except Unavailable as exc:
            raise Unavailable(f"{where}: {exc}") from exc
        except SordinoError as exc:
            raise InferenceFailed(f"{where}: {exc}") from exc


def _spec_matches(output: TensorSpec, target: TensorSpec) -> bool:
    if output.datatype != target.datatype or len(output.shape) != len(target.shape):
        return False
    return all(
        a == b or a == -1 or b == -1 for a, b in zip(output.shape, target.shape, strict=True)
    )


def build_pipeline(
    config: PipelineConfig,
    registry: ModelRegistry,
    scheduler: SchedulerConfig,
    *,
    clock: Clock,
    observers: Sequence[SchedulerObserver],
) -> LoadedModel:
    """Check ``config`` against the loaded models and return the pipeline as a model."""
    where = f"pipeline {config.name}"
    if registry.versions(config.name):
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
        if served.pipeline is not None or served.metadata.stream is not None:
            raise ModelLoadError(
                f"{where}, node {node.name}: model {node.model} is iterative or streaming; "
                "pipeline nodes must be one-shot models (not supported yet)"
            )
        if not served.metadata.batched:
            raise ModelLoadError(f"{where}, node {node.name}: model {node.model} does not batch")
        models[node.name] = served.metadata
        caps.append(served.max_batch_size)
    inputs: dict[str, TensorSpec] = {}
    consumed: set[str] = set()
    for node in config.nodes:
        metadata = models[node.name]
        known = {spec.name for spec in metadata.inputs}
        for name in node.inputs:
            if name not in known:
                raise ModelLoadError(
                    f"{where}, node {node.name}: model {node.model} has no input {name!r} "
                    f"(inputs: {', '.join(sorted(known))})"
                )
        for spec in metadata.inputs:
            source = node.inputs.get(spec.name)
            if source is None:
                seen = inputs.setdefault(spec.name, spec)
                if not _spec_matches(seen, spec):
                    raise ModelLoadError(
                        f"{where}: pipeline input {spec.name} is {seen.datatype} "
                        f"{list(seen.shape)} for one node and {spec.datatype} "
                        f"{list(spec.shape)} for node {node.name}"
                    )
                continue
            producer, _, output_name = source.partition(".")
            output = models[producer].output(output_name)
            if output is None:
                outputs = ", ".join(s.name for s in models[producer].outputs)
                raise ModelLoadError(
                    f"{where}, node {node.name}: input {spec.name} reads {source}, but node "
                    f"{producer} has no output {output_name!r} (outputs: {outputs})"
                )
            if not _spec_matches(output, spec):
                raise ModelLoadError(
                    f"{where}, node {node.name}: input {spec.name} is {spec.datatype} "
                    f"{list(spec.shape)}, but {source} is {output.datatype} "
                    f"{list(output.shape)}: the datatypes and shapes must match"
                )
            consumed.add(source)
    outputs_specs: dict[str, TensorSpec] = {}
    for node in config.order():
        for spec in models[node.name].outputs:
            if f"{node.name}.{spec.name}" in consumed:
                continue
            if spec.name in outputs_specs:
                raise ModelLoadError(
                    f"{where}: two nodes leave an output called {spec.name}; consume one of "
                    "them in a later node"
                )
            outputs_specs[spec.name] = spec
    key = ModelKey(config.name, "1")
    metadata = ModelMetadata(
        config.name,
        "1",
        "sordino_pipeline",
        tuple(inputs.values()),
        tuple(outputs_specs.values()),
        batched=True,
    )
    model_config = ModelConfig(name=config.name, max_batch_size=min(caps))
    scheduling = scheduling_for(scheduler, model_config, batched=True, instances=CONCURRENT_BATCHES)
    controller = build_controller(scheduling.mode, scheduling.policy, scheduling.slo_s)
    engine = ModelScheduler(
        key,
        batched=True,
        executor=PipelineExecutor(config, registry),
        controller=controller,
        settings=scheduling.queue,
        clock=clock,
        observers=observers,
    )
    engine.start()
    origin = ModelSource(config.name, "1", Path(f"<pipeline {config.name}>"), model_config)
    return LoadedModel(origin, key, metadata, scheduling, engine, None, CONCURRENT_BATCHES)
