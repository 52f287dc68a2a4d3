"""Triton's ONNX Runtime backend parameters in an ONNX model's ``config.pbtxt``
(``inter_op_thread_count``, ``execution_mode``, ``enable_mem_pattern``,
``enable_mem_arena``, the arena's shrinkage, the initializers' allocator, the CUDA
arena's deprecated ``gpu_mem_limit`` and ``arena_extend_strategy``) and ``optimization
{ graph { level } }``, read as that backend reads them; sordino refused every one but
``intra_op_thread_count`` before ("sordino does not support parameters.… for an ONNX
model")."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from sordino.backends.onnx import OnnxBackend
from sordino.config import RuntimeConfig
from sordino.config.onnxruntime import OnnxRuntimeOptions
from sordino.errors import ConfigError
from sordino.models.repository import builtin_sources, scan_repository
from sordino.testing import serve_in_thread

TUNED = """
platform: "onnxruntime_onnx"
max_batch_size: 8
optimization { graph : { level : 1 } }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
parameters { key: "inter_op_thread_count" value: { string_value: "2" } }
parameters { key: "execution_mode" value: { string_value: "1" } }
parameters { key: "enable_mem_pattern" value: { string_value: "0" } }
parameters { key: "enable_mem_arena" value: { string_value: "1" } }
parameters { key: "memory.enable_memory_arena_shrinkage" value: { string_value: "cpu:0" } }
parameters { key: "session.use_device_allocator_for_initializers" value: { string_value: "1" } }
parameters { key: "gpu_mem_limit" value: { string_value: "4294967296" } }
parameters { key: "arena_extend_strategy" value: { string_value: "1" } }
"""


def _simple(root: Path, text: str) -> Path:
    simple = next(s for s in builtin_sources() if s.name == "simple")
    (root / "simple" / "1").mkdir(parents=True)
    shutil.copyfile(simple.path, root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(text)
    return root


def test_the_backends_parameters_become_the_models_settings(tmp_path: Path) -> None:
    (source,) = scan_repository(_simple(tmp_path, TUNED))
    config = source.config
    assert config.intra_op_threads == 1
    assert config.onnxruntime == OnnxRuntimeOptions(
        inter_op_threads=2,
        execution_mode="parallel",
        graph_optimization_level="extended",
        memory_pattern=False,
        device_allocator_for_initializers=True,
    )
    memory = config.framework_memory
    assert (memory.cpu_arena, memory.shrink_after_rows) == (True, 1)
    # The CUDA arena's settings are read, as Triton reads them, only for a GPU instance.
    assert (memory.gpu_mem_limit, memory.gpu_arena_extend_strategy) == (None, None)
    on_gpu = TUNED + "instance_group [ { kind: KIND_GPU } ]\n"
    (source,) = scan_repository(_simple(tmp_path / "gpu", on_gpu))
    memory = source.config.framework_memory
    assert (memory.gpu_mem_limit, memory.gpu_arena_extend_strategy) == (
        4294967296,
        "kSameAsRequested",
    )


@pytest.mark.parametrize(
    ("level", "ours"), [(-1, "basic"), (1, "extended"), (2, "disable_all"), (0, "all")]
)
def test_tritons_graph_levels(tmp_path: Path, level: int, ours: str) -> None:
    text = f'platform: "onnxruntime_onnx"\noptimization {{ graph {{ level: {level} }} }}\n'
    (source,) = scan_repository(_simple(tmp_path, text))
    assert source.config.onnxruntime.graph_optimization_level == ours


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("execution_mode", "2", "parameters.execution_mode is 2; give 0 (sequential) or 1"),
        ("enable_mem_pattern", "maybe", "parameters.enable_mem_pattern is 'maybe'; give 1 or 0"),
        ("inter_op_thread_count", "two", "parameters.inter_op_thread_count is 'two'; give a"),
        ("memory.enable_memory_arena_shrinkage", "cpu:0;gpu:0", "shrinks only the CPU arena"),
        ("arena_extend_strategy", "2", "give 0 (kNextPowerOfTwo) or 1 (kSameAsRequested)"),
    ],
)
def test_a_value_triton_refuses_is_refused(tmp_path: Path, key: str, value: str, said: str) -> None:
    text = (
        'platform: "onnxruntime_onnx"\n'
        f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
        "instance_group [ { kind: KIND_GPU } ]\n"  # (the CUDA arena's are read only there)
    )
    with pytest.raises(ConfigError, match=re.escape(said)):
        scan_repository(_simple(tmp_path, text))


def test_the_session_is_opened_with_them() -> None:
    simple = next(s for s in builtin_sources() if s.name == "simple")
    backend = OnnxBackend(
        name="simple",
        version="1",
        session=OnnxRuntimeOptions(
            inter_op_threads=2,
            execution_mode="parallel",
            graph_optimization_level="disable_all",
            memory_pattern=False,
            device_allocator_for_initializers=True,
        ),
    )
    backend.load(simple.path)
    options = backend._session.get_session_options()
    assert options.inter_op_num_threads == 2
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert options.enable_mem_pattern is False
    key = "session.use_device_allocator_for_initializers"
    assert options.get_session_config_entry(key) == "1"
    defaults = OnnxBackend(name="simple", version="1")
    defaults.load(simple.path)
    options = defaults._session.get_session_options()
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert options.enable_mem_pattern is True


def test_a_tuned_triton_repository_serves(tmp_path: Path) -> None:
    """In the model's worker process, with every parameter above."""
    (source,) = scan_repository(_simple(tmp_path, TUNED))
    with serve_in_thread(RuntimeConfig(), [source]) as server:
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        inputs = []
        x = np.arange(2 * 16, dtype=np.int32).reshape(2, 16)
        for name in ("INPUT0", "INPUT1"):
            tensor = httpclient.InferInput(name, [2, 16], "INT32")
            tensor.set_data_from_numpy(x)
            inputs.append(tensor)
        result = client.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * x)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), 0 * x)
        client.close()


def test_a_python_model_refuses_them() -> None:
    from pydantic import ValidationError

    from sordino.config.models import ModelConfig

    with pytest.raises(ValidationError, match="a Python model opens itself"):
        ModelConfig(backend="python", onnxruntime={"execution_mode": "parallel"})
    ModelConfig(backend="python", onnxruntime={})


GPU_TUNED = """
platform: "onnxruntime_onnx"
max_batch_size: 8
optimization { execution_accelerators {
  gpu_execution_accelerator : [ {
    name : "tensorrt"
    parameters { key: "precision_mode" value: "FP16" }
    parameters { key: "max_workspace_size_bytes" value: "1073741824" }
  } ]
} }
parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } }
"""


def test_gpu_settings_are_left_for_an_instance_on_the_cpu(tmp_path: Path) -> None:
    """Triton's backend reads TensorRT and CUDA settings only for an instance on a GPU:
    a repository tuned for one serves on the CPU, on Triton and on sordino; on a GPU
    instance sordino refuses them by name (it does not pass them on)."""
    (source,) = scan_repository(_simple(tmp_path / "auto", GPU_TUNED))
    assert source.config.instance_kind == "auto"
    cpu = GPU_TUNED + "instance_group [ { kind: KIND_CPU } ]\n"
    (source,) = scan_repository(_simple(tmp_path / "cpu", cpu))
    with serve_in_thread(RuntimeConfig(), [source]) as server:
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        assert client.is_model_ready("simple")
        client.close()
    gpu = GPU_TUNED + "instance_group [ { kind: KIND_GPU } ]\n"
    said = "optimization.execution_accelerators.gpu_execution_accelerator, parameters.cudnn"
    with pytest.raises(ConfigError, match=re.escape(said)):
        scan_repository(_simple(tmp_path / "gpu", gpu))
    openvino = GPU_TUNED.replace("gpu_execution_accelerator", "cpu_execution_accelerator")
    with pytest.raises(ConfigError, match=re.escape("execution_accelerators.cpu_execution_acc")):
        scan_repository(_simple(tmp_path / "openvino", openvino))
