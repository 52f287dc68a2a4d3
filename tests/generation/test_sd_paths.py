"""Every path a served export answers on gives diffusers' image: SD 1.x, SDXL and SD3,
text to image and image to image.

The paths: ``/generate`` (JSON), ``/generate_stream`` (cheap previews, then the decoded
image), KServe infer over HTTP (binary tensors) and gRPC (``ModelInfer``), and gRPC's
``ModelStreamInfer`` (previews, then the image). Each sends a reference case of
tools/make_sd_references.py (its prompt, seed, initial ``latents`` and, for image to
image, its PNG and strength) to the export served with its own scheduler, and the image
that comes back equals diffusers' within 1e-3 on [0, 1] pixels (plus half a level of
8-bit rounding). ``sordino generate`` and the playground cannot send ``latents``: they
are in test_sd_clients.py, equal to ``/generate`` for the same seed.
One module-scoped server serves the three tiny exports (no result cache, no coalescing:
every path computes its own image).
"""

from __future__ import annotations

import base64
import io
import json
import queue
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from sordino.config import ModelConfig
from sordino.errors import ModelLoadError, Unsupported
from sordino.generation.stable_diffusion import StableDiffusion
from sordino.inference import InferRequest
from sordino.models.repository import sources_for
from sordino.testing import RunningServer
from tests.generation.sd_common import DTYPES, TYPES, serve_exports

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sd"
KINDS = {
    # served model: (export, references, text-to-image case, image-to-image case), each
    # case with the export's own scheduler (PNDM, Euler, flow-matching Euler).
    "sd": ("tiny-sd", "pipeline_references.npz", "pndm", "img2img_pndm"),
    "xl": ("tiny-sdxl", "sdxl_references.npz", "euler", "img2img_euler"),
    "sd3": ("tiny-sd3", "sd3_references.npz", "flow", "img2img_flow"),
}
REFERENCES = {model: np.load(FIXTURES / spec[1]) for model, spec in KINDS.items()}


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with serve_exports({model: FIXTURES / spec[0] for model, spec in KINDS.items()}) as running:
        yield running


def _case(model: str, mode: str) -> dict[str, Any]:
    name = KINDS[model][2 if mode == "text" else 3]
    cases = json.loads(str(REFERENCES[model]["cases"]))
    return next(c for c in cases if c["name"] == name)


def _request(model: str, mode: str) -> tuple[dict[str, Any], np.ndarray, int]:
    """The case's inputs as arrays (the image as PNG bytes), diffusers' image [N, H, W, 3]
    in [0, 1], and the denoising steps diffusers runs for it."""
    case = _case(model, mode)
    references = REFERENCES[model]
    request = case["request"]
    body: dict[str, Any] = {
        key: value for key, value in request.items() if key in TYPES and key != "image"
    }
    body["latents"] = references[f"{case['name']}/latents_in"]
    steps = request["steps"]
    if mode == "image":
        body["image"] = references["img2img/png"].tobytes()
        strength = request["strength"]
        if model == "sd3":  # StableDiffusion3Img2ImgPipeline.get_timesteps
            steps = steps - int(max(steps - min(steps * strength, steps), 0))
        else:
            steps = min(int(steps * strength), steps)
    arrays = {key: _array(key, value) for key, value in body.items()}
    return arrays, references[f"{case['name']}/image"], steps


def _array(key: str, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, str):
        value = value.encode()
    return np.array([value], dtype=DTYPES[TYPES[key]])


def _json_body(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The arrays as ``/generate`` JSON: texts as strings, the PNG as base64, latents flat."""
    body: dict[str, Any] = {}
    for key, array in arrays.items():
        if key == "image":
            body[key] = base64.b64encode(array[0]).decode()
        elif array.dtype == np.object_:
            body[key] = array[0].decode()
        elif key == "latents":
            body[key] = array.ravel().tolist()
        else:
            body[key] = array[0].item()
    return body


def _pngs(value: str | list[str]) -> np.ndarray:
    pngs = value if isinstance(value, list) else [value]
    images = []
    for png in pngs:
        decoded = Image.open(io.BytesIO(base64.b64decode(png)))
        assert decoded.mode == "RGB"
        images.append(np.asarray(decoded))
    return np.stack(images)


def _check_previews(steps_seen: list[int], steps: int) -> None:
    """The previews' steps: at least one, counted up, within the run (PNDM's extra first
    call makes its count one more than the steps)."""
    assert steps_seen, "no preview before the image"
    assert steps_seen == sorted(set(steps_seen))
    assert all(1 <= step <= steps for step in steps_seen)


Answer = Callable[[RunningServer, str, dict[str, np.ndarray], int], tuple[np.ndarray, int]]


def _generate(
    server: RunningServer, model: str, arrays: dict[str, np.ndarray], steps: int
) -> tuple[np.ndarray, int]:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        answer = client.post(f"/v2/models/{model}/generate", json=_json_body(arrays))
    assert answer.status_code == 200, answer.text
    return _pngs(answer.json()["png"]), answer.json()["parameters"]["steps_used"]


def _generate_stream(
    server: RunningServer, model: str, arrays: dict[str, np.ndarray], steps: int
) -> tuple[np.ndarray, int]:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        answer = client.post(f"/v2/models/{model}/generate_stream", json=_json_body(arrays))
    assert answer.status_code == 200, answer.text
    events = [json.loads(line[5:]) for line in answer.text.splitlines() if line.startswith("data:")]
    *previews, last = events
    height, width = _pngs(last["png"]).shape[1:3]
    for event in previews:  # the cheap projection of the latents, not the decoder's
        assert "png" not in event
        assert len(event["image"]) == (height // 8) * (width // 8) * 3
    _check_previews([e["parameters"]["step"] for e in previews], steps)
    raw = np.asarray(last["image"], dtype=np.uint8)
    images = _pngs(last["png"])
    np.testing.assert_array_equal(raw.reshape(images.shape), images)  # the raw image too
    return images, last["parameters"]["steps_used"]


def _kserve_http(
    server: RunningServer, model: str, arrays: dict[str, np.ndarray], steps: int
) -> tuple[np.ndarray, int]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        tensors = []
        for key, array in arrays.items():
            tensor = httpclient.InferInput(key, list(array.shape), TYPES[key])
            tensor.set_data_from_numpy(array, binary_data=True)
            tensors.append(tensor)
        wanted = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("image", "png")]
        result = client.infer(model, tensors, outputs=wanted)
    finally:
        client.close()
    image = result.as_numpy("image")
    _same_as_pngs(image, result.as_numpy("png"))
    return _batched(image), result.get_response()["parameters"]["steps_used"]


def _kserve_grpc(
    server: RunningServer, model: str, arrays: dict[str, np.ndarray], steps: int
) -> tuple[np.ndarray, int]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        result = client.infer(model, _grpc_inputs(arrays))
    finally:
        client.close()
    image = result.as_numpy("image")
    _same_as_pngs(image, result.as_numpy("png"))
    return _batched(image), result.get_response().parameters["steps_used"].int64_param


def _stream_infer(
    server: RunningServer, model: str, arrays: dict[str, np.ndarray], steps: int
) -> tuple[np.ndarray, int]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    received: queue.Queue[Any] = queue.Queue()
    got = []
    try:
        client.start_stream(callback=lambda result, error: received.put(error or result))
        client.async_stream_infer(model, _grpc_inputs(arrays))
        while True:
            answer = received.get(timeout=120)
            assert not isinstance(answer, Exception), answer
            got.append(answer)
            if "steps_used" in answer.get_response().parameters:
                break
        client.stop_stream()
    finally:
        client.close()
    *previews, last = got
    image = last.as_numpy("image")
    height, width = _batched(image).shape[1:3]
    for preview in previews:
        assert preview.as_numpy("image").shape == (height // 8, width // 8, 3)
    _check_previews([p.get_response().parameters["step"].int64_param for p in previews], steps)
    return _batched(image), last.get_response().parameters["steps_used"].int64_param


def _grpc_inputs(arrays: dict[str, np.ndarray]) -> list[Any]:
    import tritonclient.grpc as grpcclient

    tensors = []
    for key, array in arrays.items():
        tensor = grpcclient.InferInput(key, list(array.shape), TYPES[key])
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def _batched(image: np.ndarray) -> np.ndarray:
    assert image.dtype == np.uint8
    return image if image.ndim == 4 else image[None]


def _same_as_pngs(image: np.ndarray, pngs: np.ndarray) -> None:
    """The PNG output is the raw image, encoded."""
    decoded = np.stack([np.asarray(Image.open(io.BytesIO(bytes(p)))) for p in pngs.ravel()])
    np.testing.assert_array_equal(decoded, _batched(image))


PATHS: dict[str, Answer] = {
    "generate": _generate,
    "generate_stream": _generate_stream,
    "kserve_http": _kserve_http,
    "kserve_grpc": _kserve_grpc,
    "model_stream_infer": _stream_infer,
}


@pytest.mark.parametrize("mode", ["text", "image"])
@pytest.mark.parametrize("model", list(KINDS))
@pytest.mark.parametrize("path", list(PATHS))
def test_every_path_answers_diffusers_image(
    server: RunningServer, path: str, model: str, mode: str
) -> None:
    arrays, expected, steps = _request(model, mode)
    image, steps_used = PATHS[path](server, model, arrays, steps)
    assert steps_used == steps
    assert image.shape == expected.shape
    assert np.abs(image / 255.0 - expected).max() <= 0.5 / 255 + 1e-3


@pytest.mark.parametrize(
    ("model", "key", "value", "says"),
    [
        ("sd", "clip_skip", 1, "diffusers' clip_skip"),
        ("xl", "clip_skip", 2, "diffusers' clip_skip"),
        ("sd3", "clip_skip", 1, "diffusers' clip_skip"),
        ("xl", "aesthetic_score", 6.0, "the SDXL refiner"),
        ("xl", "negative_aesthetic_score", 2.5, "the SDXL refiner"),
        ("xl", "denoising_end", 0.8, "the SDXL refiner"),
        ("xl", "negative_original_size", np.array([64, 64], np.int32), "negative micro-cond"),
        ("xl", "prompt_3", "a poster", "per-encoder prompts are taken by SDXL"),
        ("sd", "prompt_2", "a poster", "SD 1.x/2.x has one text encoder"),
        ("sd3", "prompt_2", "a poster", "SD3's encoders all read prompt and negative_prompt"),
        ("sd3", "prompt_3", "a poster", "SD3's encoders all read prompt and negative_prompt"),
        ("sd3", "negative_prompt_3", "fog", "SD3's encoders all read prompt and negative"),
        ("sd3", "max_sequence_length", 512, "max_sequence_length is diffusers' default, 256"),
    ],
)
def test_a_diffusers_argument_sordino_does_not_implement_is_refused_as_not_supported(
    server: RunningServer, model: str, key: str, value: Any, says: str
) -> None:
    """Never silently ignored: a 400 over HTTP, UNIMPLEMENTED over gRPC, saying why."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    plain = value.tolist() if isinstance(value, np.ndarray) else value
    body = {"prompt": "a red house", "steps": 2, key: plain}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        answer = client.post(f"/v2/models/{model}/generate", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert f"has no input {key!r}: not supported: " in error and says in error
    infer = {
        "inputs": [
            {"name": "prompt", "datatype": "BYTES", "shape": [1], "data": ["a red house"]},
            {"name": key, "datatype": _datatype(value), "shape": [len(np.atleast_1d(plain))],
             "data": np.atleast_1d(plain).tolist()},
        ]
    }  # fmt: skip
    with httpx.Client(base_url=server.url, timeout=60) as client:
        answer = client.post(f"/v2/models/{model}/infer", json=infer)
    assert answer.status_code == 400, answer.text
    assert "not supported: " in answer.json()["error"] and says in answer.json()["error"]
    array = value if isinstance(value, np.ndarray) else None
    if array is None:
        kind = np.object_ if isinstance(value, str) else type(value)
        array = np.array([value.encode() if isinstance(value, str) else value], dtype=kind)
    datatype = _datatype(value)
    if array.dtype.kind == "f":
        array = array.astype(np.float32)
    tensors_prompt = _array("prompt", "a red house")
    tensors = _grpc_inputs({"prompt": tensors_prompt})
    extra = grpcclient.InferInput(key, list(array.shape), datatype)
    extra.set_data_from_numpy(array)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as raised:
            client.infer(model, [*tensors, extra])
    finally:
        client.close()
    assert raised.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "not supported: " in raised.value.message() and says in raised.value.message()
    # A request built in-process (no protocol layer) is refused the same way.
    pipeline = server.runtime.registry.get(model).pipeline
    assert isinstance(pipeline, StableDiffusion)
    with pytest.raises(Unsupported, match=f"has no input '{key}': not supported: "):
        pipeline.parse(InferRequest(model=model, inputs={"prompt": tensors_prompt, key: array}))


def _datatype(value: Any) -> str:
    if isinstance(value, str):
        return "BYTES"
    if isinstance(value, float):
        return "FP32"
    if isinstance(value, np.ndarray) and value.dtype == np.int32:
        return "INT32"
    return "INT64"


def test_an_sdxl_refiner_export_is_refused_at_load_saying_what_to_serve(tmp_path: Path) -> None:
    """A refiner (StableDiffusionXLImg2ImgPipeline, aesthetic-score conditioning) is not
    served; the message points at the base export, which does image to image."""
    refiner = tmp_path / "refiner"
    shutil.copytree(FIXTURES / "tiny-sdxl", refiner)
    index = json.loads((refiner / "model_index.json").read_text(encoding="utf-8"))
    index.update(_class_name="StableDiffusionXLImg2ImgPipeline", requires_aesthetics_score=True)
    (refiner / "model_index.json").write_text(json.dumps(index), encoding="utf-8")
    with pytest.raises(ModelLoadError, match="SDXL refiner export is not supported: serve"):
        sources_for(ModelConfig(name="refiner", path=refiner, isolation="thread"))
