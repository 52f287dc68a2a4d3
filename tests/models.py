"""Small ONNX models made on the fly for tests (identity per datatype, a slow model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ONNX_TYPES = {
    "BOOL": TensorProto.BOOL, "UINT8": TensorProto.UINT8, "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32, "UINT64": TensorProto.UINT64, "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16, "INT32": TensorProto.INT32, "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16, "FP32": TensorProto.FLOAT, "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}  # fmt: skip


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def identity_model(path: Path, datatype: str, width: int = 3) -> Path:
    """``x`` [batch, width] of ``datatype`` → ``y`` = x."""
    t = ONNX_TYPES[datatype]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        f"identity_{datatype.lower()}",
        [helper.make_tensor_value_info("x", t, ["batch", width])],
        [helper.make_tensor_value_info("y", t, ["batch", width])],
    )
    return _save(graph, path)


def slow_model(path: Path, size: int = 1536, repeats: int = 3) -> Path:
    """``x`` FP32 [batch, 1] → ``y`` [batch, 1], after ``repeats`` size×size matmuls.

    Each batch costs about ``repeats * 2 * size**3`` FLOPs whatever its size: a model
    that keeps an instance busy long enough for requests to queue behind it.
    """
    weight = helper.make_tensor(
        "w", TensorProto.FLOAT, [size, size], np.full(size * size, 1e-4, np.float32)
    )
    # The chain starts from the input so ONNX Runtime cannot fold it into a constant.
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Mul", ["w", "s"], ["m0"]),
    ]
    for i in range(repeats):
        nodes.append(helper.make_node("MatMul", [f"m{i}", "w"], [f"m{i + 1}"]))
    nodes += [
        helper.make_node("ReduceSum", [f"m{repeats}"], ["total"], keepdims=0),
        helper.make_node("Mul", ["x", "total"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        initializer=[weight],
    )  # fmt: skip
    return _save(graph, path)
