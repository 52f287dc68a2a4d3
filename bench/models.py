"""The benchmark models, generated with fixed seeds (``python -m bench.models`` writes them).

- W1 light: MLP 256→1024→1024→256 (Gemm+Relu, FP32), input ``x`` [batch, 256];
- W2 heavy: a small convolutional network on 64×64 RGB images, input ``image``
  [batch, 3, 64, 64] → ``logits`` [batch, 10], a few milliseconds at batch 1 on a
  2-core machine.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MODELS_DIR = Path(__file__).parent / ".models"


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array.astype(np.float32), name)


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def mlp(path: Path = MODELS_DIR / "mlp.onnx") -> Path:
    """W1: 256→1024→1024→256 with ReLU between the layers."""
    rng = np.random.default_rng(0)
    sizes = [256, 1024, 1024, 256]
    inits, nodes = [], []
    current = "x"
    for i, (n_in, n_out) in enumerate(pairwise(sizes)):
        inits += [
            _init(f"w{i}", rng.normal(0, (2 / n_in) ** 0.5, (n_in, n_out))),
            _init(f"b{i}", np.zeros(n_out)),
        ]
        out = f"h{i}" if i < len(sizes) - 2 else "y"
        nodes.append(
            helper.make_node(
                "Gemm", [current, f"w{i}", f"b{i}"], [out + "_pre" if out != "y" else "y"]
            )
        )
        if out != "y":
            nodes.append(helper.make_node("Relu", [out + "_pre"], [out]))
        current = out
    graph = helper.make_graph(
        nodes, "w1_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 256])],
        initializer=inits,
    )  # fmt: skip
    return _save(graph, path)


def cnn(path: Path = MODELS_DIR / "cnn.onnx") -> Path:
    """W2: four 3×3 conv+ReLU blocks (96, 192, 192, 192 channels; strides 1, 2, 2, 1),
    global average pooling and a dense layer to 10 classes (about 0.7 GFLOP a row)."""
    rng = np.random.default_rng(1)
    channels = [3, 96, 192, 192, 192]
    strides = [1, 2, 2, 1]
    inits, nodes = [], []
    current = "image"
    for i, (c_in, c_out) in enumerate(pairwise(channels)):
        inits += [
            _init(f"k{i}", rng.normal(0, (2 / (9 * c_in)) ** 0.5, (c_out, c_in, 3, 3))),
            _init(f"c{i}", np.zeros(c_out)),
        ]
        stride = strides[i]
        nodes += [
            helper.make_node("Conv", [current, f"k{i}", f"c{i}"], [f"conv{i}"],
                             pads=[1, 1, 1, 1], strides=[stride, stride]),
            helper.make_node("Relu", [f"conv{i}"], [f"act{i}"]),
        ]  # fmt: skip
        current = f"act{i}"
    inits += [_init("wd", rng.normal(0, 0.1, (192, 10))), _init("bd", np.zeros(10))]
    nodes += [
        helper.make_node("GlobalAveragePool", [current], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "wd", "bd"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "w2_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 64, 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        initializer=inits,
    )  # fmt: skip
    return _save(graph, path)


if __name__ == "__main__":
    for build in (mlp, cnn):
        print(build())


def identity(width: int, path: Path | None = None) -> Path:
    """``x`` FP32 [batch, width] → ``y`` = x: no compute, only the data path (bench_ray)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        f"identity_{width}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
    )
    return _save(graph, path or MODELS_DIR / f"identity_{width}.onnx")
