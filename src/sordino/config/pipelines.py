"""The ``pipelines`` section: models chained into one served model, each node with its policy.

A pipeline is served like a model (``/v2/models/NAME/infer``). Each node runs one
loaded model through that model's own scheduler; ``inputs`` wires a node input to
``OTHER_NODE.OUTPUT``; a node input left unwired is an input of the pipeline (same
name), and the outputs no node consumes are the pipeline's outputs. Triton's
``ensemble_scheduling`` (``step`` entries with ``model_name``, ``input_map``,
``output_map``) is accepted as another spelling of ``nodes``.

A node's ``runtime`` is :class:`~sordino.config.nodes.NodeRuntime`: ``priority`` and
``timeout`` are those of the requests the pipeline sends to the node's model;
``scheduler``, ``memory_pool`` and ``self_healing`` are the model's (``config/nodes.py``).

Structure (names, wiring, cycles) is checked here; models, tensors and datatypes are
checked at load, against the loaded models (``server/pipelines.py``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from sordino.config.base import Section, reject_repeated_names
from sordino.config.models import MODEL_NAME_PATTERN
from sordino.config.nodes import NodeRuntime

__all__ = ["NodeConfig", "NodeRuntime", "PipelineConfig"]


class NodeConfig(Section):
    """One step of a pipeline."""

    name: str = Field(pattern=MODEL_NAME_PATTERN)
    model: str = Field(pattern=MODEL_NAME_PATTERN)
    """The loaded model this node runs."""
    inputs: dict[str, str] = Field(default_factory=dict)
    """Model input -> ``NODE.OUTPUT``; unwired inputs are the pipeline's inputs."""
    runtime: NodeRuntime = NodeRuntime()


def _ensemble(data: Any) -> Any:
    """Triton's ``ensemble_scheduling`` spelling -> ``nodes``."""
    if not isinstance(data, dict) or "ensemble_scheduling" not in data:
        return data
    data = dict(data)
    ensemble = data.pop("ensemble_scheduling")
    steps = ensemble.get("step") if isinstance(ensemble, dict) else None
    if not isinstance(steps, list) or not steps:
        raise ValueError("ensemble_scheduling needs a non-empty 'step' list")
    produced: dict[str, str] = {}
    nodes: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    for step in steps:
        if not isinstance(step, dict) or "model_name" not in step:
            raise ValueError("each ensemble_scheduling step needs a model_name")
        model = str(step["model_name"])
        counts[model] = counts.get(model, 0) + 1
        name = model if counts[model] == 1 else f"{model}_{counts[model]}"
        inputs = {}
        for model_input, tensor in (step.get("input_map") or {}).items():
            if tensor in produced:
                inputs[model_input] = produced[tensor]
            elif tensor != model_input:
                raise ValueError(
                    f"ensemble step {name}: input {model_input} maps to {tensor!r}, which no "
                    "earlier step produces; a pipeline input keeps the model input's name"
                )
        for model_output, tensor in (step.get("output_map") or {}).items():
            produced[str(tensor)] = f"{name}.{model_output}"
        nodes.append({"name": name, "model": model, "inputs": inputs})
    data["nodes"] = nodes
    return data


class PipelineConfig(Section):
    """Models chained into one served model."""

    name: str = Field(pattern=MODEL_NAME_PATTERN)
    nodes: tuple[NodeConfig, ...] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _triton_spelling(cls, data: Any) -> Any:
        return _ensemble(data)

    @model_validator(mode="after")
    def _wiring(self) -> PipelineConfig:
        reject_repeated_names((node.name for node in self.nodes), what="node names")
        names = {node.name for node in self.nodes}
        for node in self.nodes:
            for model_input, source in node.inputs.items():
                producer, dot, output = source.partition(".")
                if not dot or not output:
                    raise ValueError(
                        f"node {node.name}: input {model_input}: {source!r} is not NODE.OUTPUT"
                    )
                if producer not in names:
                    raise ValueError(
                        f"node {node.name}: input {model_input} comes from {producer!r}, which "
                        f"is not a node of this pipeline (nodes: {', '.join(sorted(names))})"
                    )
        self.order()  # refuses a cycle
        return self

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
                visit(source.partition(".")[0], [*path, name])
            state[name] = "done"
            done.append(by_name[name])

        for node in self.nodes:
            visit(node.name, [])
        return done
