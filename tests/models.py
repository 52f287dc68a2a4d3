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


def densenet_shaped_model(path: Path, classes: int = 1000) -> Path:
    """Triton's quickstart model's tensors: ``data_0`` FP32 [batch, 3, 224, 224] →
    ``fc6_1`` [batch, classes, 1, 1] (a global average pool, then a 1×1 convolution
    whose filter ``k`` gives class ``k`` the weight ``k + 1`` on channel ``k % 3``)."""
    weights = np.zeros((classes, 3, 1, 1), np.float32)
    for k in range(classes):
        weights[k, k % 3, 0, 0] = k + 1
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["data_0"], ["pooled"]),
            helper.make_node("Conv", ["pooled", "w"], ["fc6_1"]),
        ],
        "densenet_shaped",
        [helper.make_tensor_value_info("data_0", TensorProto.FLOAT, ["batch", 3, 224, 224])],
        [helper.make_tensor_value_info("fc6_1", TensorProto.FLOAT, ["batch", classes, 1, 1])],
        [helper.make_tensor("w", TensorProto.FLOAT, list(weights.shape), weights.ravel())],
    )
    return _save(graph, path)


def grid_model(path: Path) -> Path:
    """``GRID`` FP32 [batch, rows, 4] → ``TOTAL`` [batch] (its sum) and ``TWICE``
    [batch, rows, 4] (doubled): a model whose tensors a config may ``reshape``."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["GRID", "axes"], ["TOTAL"], keepdims=0),
            helper.make_node("Mul", ["GRID", "two"], ["TWICE"]),
        ],
        "grid",
        [helper.make_tensor_value_info("GRID", TensorProto.FLOAT, ["batch", "rows", 4])],
        [
            helper.make_tensor_value_info("TOTAL", TensorProto.FLOAT, ["batch"]),
            helper.make_tensor_value_info("TWICE", TensorProto.FLOAT, ["batch", "rows", 4]),
        ],
        [two, helper.make_tensor("axes", TensorProto.INT64, [2], [1, 2])],
    )
    return _save(graph, path)
