"""The ONNX Runtime backend: one InferenceSession per model instance."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sordino.backends.base import WARMUP_SHAPE, BackendStatistics
from sordino.backends.reshape import Reshapes
from sordino.config.memory import EXTEND_STRATEGIES, FrameworkMemoryConfig
from sordino.config.onnxruntime import OnnxRuntimeOptions
from sordino.datatypes import from_onnx_type
from sordino.errors import ModelLoadError
from sordino.inference import ModelMetadata, Tensor, TensorSpec

__all__ = ["OnnxBackend", "available_providers"]

PLATFORM = "onnxruntime_onnx"


def available_providers() -> list[str]:
    """Return the execution providers this onnxruntime build offers."""
    import onnxruntime as ort

    return list(ort.get_available_providers())


def _dims(shape: list[Any]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape)


_CPU_ARENA: FrameworkMemoryConfig | None = None
"""The CPU arena registered in this process (ONNX Runtime allows one per device)."""
_LEVELS = {
    "disable_all": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
"""``OnnxRuntimeOptions.graph_optimization_level`` -> ONNX Runtime's level's name."""


def _register_cpu_arena(memory: FrameworkMemoryConfig) -> None:
    """Register ONNX Runtime's shared CPU arena with ``memory``'s settings, once."""
    global _CPU_ARENA
    import onnxruntime as ort

    if _CPU_ARENA is not None:
        if (_CPU_ARENA.arena_extend_strategy, _CPU_ARENA.arena_max) != (
            memory.arena_extend_strategy,
            memory.arena_max,
        ):
            raise ModelLoadError(
                "this process already has a CPU arena with other settings; framework_memory "
                "needs a worker process of the model's own (isolation: process)"
            )
        return
    info = ort.OrtMemoryInfo(
        "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
    )
    config = ort.OrtArenaCfg(
        memory.arena_max, EXTEND_STRATEGIES[memory.arena_extend_strategy], -1, -1
    )
    ort.create_and_register_allocator(info, config)
    _CPU_ARENA = memory


class OnnxBackend:
    """Runs an ONNX model through ONNX Runtime.

    ``providers`` are tried in order (ONNX Runtime falls back along the list);
    asking for one this build does not have is a load error, never silently ignored.
    ``memory`` configures ONNX Runtime's arenas: the CPU arena on or off; a CPU arena
    of our own (``arena_extend_strategy``, ``arena_max``) registered once in this
    process as ONNX Runtime's shared allocator (so only in a worker process of the
    model's own); shrinking the CPU arena after large batches; and the CUDA
    provider's ``gpu_mem_limit``/``arena_extend_strategy`` when it is in the list.
    ``thread_spinning`` lets ONNX Runtime's threads busy-wait for work (off: they sleep
    between operators). ``reshapes``: tensors clients send and read in another shape
    than the model's (Triton's ``reshape``); the metadata is the clients'. ``session``:
    the other session options (the model's ``onnxruntime``).
    """

    def __init__(
        self,
        *,
        name: str,
        version: str,
        providers: list[str] | None = None,
        intra_op_threads: int | None = None,
        memory: FrameworkMemoryConfig | None = None,
        thread_spinning: bool = False,
        reshapes: Reshapes | None = None,
        session: OnnxRuntimeOptions | None = None,
    ) -> None:
        self._options = session or OnnxRuntimeOptions()
        self._name = name
        self._reshapes = reshapes
        self._spinning = thread_spinning
        self._memory = memory or FrameworkMemoryConfig()
        self._shrink_options: Any = None
        self.arena_shrinks = 0
        self._version = version
        self._providers = providers or ["CPUExecutionProvider"]
        self._intra_op_threads = intra_op_threads
        self._session: Any = None
        self._metadata: ModelMetadata | None = None
        self._string_inputs: frozenset[str] = frozenset()
        self._outputs: tuple[str, ...] = ()
        self._lock = threading.Lock()
        self._batches = self._items = self._failures = 0
        self._busy = 0.0
        self._source: tuple[Path, str] | None = None
        self._profiling: _Profiling | None = None

    @property
    def metadata(self) -> ModelMetadata:
        if self._metadata is None:
            raise ModelLoadError(f"model {self._name} is not loaded")
        return self._metadata

    def load(self, model_path: Path, device: str = "cpu") -> None:
        import onnxruntime as ort

        missing = [p for p in self._providers if p not in ort.get_available_providers()]
        if missing:
            raise ModelLoadError(
                f"model {self._name}: execution provider(s) {', '.join(missing)} are not "
                f"available in this onnxruntime build (available: "
                f"{', '.join(ort.get_available_providers())}); install the matching onnxruntime "
                "package or remove them from execution_providers"
            )
        try:
            session = self._session_for(model_path, device)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ModelLoadError(f"model {self._name}: cannot load {model_path}: {exc}") from exc
        self._source = (model_path, device)
        inputs = tuple(
            TensorSpec(i.name, from_onnx_type(i.type), _dims(i.shape)) for i in session.get_inputs()
        )
        outputs = tuple(
            TensorSpec(o.name, from_onnx_type(o.type), _dims(o.shape))
            for o in session.get_outputs()
        )
        batched = all(spec.shape and spec.shape[0] == -1 for spec in inputs + outputs)
        self._session = session
        self._string_inputs = frozenset(s.name for s in inputs if s.datatype == "BYTES")
        # Warm-up shapes a model file names for its variable dimensions (a UNet cannot
        # denoise the 1x1 latent that dummy_inputs would otherwise send).
        props = session.get_modelmeta().custom_metadata_map
        extra = {k: v for k, v in props.items() if k.startswith(WARMUP_SHAPE)}
        metadata = ModelMetadata(
            name=self._name,
            version=self._version,
            platform=PLATFORM,
            inputs=inputs,
            outputs=outputs,
            batched=batched,
            extra=extra,
        )
        self._outputs = tuple(spec.name for spec in outputs)
        if self._reshapes:
            metadata, self._reshapes = self._reshapes.metadata(metadata, f"model {self._name}")
        self._metadata = metadata

    def _session_for(self, model_path: Path, device: str, profile_prefix: str = "") -> Any:
        """A new session on ``model_path``; with ``profile_prefix``, one that profiles."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        if self._intra_op_threads:
            options.intra_op_num_threads = self._intra_op_threads
        # Spinning threads busy-wait for the next operator: a core each per session,
        # even with one request in flight (issue 16). Off unless the model asks.
        spin = "1" if self._spinning else "0"
        options.add_session_config_entry("session.intra_op.allow_spinning", spin)
        options.add_session_config_entry("session.inter_op.allow_spinning", spin)
        options.log_severity_level = 3
        tuning = self._options
        if tuning.inter_op_threads:
            options.inter_op_num_threads = tuning.inter_op_threads
        if tuning.execution_mode == "parallel":
            options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        level = _LEVELS[tuning.graph_optimization_level]
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        options.enable_mem_pattern = tuning.memory_pattern
        if tuning.device_allocator_for_initializers:
            options.add_session_config_entry("session.use_device_allocator_for_initializers", "1")
        memory = self._memory
        options.enable_cpu_mem_arena = memory.cpu_arena
        if memory.custom_cpu_arena:
            _register_cpu_arena(memory)
            options.add_session_config_entry("session.use_env_allocators", "1")
        if memory.shrink_after_rows and self._shrink_options is None:
            self._shrink_options = ort.RunOptions()
            self._shrink_options.add_run_config_entry(
                "memory.enable_memory_arena_shrinkage", "cpu:0"
            )
        if profile_prefix:
            options.enable_profiling = True
            options.profile_file_prefix = profile_prefix
        provider_options: list[dict[str, str]] = []
        for provider in self._providers:
            opts: dict[str, str] = {}
            if provider in ("CUDAExecutionProvider", "TensorrtExecutionProvider") and ":" in device:
                opts["device_id"] = device.split(":", 1)[1]
            if provider == "CUDAExecutionProvider":
                if memory.gpu_mem_limit is not None:
                    opts["gpu_mem_limit"] = str(memory.gpu_mem_limit)
                if memory.gpu_arena_extend_strategy is not None:
                    opts["arena_extend_strategy"] = memory.gpu_arena_extend_strategy
            provider_options.append(opts)
        return ort.InferenceSession(
            str(model_path),
            sess_options=options,
            providers=self._providers,
            provider_options=provider_options,
        )

    def infer(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        session = self._session
        if session is None:
            raise ModelLoadError(f"model {self._name} is not loaded")
        reshapes = self._reshapes
        feed = {
            name: _to_str_array(arr) if name in self._string_inputs else arr
            for name, arr in (reshapes.inputs_to_model(batch) if reshapes else batch).items()
        }
        rows = int(next(iter(batch.values())).shape[0]) if batch else 0
        shrink = self._memory.shrink_after_rows
        options = self._shrink_options if shrink and rows >= shrink else None
        start = time.perf_counter()
        try:
            results = session.run(None, feed, options)
        except Exception:
            with self._lock:
                self._failures += 1
            raise
        elapsed = time.perf_counter() - start
        with self._lock:
            if options is not None:
                self.arena_shrinks += 1
            self._batches += 1
            self._items += rows
            self._busy += elapsed
        outputs = dict(zip(self._outputs, results, strict=True))
        return reshapes.outputs_to_client(outputs) if reshapes else outputs

    def unload(self) -> None:
        self._session = None
        self._profiling = None

    def start_profiling(self, prefix: str) -> None:
        """Serve later batches from a profiling session; its trace file starts with ``prefix``.

        ONNX Runtime profiles only a session created with profiling on, so a second
        session is opened on the same file, device and options, and swapped in (a batch
        already running finishes on the session it started with). Profiling that is
        already on is ended first and its trace abandoned. Raises what onnxruntime raises
        if the session cannot be created; the serving session is then unchanged.
        """
        if self._source is None:
            raise ModelLoadError(f"model {self._name} is not loaded")
        session = self._session_for(*self._source, profile_prefix=prefix)
        abandoned = self._profiling
        original = abandoned.original if abandoned is not None else self._session
        with self._lock:
            self._profiling = _Profiling(session, original, self._batches)
            self._session = session
        if abandoned is not None:
            abandoned.session.end_profiling()

    def stop_profiling(self) -> tuple[str, int]:
        """Put the serving session back; return the trace file and the batches profiled.

        Call it when no batch is running on this backend (a batch still running on the
        profiling session would race with the end of the trace). Raises
        :class:`RuntimeError` when profiling is not on.
        """
        profiling = self._profiling
        if profiling is None:
            raise RuntimeError(f"model {self._name} is not being profiled")
        with self._lock:
            self._profiling = None
            self._session = profiling.original
            batches = self._batches - profiling.batches_before
        return str(profiling.session.end_profiling()), batches

    @property
    def profiling(self) -> bool:
        """Whether batches are being profiled now."""
        return self._profiling is not None

    def statistics(self) -> BackendStatistics:
        with self._lock:
            return BackendStatistics(self._batches, self._items, self._failures, self._busy)


@dataclass(frozen=True, slots=True)
class _Profiling:
    session: Any
    original: Any
    batches_before: int


def _to_str_array(arr: Tensor) -> Tensor:
    # onnxruntime's string tensors take str objects; bytes would be stringified as "b'...'".
    flat = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in arr.reshape(-1)]
    return np.array(flat, dtype=object).reshape(arr.shape)
