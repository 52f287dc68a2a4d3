"""The ``pipelines`` section: models chained into one served model, each node with its policy.

A pipeline is served like a model (``/v2/models/NAME/infer``). Each node runs one
loaded model through that model's own scheduler; ``inputs`` wires a node input to
``OTHER_NODE.OUTPUT`` or to the pipeline input ``inputs.NAME``; a node input left
unwired is an input of the pipeline (same name). ``outputs`` names the pipeline's
outputs (``NAME: NODE.OUTPUT``); without it, the outputs no node consumes are the
pipeline's outputs. Triton's ``ensemble_scheduling`` (``step`` entries with
``model_name``, ``input_map``, ``output_map``) is accepted as another spelling of
``nodes`` and ``outputs``, and a Triton ensemble in a model repository
(``platform: "ensemble"``) is read into this section (``models/ensembles.py``).

A node's ``runtime`` is :class:`~sordino.config.nodes.NodeRuntime`: ``priority`` and
``timeout`` are those of the requests the pipeline sends to the node's model;
``scheduler``, ``memory_pool`` and ``self_healing`` are the model's (``config/nodes.py``).

Structure (names, wiring, cycles) is checked here; models, tensors and datatypes are
checked at load, against the loaded models (``server/pipelines.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pydantic import Field, model_validator

from sordino.config.base import Section, reject_repeated_names
from sordino.config.models import MODEL_NAME_PATTERN
from sordino.config.nodes import NodeRuntime
from sordino.errors import ConfigError

__all__ = ["PIPELINE_INPUTS", "NodeConfig", "NodeRuntime", "PipelineConfig", "nodes_first"]


class NodeConfig(Section):
    """One step of a pipeline."""

    name: str = Field(pattern=MODEL_NAME_PATTERN)
    model: str = Field(pattern=MODEL_NAME_PATTERN)
    """The loaded model this node runs."""
    inputs: dict[str, str] = Field(default_factory=dict)
    """Model input -> ``NODE.OUTPUT``, or ``inputs.NAME`` for the pipeline input
    ``NAME``; unwired inputs are pipeline inputs of their own name."""
    runtime: NodeRuntime = NodeRuntime()


PIPELINE_INPUTS = "inputs"
"""The producer a node input names to read a pipeline input: ``inputs.NAME`` (no node
takes that name)."""


def _ensemble(data: Any) -> Any:
    """Triton's ``ensemble_scheduling`` spelling -> ``nodes`` and ``outputs``.

    As in Triton, steps may be listed in any order and tensors are wired by their
    ensemble names: an ``input_map`` value no step's ``output_map`` produces is an
    input of the pipeline, and the pipeline's outputs are the ``output`` list when
    one is given (a ``config.pbtxt``), else the tensors produced that no step reads.
    A step's outputs left out of its ``output_map`` are dropped.
    """
    if not isinstance(data, dict) or "ensemble_scheduling" not in data:
        return data
    data = dict(data)
    ensemble = data.pop("ensemble_scheduling")
    data["ensemble_steps"] = json.dumps(ensemble, default=str)
    declared_inputs = _declared(data.pop("input", None), "input")
    declared_outputs = _declared(data.pop("output", None), "output")
    steps = ensemble.get("step") if isinstance(ensemble, dict) else None
    if not isinstance(steps, list) or not steps:
        raise ValueError("ensemble_scheduling needs a non-empty 'step' list")
    names: list[str] = []
    counts: dict[str, int] = {}
    produced: dict[str, str] = {}
    for step in steps:
        if not isinstance(step, dict) or "model_name" not in step:
            raise ValueError("each ensemble_scheduling step needs a model_name")
        # A node's name is its model's, made unique, without dots (NODE.OUTPUT).
        base = str(step["model_name"]).replace(".", "_")
        base = f"{base}_step" if base == PIPELINE_INPUTS else base
        counts[base] = counts.get(base, 0) + 1
        name = base if counts[base] == 1 else f"{base}_{counts[base]}"
        names.append(name)
        _step_fields(step, name)
        for model_output, tensor in (step.get("output_map") or {}).items():
            tensor = str(tensor)
            if tensor in produced:
                raise ValueError(
                    f"ensemble tensor {tensor!r} is produced by two steps ({produced[tensor]} "
                    f"and {name}.{model_output}); give each its own name"
                )
            produced[tensor] = f"{name}.{model_output}"
    nodes: list[dict[str, Any]] = []
    read: set[str] = set()
    for name, step in zip(names, steps, strict=True):
        inputs = {}
        for model_input, tensor in (step.get("input_map") or {}).items():
            tensor = str(tensor)
            read.add(tensor)
            if tensor in produced:
                inputs[str(model_input)] = produced[tensor]
            elif declared_inputs is not None and tensor not in declared_inputs:
                raise ValueError(
                    f"ensemble step {name}: input {model_input} reads {tensor!r}, which is "
                    "neither an input of the ensemble nor produced by a step (inputs: "
                    f"{', '.join(declared_inputs) or 'none'})"
                )
            else:
                inputs[str(model_input)] = f"{PIPELINE_INPUTS}.{tensor}"
        nodes.append({"name": name, "model": str(step["model_name"]), "inputs": inputs})
    for tensor in declared_inputs or ():
        if tensor not in read:
            raise ValueError(f"ensemble input {tensor!r} is read by no step; remove it")
    if declared_outputs is None:
        declared_outputs = [tensor for tensor in produced if tensor not in read]
    for tensor in declared_outputs:
        if tensor not in produced:
            raise ValueError(
                f"ensemble output {tensor!r} is produced by no step (an output_map value names it)"
            )
    data["nodes"] = nodes
    data["outputs"] = {tensor: produced[tensor] for tensor in declared_outputs}
    return data


def _declared(tensors: Any, what: str) -> list[str] | None:
    """The names of an ensemble's ``input`` or ``output`` list (None: not given)."""
    if tensors is None:
        return None
    if not isinstance(tensors, list) or not all(
        isinstance(t, dict) and isinstance(t.get("name"), str) for t in tensors
    ):
        raise ValueError(f"an ensemble's {what} is a list of tensors, each with a name")
    return [t["name"] for t in tensors]


_STEP_FIELDS = {"model_name", "model_version", "input_map", "output_map"}


def _step_fields(step: dict[str, Any], name: str) -> None:
    """Refuse the step fields sordino does not do (a version other than the latest)."""
    extra = sorted(set(step) - _STEP_FIELDS)
    if extra:
        raise ValueError(f"ensemble step {name}: {', '.join(extra)} is not supported; remove it")
    version = step.get("model_version", -1)
    if version != -1:
        raise ValueError(
            f"ensemble step {name}: model_version {version} is not supported (a step runs "
            "the version the model serves by default); remove it or set -1"
        )


class PipelineConfig(Section):
    """Models chained into one served model."""

    name: str = Field(pattern=MODEL_NAME_PATTERN)
    nodes: tuple[NodeConfig, ...] = Field(min_length=1)
    outputs: dict[str, str] = Field(default_factory=dict)
    """Pipeline output -> ``NODE.OUTPUT``; empty: every node output no node reads, by
    its own name."""
    max_batch_size: int | None = Field(default=None, ge=0)
    """Rows a request may carry; 0: requests are not batched and pass whole (Triton's
    ``max_batch_size: 0``); None: the smallest of the nodes' models'."""
    response_cache: bool = False
    """Answer a request whose inputs were answered before from the server's response
    cache, without running the nodes (Triton's ``response_cache`` on an ensemble)."""
    ensemble_steps: str | None = Field(default=None, exclude=True, repr=False)
    """Set from Triton's ``ensemble_scheduling`` spelling (not a key of its own): its
    section as written, JSON, which the configuration endpoint shows back."""

    @model_validator(mode="before")
    @classmethod
    def _triton_spelling(cls, data: Any) -> Any:
        return _ensemble(data)

    @model_validator(mode="after")
    def _wiring(self) -> PipelineConfig:
        reject_repeated_names((node.name for node in self.nodes), what="node names")
        names = {node.name for node in self.nodes}
        if PIPELINE_INPUTS in names:
            raise ValueError(
                f"a node is named {PIPELINE_INPUTS!r}, which names the pipeline's inputs "
                f"({PIPELINE_INPUTS}.NAME); rename the node"
            )
        for node in self.nodes:
            for model_input, source in node.inputs.items():
                self._check_source(source, names, f"node {node.name}: input {model_input}")
        for output, source in self.outputs.items():
            if source.startswith(f"{PIPELINE_INPUTS}."):
                raise ValueError(f"output {output}: {source!r} is not NODE.OUTPUT")
            self._check_source(source, names, f"output {output}")
        self.order()  # refuses a cycle
        return self

    @staticmethod
    def _check_source(source: str, names: set[str], where: str) -> None:
        producer, dot, output = source.partition(".")
        if not dot or not output:
            raise ValueError(
                f"{where}: {source!r} is neither NODE.OUTPUT nor {PIPELINE_INPUTS}.NAME"
            )
        if producer != PIPELINE_INPUTS and producer not in names:
            raise ValueError(
                f"{where} comes from {producer!r}, which is not a node of this pipeline "
                f"(nodes: {', '.join(sorted(names))}; {PIPELINE_INPUTS}.NAME reads a "
                "pipeline input)"
            )

    def order(self) -> list[NodeConfig]:
        """The nodes in an order where each runs after the nodes it reads from."""
        by_name = {node.name: node for node in self.nodes}
        done: list[NodeConfig] = []
        state: dict[str, str] = {}

        def visit(name: str, path: list[str]) -> None:
            if state.get(name) == "done":
                return
            if state.get(name) == "visiting":
                cycle = " -> ".join([*path[path.index(name) :], name])
                raise ValueError(f"pipeline {self.name} has a cycle: {cycle}")
            state[name] = "visiting"
            for source in by_name[name].inputs.values():
                producer = source.partition(".")[0]
                if producer != PIPELINE_INPUTS:
                    visit(producer, [*path, name])
            state[name] = "done"
            done.append(by_name[name])

        for node in self.nodes:
            visit(node.name, [])
        return done


def nodes_first(pipelines: Iterable[PipelineConfig]) -> list[PipelineConfig]:
    """``pipelines`` in an order where a pipeline that is a node of another comes
    before it (a Triton ensemble of ensembles); :class:`ConfigError` for a cycle."""
    pending = list(pipelines)
    names = {pipeline.name for pipeline in pending}
    built: set[str] = set()
    order: list[PipelineConfig] = []
    while pending:
        ready = [
            p for p in pending if all(n.model in built or n.model not in names for n in p.nodes)
        ]
        if not ready:
            raise ConfigError(
                "pipelines run each other in a cycle: "
                f"{', '.join(sorted(p.name for p in pending))}; a pipeline may run another "
                "only if that one does not run it back"
            )
        order += ready
        built |= {p.name for p in ready}
        pending = [p for p in pending if p.name not in built]
    return order
