"""A served diffusers export answers on every surface digits-diffusion does.

KServe infer over HTTP (JSON and binary tensors) and gRPC (``ModelInfer``), gRPC's
``ModelStreamInfer`` (per-step previews, then the image), each with the request's
parameters, giving the same image as ``/generate`` for the same request; and sizes the
UNet cannot take answered with a 400 that names the multiple. One module-scoped server
serves the tiny SD 1.x export (with its VAE encoder) and the tiny SDXL export.
"""

from __future__ import annotations

import base64
import io
import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from sordino.testing import RunningServer
from tests.generation.sd_common import DTYPES, TYPES, serve_exports

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sd"
# Both tiny UNets have two blocks: latents halve once, so a side must be a multiple of 16 px.
MULTIPLE = 16


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    exports = {"sd": FIXTURES / "tiny-sd", "xl": FIXTURES / "tiny-sdxl"}
    with serve_exports(exports, scheduler="EulerDiscreteScheduler") as running:
        yield running


def _png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    pixels = np.arange(width * height * 3, dtype=np.uint32).reshape(height, width, 3) % 251
    Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def _body(model: str, **extra: Any) -> dict[str, Any]:
    """A small request with every text-to-image parameter set."""
    body: dict[str, Any] = {
        "prompt": "a red house",
        "negative_prompt": "blurry",
        "width": 32,
        "height": 48,
        "steps": 3,
        "guidance": 4.0,
        "seed": 11,
        "num_images": 2,
    }
    body.update(extra)
    return body


def _latents(num: int, width: int, height: int) -> np.ndarray:
    rng = np.random.default_rng(4)
    return rng.standard_normal((num, 4, height // 8, width // 8)).astype(np.float32)


def _generated(server: RunningServer, model: str, body: dict[str, Any]) -> np.ndarray:
    """The image ``/generate`` answers for ``body`` ([N, H, W, 3] or [H, W, 3])."""
    json_body = {k: v.ravel().tolist() if isinstance(v, np.ndarray) else v for k, v in body.items()}
    with httpx.Client(base_url=server.url, timeout=120) as client:
        answer = client.post(f"/v2/models/{model}/generate", json=json_body)
    assert answer.status_code == 200, answer.text
    pngs = answer.json()["png"]
    pngs = pngs if isinstance(pngs, list) else [pngs]
    images = [np.asarray(Image.open(io.BytesIO(base64.b64decode(p)))) for p in pngs]
    return np.stack(images) if len(images) > 1 else images[0]


def _numpy(key: str, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (str, bytes)):
        return np.array([value.encode() if isinstance(value, str) else value], dtype=object)
    dtype = DTYPES[TYPES[key]]
    return np.array([value], dtype=dtype)


@pytest.mark.parametrize("model", ["sd", "xl"])
def test_kserve_infer_over_http_json_equals_generate(server: RunningServer, model: str) -> None:
    latents = _latents(2, 32, 48)
    body = _body(model, latents=latents)
    inputs = []
    for key, value in body.items():
        array = _numpy(key, value)
        data = [v.decode() for v in array.ravel()] if array.dtype == object else array.ravel()
        inputs.append(
            {
                "name": key,
                "datatype": TYPES[key],
                "shape": list(array.shape),
                "data": data if array.dtype == object else data.tolist(),
            }
        )
    request = {
        "inputs": inputs,
        "outputs": [{"name": "image"}, {"name": "png", "parameters": {"binary_data": True}}],
    }
    with httpx.Client(base_url=server.url, timeout=120) as client:
        answer = client.post(f"/v2/models/{model}/infer", json=request)
    assert answer.status_code == 200, answer.text

    length = int(answer.headers["inference-header-content-length"])
    header = json.loads(answer.content[:length])
    outputs = {o["name"]: o for o in header["outputs"]}
    assert outputs["image"]["datatype"] == "UINT8"
    assert outputs["image"]["shape"] == [2, 48, 32, 3]
    image = np.asarray(outputs["image"]["data"], dtype=np.uint8).reshape(2, 48, 32, 3)
    assert header["parameters"]["steps_used"] == 3
    np.testing.assert_array_equal(image, _generated(server, model, body))


@pytest.mark.parametrize("model", ["sd", "xl"])
def test_kserve_infer_with_binary_tensors_and_grpc_equal_generate(
    server: RunningServer, model: str
) -> None:
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    body = _body(model, latents=_latents(2, 32, 48))
    expected = _generated(server, model, body)

    def inputs(module: Any) -> list[Any]:
        made = []
        for key, value in body.items():
            array = _numpy(key, value)
            tensor = module.InferInput(key, list(array.shape), TYPES[key])
            if module is httpclient:
                tensor.set_data_from_numpy(array, binary_data=True)
            else:
                tensor.set_data_from_numpy(array)
            made.append(tensor)
        return made

    http = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        wanted = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("image", "png")]
        result = http.infer(model, inputs(httpclient), outputs=wanted)
    finally:
        http.close()
    np.testing.assert_array_equal(result.as_numpy("image"), expected)
    assert bytes(result.as_numpy("png")[0]).startswith(b"\x89PNG")
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        answer = grpc.infer(model, inputs(grpcclient))
    finally:
        grpc.close()
    np.testing.assert_array_equal(answer.as_numpy("image"), expected)
    pngs = answer.as_numpy("png")
    assert pngs is not None and len(pngs) == 2
    first = np.asarray(Image.open(io.BytesIO(bytes(pngs[0]))))
    np.testing.assert_array_equal(first, expected[0])
    assert answer.get_response().parameters["steps_used"].int64_param == 3


@pytest.mark.parametrize("model", ["sd", "xl"])
def test_model_stream_infer_sends_previews_then_the_image(
    server: RunningServer, model: str
) -> None:
    import tritonclient.grpc as grpcclient

    body = _body(model, steps=4, num_images=1, seed=21)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    received: queue.Queue[Any] = queue.Queue()
    try:
        client.start_stream(callback=lambda result, error: received.put(error or result))
        tensors = []
        for key, value in body.items():
            array = _numpy(key, value)
            tensor = grpcclient.InferInput(key, list(array.shape), TYPES[key])
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        client.async_stream_infer(model, tensors)
        got = [received.get(timeout=120) for _ in range(4)]
        client.stop_stream()
    finally:
        client.close()
    assert not any(isinstance(g, Exception) for g in got), got
    previews = got[:-1]
    for step, preview in enumerate(previews, start=1):
        response = preview.get_response()
        assert response.parameters["step"].int64_param == step
        image = preview.as_numpy("image")
        assert image.shape == (48 // 8, 32 // 8, 3) and image.dtype == np.uint8
    last = got[-1]
    np.testing.assert_array_equal(last.as_numpy("image"), _generated(server, model, body))
    assert last.get_response().parameters["steps_used"].int64_param == 4


def test_image_to_image_over_grpc(server: RunningServer) -> None:
    import tritonclient.grpc as grpcclient

    png = _png(32, 48)
    body = {"prompt": "a blue sea", "image": png, "strength": 0.5, "steps": 4, "seed": 8}
    json_body = {**body, "image": base64.b64encode(png).decode()}
    expected = _generated(server, "sd", json_body)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensors = []
        for key, value in body.items():
            array = _numpy(key, value)
            tensor = grpcclient.InferInput(key, list(array.shape), TYPES[key])
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        answer = client.infer("sd", tensors)
    finally:
        client.close()
    np.testing.assert_array_equal(answer.as_numpy("image"), expected)
    assert answer.get_response().parameters["steps_used"].int64_param == 2


@pytest.mark.parametrize("model", ["sd", "xl"])
@pytest.mark.parametrize(("width", "height"), [(40, 32), (32, 24)])
def test_a_size_the_unet_cannot_take_is_a_400_naming_the_multiple(
    server: RunningServer, model: str, width: int, height: int
) -> None:
    body = {"prompt": "a cat", "steps": 2, "width": width, "height": height}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        answer = client.post(f"/v2/models/{model}/generate", json=body)
        config = client.get(f"/v2/models/{model}/config").json()
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert f"multiples of {MULTIPLE}" in error and f"got {width}x{height}" in error
    assert config["parameters"]["sordino_size_multiple"] == {"string_value": str(MULTIPLE)}


def test_an_image_of_a_size_the_unet_cannot_take_is_a_400(server: RunningServer) -> None:
    image = base64.b64encode(_png(40, 32)).decode()
    with httpx.Client(base_url=server.url, timeout=60) as client:
        answer = client.post(
            "/v2/models/sd/generate", json={"prompt": "a cat", "steps": 2, "image": image}
        )
    assert answer.status_code == 400, answer.text
    assert f"multiples of {MULTIPLE}" in answer.json()["error"]
    assert "the image is 40x32" in answer.json()["error"]
