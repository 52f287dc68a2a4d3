"""Image to image on a Stable Diffusion export, equal to diffusers' img2img pipeline.

The references are diffusers' ``StableDiffusionImg2ImgPipeline`` on the fixture export's
torch weights, per scheduler, given the image, the strength and the noise added at the
start timestep (tools/make_sd_references.py; the VAE's latent sample is drawn from
numpy's ``default_rng([2, seed])`` on both sides).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from sordino.config import ModelConfig
from sordino.generation.reuse import Generated
from sordino.generation.stable_diffusion import StableDiffusion
from sordino.inference import InferRequest
from sordino.models.repository import sources_for
from sordino.testing import RunningServer, serve_in_thread
from tests.generation.sd_common import (
    generate_one,
    model_for,
    pipeline_of,
    scheduler_sources,
    sd_request,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sd"
EXPORT = FIXTURES / "tiny-sd"
REFERENCES = np.load(FIXTURES / "pipeline_references.npz")
CASES: list[dict[str, Any]] = [c for c in json.loads(str(REFERENCES["cases"])) if c.get("image")]
PNG = REFERENCES["img2img/png"].tobytes()
PIXELS = REFERENCES["img2img/pixels"]
SCHEDULERS = {
    "pndm": ("PNDMScheduler", {}),
    "ddim": ("DDIMScheduler", {}),
    "euler_ancestral": ("EulerAncestralDiscreteScheduler", {}),
    "dpmpp": ("DPMSolverMultistepScheduler", {"use_karras_sigmas": True}),
    "lcm": ("LCMScheduler", {}),
}


def _model(case: dict[str, Any]) -> str:
    return model_for(case, "i2i", SCHEDULERS)


def _request(model: str, body: dict[str, Any], tenant: str = "default") -> InferRequest:
    return sd_request(model, body, tenant)


async def _one(
    pipeline: StableDiffusion, model: str, body: dict[str, Any], tenant: str = "default"
) -> Generated:
    return await generate_one(pipeline, model, body, tenant)


def _pipeline(server: RunningServer, model: str) -> StableDiffusion:
    return pipeline_of(server, model, StableDiffusion)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    sources = scheduler_sources("i2i", EXPORT, SCHEDULERS, guidance=7.5)
    plain = tmp_path_factory.mktemp("export") / "tiny-sd"
    shutil.copytree(EXPORT, plain, ignore=shutil.ignore_patterns("vae_encoder"))
    sources.extend(sources_for(ModelConfig(name="no-encoder", path=plain, isolation="thread")))
    with serve_in_thread(sources=sources) as running:
        yield running


def _body(case: dict[str, Any]) -> dict[str, Any]:
    return {**case["request"], "image": PNG, "latents": REFERENCES[f"{case['name']}/latents_in"]}


def _assert_equal(result: Generated, name: str) -> None:
    assert result.sample is not None
    np.testing.assert_allclose(result.sample, REFERENCES[f"{name}/latents_out"], atol=1e-3)
    image = result.image if result.image.ndim == 4 else result.image[None]
    expected = REFERENCES[f"{name}/image"]
    assert image.shape == expected.shape
    assert np.abs(image / 255.0 - expected).max() <= 0.5 / 255 + 1e-3


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_image_to_image_equals_diffusers(server: RunningServer, case: dict[str, Any]) -> None:
    model = _model(case)
    result = server.call(_one(_pipeline(server, model), model, _body(case)))
    assert isinstance(result, Generated)
    _assert_equal(result, case["name"])
    steps, strength = case["request"]["steps"], case["request"]["strength"]
    assert result.steps_used == min(int(steps * strength), steps)


def test_concurrent_image_and_text_requests_share_unet_batches(server: RunningServer) -> None:
    """Image-to-image requests run among text-to-image ones, sharing UNet calls, and
    each still equals diffusers'."""
    case = next(c for c in CASES if _model(c) == "i2i-ddim")
    text = {"prompt": "a red house", "steps": 6, "guidance": 5.0, "width": 48, "height": 64}
    model = server.runtime.registry.get("i2i-ddim")
    before = model.scheduler.statistics()

    async def run_all() -> list[Generated]:
        pipeline = _pipeline(server, "i2i-ddim")

        async def later(body: dict[str, Any], delay: float, tenant: str) -> Generated:
            await asyncio.sleep(delay)
            return await _one(pipeline, "i2i-ddim", body, tenant)

        jobs = [later({**text, "seed": 50 + i}, 0.0, "text") for i in range(2)]
        # The same request as two tenants (neither reuses the other's): both diffusers'.
        jobs += [later(_body(case), 0.005, "one"), later(_body(case), 0.01, "two")]
        return list(await asyncio.gather(*jobs))

    results = server.call(run_all())
    assert isinstance(results, list)
    for result in results[2:]:
        _assert_equal(result, case["name"])
    after = model.scheduler.statistics()
    calls = 2 * 6 + 2 * results[2].steps_used
    assert after.succeeded - before.succeeded == len(results)
    assert after.batches - before.batches < calls  # some UNet calls held several requests


def test_png_base64_and_raw_rgb_give_the_same_image(server: RunningServer) -> None:
    body = {"prompt": "a green tree", "steps": 4, "strength": 0.75, "seed": 3}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        png = client.post(
            "/v2/models/i2i-pndm/generate",
            json={**body, "image": base64.b64encode(PNG).decode()},
        )
        assert png.status_code == 200, png.text
        raw = client.post(
            "/v2/models/i2i-pndm/generate",
            json={
                **body,
                "image": base64.b64encode(PIXELS.tobytes()).decode(),
                "width": PIXELS.shape[1],
                "height": PIXELS.shape[0],
                "parameters": {"tenant": "other"},  # not the first one's cached result
            },
        )
        assert raw.status_code == 200, raw.text
    first, second = png.json(), raw.json()
    assert first["png"] == second["png"]
    assert first["parameters"]["steps_used"] == 3
    decoded = Image.open(io.BytesIO(base64.b64decode(first["png"])))
    assert decoded.size == (PIXELS.shape[1], PIXELS.shape[0])


def test_kserve_infer_and_stream_take_an_image(server: RunningServer) -> None:
    image = base64.b64encode(PNG).decode()
    infer = {
        "inputs": [
            {"name": "prompt", "datatype": "BYTES", "shape": [1], "data": ["a blue sea"]},
            {"name": "image", "datatype": "BYTES", "shape": [1], "data": [image]},
            {"name": "strength", "datatype": "FP32", "shape": [1], "data": [0.5]},
            {"name": "steps", "datatype": "INT32", "shape": [1], "data": [4]},
            {"name": "seed", "datatype": "INT64", "shape": [1], "data": [8]},
        ],
        "outputs": [{"name": "image"}],
    }
    with httpx.Client(base_url=server.url, timeout=60) as client:
        answer = client.post("/v2/models/i2i-euler_ancestral/infer", json=infer)
        assert answer.status_code == 200, answer.text
        output = answer.json()["outputs"][0]
        assert output["shape"] == [PIXELS.shape[0], PIXELS.shape[1], 3]
        stream = client.post(
            "/v2/models/i2i-euler_ancestral/generate_stream",
            json={"prompt": "a blue sea", "image": image, "strength": 0.5, "steps": 4, "seed": 9},
        )
    assert stream.status_code == 200, stream.text
    events = [json.loads(line[6:]) for line in stream.text.splitlines() if line.strip()]
    assert [e["parameters"]["step"] for e in events[:-1]] == [1]
    assert all(e["parameters"]["steps"] == 2 for e in events[:-1])
    assert events[-1]["parameters"]["steps_used"] == 2


def _png(width: int, height: int) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 10, 10)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.parametrize(
    ("model", "body", "says"),
    [
        ("i2i-pndm", {"image": "bm90IGFuIGltYWdl"}, "is not an image: send a PNG"),
        ("i2i-pndm", {"image": "%%%"}, "is not an image"),
        ("i2i-pndm", {"image": _png(50, 40)}, "the image is 50x40; image to image needs"),
        ("i2i-pndm", {"image": _png(48, 64), "strength": 1.5}, "strength must be between 0"),
        ("i2i-pndm", {"image": _png(48, 64), "strength": 0.1}, "strength 0.1 with 5 steps"),
        ("i2i-pndm", {"image": _png(48, 64), "width": 64}, "image to image answers at"),
        ("i2i-pndm", {"strength": 0.5}, "strength applies to image to image"),
        ("no-encoder", {"image": _png(48, 64)}, "has no VAE encoder (vae_encoder/model.onnx)"),
        (
            "i2i-pndm",
            {"image": _png(48, 64), "latents": [0.0] * 4},
            "latents must be finite FP32 of shape [1, 4, 8, 6]",
        ),
    ],
)
def test_image_mistakes_are_named(
    server: RunningServer, model: str, body: dict[str, Any], says: str
) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        answer = client.post(
            f"/v2/models/{model}/generate", json={"prompt": "a cat", "steps": 5, **body}
        )
    assert answer.status_code == 400, answer.text
    assert says in answer.text


def test_the_encoder_is_a_model_of_its_own(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        encoder = client.get("/v2/models/i2i-pndm.vae_encoder")
        generator = client.get("/v2/models/i2i-pndm").json()
        plain = client.get("/v2/models/no-encoder.vae_encoder")
    assert encoder.status_code == 200
    assert [o["name"] for o in encoder.json()["outputs"]] == ["latent_parameters"]
    assert {"image", "strength"} <= {i["name"] for i in generator["inputs"]}
    assert plain.status_code == 404
    assert _pipeline(server, "i2i-pndm").metadata.extra["image_to_image"] == "true"
    assert _pipeline(server, "no-encoder").metadata.extra["image_to_image"] == "false"
