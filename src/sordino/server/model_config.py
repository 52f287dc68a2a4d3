"""Model metadata and Triton's model-config JSON for a loaded model."""

from __future__ import annotations

from typing import Any

from sordino.config.warmup import WarmupSample
from sordino.datatypes import to_triton_type
from sordino.inference import TensorSpec
from sordino.records import LevelQueue, QueueSettings
from sordino.server.pipelines import PipelineExecutor
from sordino.server.runtime import LoadedModel
from sordino.server.sequence_config import sequence_batching_json

__all__ = ["model_metadata_json", "triton_config_json"]


def model_metadata_json(model: LoadedModel, versions: list[str]) -> dict[str, Any]:
    """Return the KServe v2 model metadata response."""
    meta = model.metadata
    return {
        "name": meta.name,
        "versions": versions,
        "platform": meta.platform,
        "inputs": [_tensor(spec) for spec in meta.inputs if spec.name not in meta.filled],
        "outputs": [_tensor(spec) for spec in meta.outputs],
    }


def _tensor(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}


def _config_tensor(spec: TensorSpec, batched: bool, *, output: bool = False) -> dict[str, Any]:
    """An ``input`` or ``output`` entry with every field Triton 2.51 writes (its defaults
    where sordino has nothing to say), in its order."""
    dims = list(spec.item_shape if batched else spec.shape)
    data_type = to_triton_type(spec.datatype)
    entry: dict[str, Any] = {"name": spec.name, "data_type": data_type}
    if not output:
        entry["format"] = "FORMAT_NONE"
    entry["dims"] = dims
    if spec.reshape is not None:
        entry["reshape"] = {"shape": list(spec.reshape)}
    if output:
        entry.update(label_filename="", is_shape_tensor=False, is_non_linear_format_io=False)
        return entry
    entry.update(is_shape_tensor=False, allow_ragged_batch=False, optional=spec.optional,
                 is_non_linear_format_io=False)  # fmt: skip
    return entry


_OPTIMIZATION = {
    "priority": "PRIORITY_DEFAULT",
    "input_pinned_memory": {"enable": True},
    "output_pinned_memory": {"enable": True},
    "gather_kernel_buffer_threshold": 0,
    "eager_batching": False,
}
"""Triton's ``optimization`` section as it fills it in for a model that sets none."""


def _tritons_defaults(
    model: LoadedModel, config: dict[str, Any], *, filename: str | None = None
) -> dict[str, Any]:
    """``config`` with the fields Triton 2.51 fills in for every model that does not set
    them (``GET …/config`` of a model whose config.pbtxt is a few lines), in its order;
    ``filename`` is the ``default_model_filename`` (None: the file the model serves)."""
    source = model.source
    filled: dict[str, Any] = {}
    for key, value in config.items():
        filled[key] = value
        if key == "backend":
            filled["runtime"] = ""
        elif key == "output":
            filled.update(batch_input=[], batch_output=[])
            if config["platform"] != "ensemble":  # (Triton gives an ensemble none)
                filled["optimization"] = _OPTIMIZATION
        elif key == "instance_group":
            for group in value:
                group.update(gpus=[], secondary_devices=[], profile=[], passive=False,
                             host_policy="")  # fmt: skip
            filled["default_model_filename"] = (
                filename
                if filename is not None
                else source.config.default_model_filename or source.path.name
            )
            filled.update(cc_model_filenames={}, metric_tags={})
    filled["model_warmup"] = [_warmup_json(sample) for sample in source.config.model_warmup]
    return dict(sorted(filled.items(), key=lambda item: _RANK.get(item[0], len(_RANK))))


_ORDER = (
    "name", "platform", "backend", "runtime", "version_policy", "max_batch_size", "input",
    "output", "batch_input", "batch_output", "optimization", "dynamic_batching",
    "sequence_batching", "ensemble_scheduling", "instance_group", "default_model_filename",
    "cc_model_filenames", "metric_tags", "parameters", "model_warmup", "model_operations",
    "model_transaction_policy", "model_repository_agents", "response_cache",
)  # fmt: skip
"""The order of Triton's ``ModelConfig`` fields, which its JSON keeps."""
_RANK = {key: at for at, key in enumerate(_ORDER)}


def _warmup_json(sample: WarmupSample) -> dict[str, Any]:
    """A ``model_warmup`` sample as Triton's JSON writes it."""
    inputs = {name: given.model_dump(exclude_defaults=True)
              for name, given in sample.inputs.items()}  # fmt: skip
    return {"name": sample.name, "batch_size": sample.batch_size, "inputs": inputs,
            "count": sample.count}  # fmt: skip


def triton_config_json(model: LoadedModel) -> dict[str, Any]:
    """Return the model configuration in Triton's JSON form (``GET .../config``)."""
    meta = model.metadata
    scheduling = model.scheduling
    batched = scheduling.max_batch_size > 0
    policy = scheduling.policy
    queue = scheduling.queue
    controller = model.scheduler.statistics().controller
    backend = model.source.config.backend
    config: dict[str, Any] = {
        "name": meta.name,
        # As Triton 2.51: a platform for a model served by one (onnxruntime_onnx), none
        # for a backend's own kind of model (a Python model: backend python, platform "").
        "platform": meta.platform if meta.platform != backend else "",
        "backend": backend,
        "version_policy": _version_policy(model),
        # An iterative model's public tensors are one request's (the steps are batched).
        "max_batch_size": scheduling.max_batch_size if meta.batched else 0,
        "input": [
            _config_tensor(spec, batched and meta.batched)
            for spec in meta.inputs
            if spec.name not in meta.filled
        ],
        "output": [
            _config_tensor(spec, batched and meta.batched, output=True) for spec in meta.outputs
        ],
        "instance_group": [
            {"name": _group_name(model), "kind": "KIND_CPU", "count": model.instances}
        ],
        "parameters": {
            "sordino_mode": {"string_value": scheduling.mode},
            "sordino_effective_mode": {"string_value": controller.effective_mode},
            "sordino_max_batch": {"string_value": str(controller.max_batch)},
        },
    }
    if model.pipeline is not None:
        cache = model.pipeline.config.step_cache
        shown = f"threshold={cache.threshold:g},max_skips={cache.max_skips}"
        config["parameters"]["sordino_step_cache"] = {
            "string_value": shown if cache.enabled else "off"
        }
        # The generator's defaults and limits (steps, guidance, sizes), what a client
        # such as the playground offers.
        for key, value in meta.extra.items():
            if key in _GENERATOR_SETTINGS:
                config["parameters"][f"sordino_{key}"] = {"string_value": value}
    if model.source.config.response_cache:
        config["response_cache"] = {"enable": True}
    if checksums := model.source.config.checksums:
        agent = {"name": "checksum", "parameters": dict(checksums)}
        config["model_repository_agents"] = {"agents": [agent]}
    executor = model.scheduler.executor
    if isinstance(executor, PipelineExecutor):
        # As Triton shows an ensemble: its steps, no instances, no batcher of its own.
        config.update(platform="ensemble", backend="", instance_group=[])
        config["ensemble_scheduling"] = {"step": executor.steps()}
        config["model_transaction_policy"] = {"decoupled": False}
        return _tritons_defaults(model, config, filename="")
    if meta.stream is not None or model.pipeline is not None or meta.decoupled:
        # Triton's word for a model that may send several responses per request.
        config["model_transaction_policy"] = {"decoupled": True}
    # A model whose requests never join (a config.pbtxt with no dynamic_batching) shows
    # none, as Triton shows such a model; one whose configuration has a batcher shows it
    # (a Python model's, as its backend completed it), even for batches of one.
    asked = (
        model.source.config.dynamic_batching.enabled is True
        or meta.extra.get("dynamic_batching") == "on"
    )
    sequences = model.source.config.sequence_batching
    if sequences is not None:  # (its batcher is the sequence batcher's, as on Triton)
        config["sequence_batching"] = sequence_batching_json(sequences, meta, policy)
    elif batched and (policy.max_batch > 1 or asked):
        config["dynamic_batching"] = {
            "preferred_batch_size": list(policy.preferred),
            "max_queue_delay_microseconds": round(policy.max_delay_s * 1e6),
            "preserve_ordering": queue.preserve_ordering,
            "priority_levels": queue.priority_levels,
            "default_priority_level": queue.default_priority,
            "default_queue_policy": _queue_policy_json(queue),
            # Triton's map, its keys as text (uint64 in JSON); shown empty without levels
            # of their own, as Triton shows it.
            "priority_queue_policy": {
                str(level): _queue_policy_json(own)
                for level, own in enumerate(queue.levels, 1)
                if own is not None
            },
        }
    return _tritons_defaults(model, config)


def _queue_policy_json(policy: QueueSettings | LevelQueue) -> dict[str, Any]:
    """A ``ModelQueuePolicy`` as Triton's JSON writes it: the model's, or a level's own."""
    return {
        "timeout_action": policy.timeout_action,
        "default_timeout_microseconds": round(policy.default_timeout_s * 1e6),
        "allow_timeout_override": policy.allow_timeout_override,
        "max_queue_size": policy.max_queue_size,
    }


_GENERATOR_SETTINGS = frozenset(
    {
        "steps_default",
        "steps_max",
        "guidance_default",
        "width_default",
        "height_default",
        "size_multiple",
        "image_to_image",
    }
)


def _version_policy(model: LoadedModel) -> dict[str, Any]:
    policy = model.source.config.version_policy
    if policy.latest is not None:
        return {"latest": {"num_versions": policy.latest.num_versions}}
    if policy.specific is not None:
        return {"specific": {"versions": list(policy.specific.versions)}}
    return {"all": {}}


def _group_name(model: LoadedModel) -> str:
    """The instance group's name as Triton gives one its configuration does not name:
    ``MODEL_0`` for a group the configuration lists, ``MODEL`` where it lists none."""
    listed = "instance_count" in model.source.config.model_fields_set
    return f"{model.key.name}_0" if listed else model.key.name
