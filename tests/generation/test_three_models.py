"""The Stable-Diffusion shape: text encoder -> denoiser loop -> decoder, three ONNX models.

Tiny models written with ``onnx.helper``: the text encoder maps a prompt to a one-hot
over four words, the denoiser is linear, the decoder squashes the sample with tanh.
The served answer must equal the same pipeline computed here in numpy.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sordino.config.iterative import IterativeConfig
from sordino.config.models import ModelConfig
from sordino.generation.image import to_image
from sordino.generation.samplers import Schedule
from sordino.models.repository import ModelSource
from sordino.testing import RunningServer, serve_in_thread

WORDS = ["cat", "dog", "fish", "bird"]


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    # Opset 19: Equal compares strings from there on.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def _text_encoder(path: Path) -> Path:
    vocab = numpy_helper.from_array(np.array([WORDS], dtype=object), "vocab")
    nodes = [
        helper.make_node("Equal", ["prompt", "vocab"], ["hits"]),
        helper.make_node("Cast", ["hits"], ["embedding"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "text_encoder",
        [helper.make_tensor_value_info("prompt", TensorProto.STRING, ["b", 1])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["b", 4])],
        initializer=[vocab],
    )
    return _save(graph, path)


def _denoiser(path: Path) -> Path:
    inits = [
        numpy_helper.from_array(np.array([0.5], dtype=np.float32), "half"),
        numpy_helper.from_array(np.array([0.1], dtype=np.float32), "tenth"),
        numpy_helper.from_array(np.array([1e-4], dtype=np.float32), "tiny"),
    ]
    nodes = [
        helper.make_node("Mul", ["sample", "half"], ["a"]),
        helper.make_node("Mul", ["condition", "tenth"], ["b"]),
        helper.make_node("Mul", ["timestep", "tiny"], ["c"]),
        helper.make_node("Add", ["a", "b"], ["ab"]),
        helper.make_node("Add", ["ab", "c"], ["eps"]),
    ]
    graph = helper.make_graph(
        nodes,
        "unet",
        [
            helper.make_tensor_value_info("latent", TensorProto.FLOAT, ["b", 4]),
            helper.make_tensor_value_info("t", TensorProto.FLOAT, ["b", 1]),
            helper.make_tensor_value_info("text", TensorProto.FLOAT, ["b", 4]),
        ],
        [helper.make_tensor_value_info("eps", TensorProto.FLOAT, ["b", 4])],
        initializer=inits,
    )
    # Renamed inputs: the config maps them (sample_input, timestep_input, condition_input).
    for node in graph.node:
        node.input[:] = [{"sample": "latent", "timestep": "t", "condition": "text"}.get(i, i)
                         for i in node.input]  # fmt: skip
    return _save(graph, path)


def _decoder(path: Path) -> Path:
    two = numpy_helper.from_array(np.array([2.0], dtype=np.float32), "two")
    nodes = [
        helper.make_node("Mul", ["sample", "two"], ["scaled"]),
        helper.make_node("Tanh", ["scaled"], ["pixels"]),
    ]
    graph = helper.make_graph(
        nodes,
        "vae",
        [helper.make_tensor_value_info("sample", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["b", 4])],
        initializer=[two],
    )
    return _save(graph, path)


ITERATIVE = IterativeConfig(
    sampler="euler",
    steps={"default": 5, "max": 10},
    guidance=1.0,
    sample_shape=(4,),
    prompt="text_encoder",
    text_encoder="tiny-text",
    decoder="tiny-vae",
    sample_input="latent",
    timestep_input="t",
    condition_input="text",
    noise_output="eps",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder = tmp_path_factory.mktemp("pipeline")
    models = {
        "tiny-text": (_text_encoder(folder / "text.onnx"), None),
        "tiny-unet": (_denoiser(folder / "unet.onnx"), ITERATIVE),
        "tiny-vae": (_decoder(folder / "vae.onnx"), None),
    }
    sources = [
        ModelSource(name, "1", path, ModelConfig(name=name, path=path, iterative=iterative))
        for name, (path, iterative) in models.items()
    ]
    with serve_in_thread(sources=sources) as running:
        yield running


def _expected(word: str, seed: int, steps: int) -> np.ndarray:
    schedule = Schedule()
    condition = np.array([[w == word for w in WORDS]], dtype=np.float32)
    sample = np.random.default_rng(seed).standard_normal((1, 4)).astype(np.float32)
    plan = schedule.plan(steps)
    for i, t in enumerate(plan):
        t_next = plan[i + 1] if i + 1 < len(plan) else -1.0
        eps = (sample * np.float32(0.5) + condition * np.float32(0.1)) + np.float32(t) * np.float32(
            1e-4
        )
        sample = schedule.step("euler", sample, eps, np.array([t]), np.array([t_next]))
    return to_image(np.tanh(sample * 2.0), side=2)


def test_text_encoder_loop_and_decoder(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        answer = client.post(
            "/v2/models/tiny-unet/generate", json={"prompt": "dog", "seed": 4, "steps": 7}
        )
        steps = client.post("/v2/models/tiny-unet/generate_stream", json={"prompt": "fish"})
    assert answer.status_code == 200, answer.text
    image = np.array(answer.json()["image"], dtype=np.uint8).reshape(8, 8)
    expected = _expected("dog", 4, 7)
    assert np.max(np.abs(image.astype(int) - expected.astype(int))) <= 1  # float rounding
    assert answer.json()["parameters"]["steps_used"] == 7
    assert steps.text.count("data: ") == 5  # the default: 4 progress events and the image
    # Each of the three models ran: the encoder and decoder once a request, the loop per step.
    stats = {s.model: s for s in server.runtime.scheduler_statistics()}
    assert stats["tiny-text"].succeeded == 2 and stats["tiny-vae"].succeeded == 2
    assert stats["tiny-unet"].batches >= 12
