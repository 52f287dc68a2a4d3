"""A Triton ``config.pbtxt`` beside an ONNX model: what sordino takes, checks and refuses.

Triton's ONNX Runtime models are the commonest Triton repository. Their
``config.pbtxt`` is read as Triton reads it (:func:`onnx_settings`): the batching,
version, sequence, warm-up and instance settings of :func:`~sordino.backends.pbtxt_settings.
sordino_settings`, with the dynamic batcher Triton's ONNX Runtime backend adds to a
model that batches when none is given (no wait to fill a batch); ONNX Runtime's
``intra_op_thread_count`` parameter,
each output's ``label_filename``, a tensor's ``reshape`` (clients see ``dims``, the model
its ``reshape``: ``backends/reshape.py``), and the ``input`` and ``output`` lists, which are
checked against the model when it loads (:func:`check_declared`): every tensor named
exists with that datatype and a shape the model's fits, and a ``max_batch_size`` above
0 needs a model whose first dimension is variable. A field that would change what
Triton does and that sordino does not do is refused by name rather than ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sordino.backends.pbtxt_settings import sordino_settings
from sordino.config.models import ModelConfig
from sordino.datatypes import from_triton_type
from sordino.errors import ConfigError, ModelLoadError
from sordino.inference import ModelMetadata, TensorSpec

__all__ = ["check_declared", "onnx_settings"]

_TAKEN = frozenset(
    {
        "name",
        "platform",
        "backend",
        "max_batch_size",
        "input",
        "output",
        "version_policy",
        "dynamic_batching",
        "sequence_batching",
        "instance_group",
        "model_warmup",
        "parameters",
        "optimization",
        "default_model_filename",
        "response_cache",
        "model_transaction_policy",
        "model_repository_agents",
    }
)
"""Fields read (or checked) here; any other one set is refused by name."""

_OPTIMIZATION_TAKEN = frozenset(
    {"input_pinned_memory", "output_pinned_memory", "priority", "graph", "execution_accelerators"}
)
"""GPU transfer hints and Triton's default priority (nothing to do on sordino's CPU
path), the graph optimization level, and the execution accelerators (GPU ones left
unread off a GPU, as Triton leaves them; the others refused: :func:`onnx_settings`)."""
_GRAPH_LEVELS = {-1: "basic", 1: "extended", 2: "disable_all"}
"""Triton's ``optimization { graph { level } }`` (any other value: every optimization)."""

_TENSOR_TAKEN = frozenset({"name", "data_type", "dims", "format", "label_filename", "reshape"})
_PARAMETERS = {
    "intra_op_thread_count": ("intra_op_threads",),
    "inter_op_thread_count": ("onnxruntime", "inter_op_threads"),
    "execution_mode": ("onnxruntime", "execution_mode"),
    "enable_mem_pattern": ("onnxruntime", "memory_pattern"),
    "session.use_device_allocator_for_initializers": (
        "onnxruntime",
        "device_allocator_for_initializers",
    ),
    "enable_mem_arena": ("framework_memory", "cpu_arena"),
    "memory.enable_memory_arena_shrinkage": ("framework_memory", "shrink_after_rows"),
    "gpu_mem_limit": ("framework_memory", "gpu_mem_limit"),
    "arena_extend_strategy": ("framework_memory", "gpu_arena_extend_strategy"),
}
"""Triton's ONNX Runtime backend parameters sordino takes, and where each goes in its
own configuration (:func:`_parameter` reads the value as Triton does)."""
_TRUE, _FALSE = ("true", "1", "on", "yes"), ("false", "0", "off", "no")
_CUDA_ONLY = (
    "cudnn_conv_algo_search",
    "do_copy_in_default_stream",
    "gpu_mem_limit",
    "arena_extend_strategy",
)
"""Parameters Triton's backend reads only for an instance on a GPU (the CUDA provider's;
sordino takes the last two, the CUDA arena's, into ``framework_memory``)."""


def onnx_settings(config: Mapping[str, Any], *, source: str) -> dict[str, Any]:
    """What sordino's ``ModelConfig`` takes from the ``config.pbtxt`` of an ONNX model."""
    settings = sordino_settings(config, source=source)
    rows = int(config.get("max_batch_size", 0) or 0)
    if "dynamic_batching" not in config and "sequence_batching" not in config and rows != 1:
        # Triton's ONNX Runtime backend completes the configuration of a model that
        # batches with a dynamic batcher at its defaults (no wait); without one, rows
        # above 1 could only come from a single request.
        settings["dynamic_batching"] = {"max_queue_delay_microseconds": 0}
    refused = [key for key in config if key not in _TAKEN and _set(config[key])]
    optimization = _one(config.get("optimization"))
    refused += [
        f"optimization.{key}"
        for key in optimization
        if key not in _OPTIMIZATION_TAKEN and _set(optimization[key])
    ]
    if str(optimization.get("priority", "PRIORITY_DEFAULT")) != "PRIORITY_DEFAULT":
        refused.append("optimization.priority")
    if _set(_one(config.get("model_transaction_policy")).get("decoupled")):
        refused.append("model_transaction_policy.decoupled")
    # Triton's backend adds GPU execution accelerators (TensorRT, CUDA settings) only to an
    # instance on a GPU and never reads them for one on the CPU, as sordino runs a model
    # whose instance group is not KIND_GPU: there they are left as Triton leaves them.
    on_gpu = settings.get("instance_kind") == "gpu"
    accelerators = _one(optimization.get("execution_accelerators"))
    for key, value in accelerators.items():
        if _set(value) and (on_gpu or key != "gpu_execution_accelerator"):
            refused.append(f"optimization.execution_accelerators.{key}")
    graph = _one(optimization.get("graph"))
    if "level" in graph:
        level = _whole(graph["level"], f"{source}: optimization.graph.level")
        settings["onnxruntime"] = {"graph_optimization_level": _GRAPH_LEVELS.get(level, "all")}
    for key, value in (config.get("parameters") or {}).items():
        path = _PARAMETERS.get(key)
        text = value.get("string_value") if isinstance(value, Mapping) else value
        if key in _CUDA_ONLY and not on_gpu:
            continue  # (as the accelerators above)
        if path is None:
            refused.append(f"parameters.{key}")
            continue
        taken = _parameter(key, str(text).strip(), f"{source}: parameters.{key}")
        if taken is None:
            continue
        if len(path) == 1:
            settings[path[0]] = taken
        else:
            settings.setdefault(path[0], {})[path[1]] = taken
    labels: dict[str, str] = {}
    for kind in ("input", "output"):
        declared = []
        for tensor in config.get(kind) or ():
            where = f"{kind} {tensor.get('name', '?')}"
            refused += [
                f"{where}: {key}"
                for key in tensor
                if key not in _TENSOR_TAKEN and _set(tensor[key])
            ]
            label = tensor.get("label_filename")
            if isinstance(label, list):  # (the parser keeps it as a list)
                label = label[0] if len(label) == 1 else None
            if label:
                labels[str(tensor.get("name"))] = str(label)
            entry = {
                "name": tensor.get("name"),
                "data_type": tensor.get("data_type"),
                "dims": list(tensor.get("dims", ())),
            }
            if "reshape" in tensor:  # (backends/reshape.py)
                entry["reshape"] = tensor["reshape"]
            declared.append(entry)
        settings[kind] = declared
    if labels:
        settings["label_filename"] = labels
    if refused:
        raise ConfigError(
            f"{source}: sordino does not support {', '.join(sorted(refused))} for an ONNX "
            f"model; remove {'it' if len(refused) == 1 else 'them'} (docs/backends.md says "
            "what it takes from config.pbtxt)"
        )
    return settings


def _whole(text: Any, where: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise ConfigError(f"{where} is {text!r}; give a whole number") from None


def _flag(text: str, where: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ConfigError(f"{where} is {text!r}; give 1 or 0 (true or false)")


def _parameter(key: str, text: str, where: str) -> Any:
    """The value sordino takes for Triton's ONNX Runtime parameter ``key`` given as
    ``text`` (None: Triton's default, nothing to set); ConfigError for a value Triton
    refuses, or one sordino does not do."""
    if key in ("intra_op_thread_count", "inter_op_thread_count"):
        count = _whole(text, where)
        return count if count > 0 else None  # 0: ONNX Runtime's own choice
    if key == "execution_mode":
        mode = _whole(text, where)
        if mode not in (0, 1):
            raise ConfigError(f"{where} is {mode}; give 0 (sequential) or 1 (parallel)")
        return "parallel" if mode else "sequential"
    if key == "memory.enable_memory_arena_shrinkage":
        if text.replace(" ", "") != "cpu:0":
            raise ConfigError(
                f'{where} is {text!r}; sordino shrinks only the CPU arena: give "cpu:0" '
                "(or remove it)"
            )
        return 1  # Triton shrinks after every run: a batch of one row or more
    if key == "gpu_mem_limit":
        return _whole(text, where)
    if key == "arena_extend_strategy":
        strategies = {0: "kNextPowerOfTwo", 1: "kSameAsRequested"}
        strategy = strategies.get(_whole(text, where))
        if strategy is None:
            raise ConfigError(
                f"{where} is {text!r}; give 0 (kNextPowerOfTwo) or 1 (kSameAsRequested)"
            )
        return strategy
    return _flag(text, where)  # enable_mem_pattern, enable_mem_arena, the allocator's


def _one(value: Any) -> dict[str, Any]:
    """A message field given once or more (protobuf's text format merges the repeats)."""
    if isinstance(value, list):
        merged: dict[str, Any] = {}
        for part in value:
            merged.update(part if isinstance(part, Mapping) else {})
        return merged
    return dict(value) if isinstance(value, Mapping) else {}


def _set(value: Any) -> bool:
    """Whether a field is set to other than its protobuf default (which asks nothing)."""
    if isinstance(value, Mapping):
        return any(_set(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_set(v) for v in value)
    return value not in (None, 0, 0.0, False, "")


def check_declared(config: ModelConfig, metadata: ModelMetadata) -> None:
    """Refuse a model whose tensors are not those its ``config.pbtxt`` declares, as
    Triton does (:class:`ModelLoadError` naming the tensor and both shapes)."""
    where = f"model {metadata.name}: config.pbtxt"
    batching = bool(config.max_batch_size)
    if batching and not metadata.batched:
        raise ModelLoadError(
            f"{where}: max_batch_size {config.max_batch_size}, but the model's first "
            "dimension is fixed, so it cannot batch: set max_batch_size: 0 and give the "
            "full shapes"
        )
    for kind, declared, specs in (
        ("input", config.input, metadata.inputs),
        ("output", config.output, metadata.outputs),
    ):
        known = {spec.name: spec for spec in specs}
        for tensor in declared:
            spec = known.get(tensor.name)
            if spec is None:
                raise ModelLoadError(
                    f"{where}: {kind} {tensor.name!r} is not one of the model's "
                    f"({', '.join(known)}); rename or remove it"
                )
            _check_tensor(where, kind, tensor.data_type, tensor.dims, spec, batching)


def _check_tensor(
    where: str, kind: str, data_type: str, dims: tuple[int, ...], spec: TensorSpec, batching: bool
) -> None:
    datatype = from_triton_type(data_type)
    if datatype != spec.datatype:
        raise ModelLoadError(
            f"{where}: {kind} {spec.name} is {data_type}, but the model's is {spec.datatype}"
        )
    shape = spec.item_shape if batching else spec.shape
    fits = len(dims) == len(shape) and all(
        a == b or -1 in (a, b) for a, b in zip(dims, shape, strict=True)
    )
    if not fits:
        raise ModelLoadError(
            f"{where}: {kind} {spec.name} has dims {list(dims)}, but the model's are "
            f"{list(shape)}{' (after the batch dimension)' if batching else ''}"
        )
