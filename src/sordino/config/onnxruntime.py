"""A model's ``onnxruntime`` section: how ONNX Runtime runs its session (the session
options Triton's ONNX Runtime backend takes as ``config.pbtxt`` parameters)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sordino.config.base import Section

__all__ = ["GraphOptimizationLevel", "OnnxRuntimeOptions"]

GraphOptimizationLevel = Literal["disable_all", "basic", "extended", "all"]


class OnnxRuntimeOptions(Section):
    """ONNX Runtime's session options for one model (``docs/backends.md``)."""

    inter_op_threads: int | None = Field(default=None, ge=1, le=1024)
    """Threads that run independent operators at once, with ``execution_mode: parallel``
    (``inter_op_num_threads``); None: ONNX Runtime's default."""
    execution_mode: Literal["sequential", "parallel"] = "sequential"
    """Run the graph's operators one after another, or independent branches at once."""
    graph_optimization_level: GraphOptimizationLevel = "all"
    """How far ONNX Runtime rewrites the graph when the session opens (``disable_all``,
    ``basic``, ``extended``, ``all``)."""
    memory_pattern: bool = True
    """Plan the tensors' memory from the first run's shapes (``enable_mem_pattern``)."""
    device_allocator_for_initializers: bool = False
    """Allocate the weights with the device's allocator, outside the arena (session
    option ``session.use_device_allocator_for_initializers``)."""

    @property
    def is_default(self) -> bool:
        return self == OnnxRuntimeOptions()
