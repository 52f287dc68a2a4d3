"""A pipeline's wiring checked against its nodes' models: where each node input comes
from, what the pipeline takes and returns (``server/pipelines.py`` builds on it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from sordino.config.pipelines import PIPELINE_INPUTS, NodeConfig, PipelineConfig
from sordino.errors import ModelLoadError
from sordino.inference import ModelMetadata, TensorSpec

__all__ = ["outputs_of", "source_of", "spec_matches", "tensors_of"]


def source_of(node: NodeConfig, model_input: str) -> tuple[str, str]:
    """Where ``node``'s input ``model_input`` comes from: (node, output), or
    (:data:`PIPELINE_INPUTS`, pipeline input); an unwired input is the pipeline input
    of its own name."""
    source = node.inputs.get(model_input)
    if source is None:
        return PIPELINE_INPUTS, model_input
    producer, _, output = source.partition(".")
    return producer, output


def outputs_of(
    config: PipelineConfig, models: Mapping[str, ModelMetadata]
) -> dict[str, tuple[str, str, TensorSpec | None]]:
    """The pipeline's outputs: name -> (node, node's output, that output's spec).

    ``config.outputs`` when given; otherwise every node output no node reads, by its
    own name (two of the same name are refused)."""
    if config.outputs:
        found: dict[str, tuple[str, str, TensorSpec | None]] = {}
        for name, source in config.outputs.items():
            producer, _, output = source.partition(".")
            found[name] = (producer, output, models[producer].output(output))
        return found
    consumed = {source for node in config.nodes for source in node.inputs.values()}
    kept: dict[str, tuple[str, str, TensorSpec | None]] = {}
    for node in config.order():
        for spec in models[node.name].outputs:
            if f"{node.name}.{spec.name}" in consumed:
                continue
            if spec.name in kept:
                raise ModelLoadError(
                    f"pipeline {config.name}: two nodes leave an output called {spec.name}; "
                    "consume one of them in a later node, or name the outputs (outputs:)"
                )
            kept[spec.name] = (node.name, spec.name, spec)
    return kept


def spec_matches(output: TensorSpec, target: TensorSpec) -> bool:
    if output.datatype != target.datatype or len(output.shape) != len(target.shape):
        return False
    return all(
        a == b or a == -1 or b == -1 for a, b in zip(output.shape, target.shape, strict=True)
    )


def tensors_of(
    config: PipelineConfig, models: Mapping[str, ModelMetadata]
) -> tuple[dict[str, TensorSpec], dict[str, TensorSpec]]:
    """The pipeline's inputs and outputs, by name, once every wire is checked against
    the nodes' models (``models``: each node's): the tensors exist, and an output has
    the datatype and shape of the input it feeds (:class:`ModelLoadError` otherwise)."""
    where = f"pipeline {config.name}"
    inputs: dict[str, TensorSpec] = {}
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
            producer, output_name = source_of(node, spec.name)
            if producer == PIPELINE_INPUTS:
                seen = inputs.setdefault(output_name, replace(spec, name=output_name))
                if seen.optional and not spec.optional:  # optional only if every reader's is
                    seen = inputs[output_name] = replace(seen, optional=False)
                if not spec_matches(seen, spec):
                    raise ModelLoadError(
                        f"{where}: pipeline input {output_name} is {seen.datatype} "
                        f"{list(seen.shape)} for one node and {spec.datatype} "
                        f"{list(spec.shape)} for node {node.name} (input {spec.name})"
                    )
                continue
            source = f"{producer}.{output_name}"
            output = models[producer].output(output_name)
            if output is None:
                outputs = ", ".join(s.name for s in models[producer].outputs)
                raise ModelLoadError(
                    f"{where}, node {node.name}: input {spec.name} reads {source}, but node "
                    f"{producer} has no output {output_name!r} (outputs: {outputs})"
                )
            if not spec_matches(output, spec):
                raise ModelLoadError(
                    f"{where}, node {node.name}: input {spec.name} is {spec.datatype} "
                    f"{list(spec.shape)}, but {source} is {output.datatype} "
                    f"{list(output.shape)}: the datatypes and shapes must match"
                )
    outputs_specs: dict[str, TensorSpec] = {}
    for name, (producer, output_name, made) in outputs_of(config, models).items():
        if made is None:
            outputs = ", ".join(s.name for s in models[producer].outputs)
            raise ModelLoadError(
                f"{where}: output {name} reads {producer}.{output_name}, but node {producer} "
                f"has no output {output_name!r} (outputs: {outputs})"
            )
        outputs_specs[name] = replace(made, name=name)
    return inputs, outputs_specs
