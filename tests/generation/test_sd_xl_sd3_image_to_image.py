"""Image to image on an SDXL and an SD3 export, equal to diffusers' img2img pipelines.

The references are diffusers' ``StableDiffusionXLImg2ImgPipeline`` (the base model's
settings: no aesthetic score) and ``StableDiffusion3Img2ImgPipeline`` on the fixture
exports' torch weights, given the image, the strength and the noise added at the start
(tools/make_sd_references.py; the VAE's latent sample is drawn from numpy's
``default_rng([2, seed])`` on both sides).
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from sordino.generation.reuse import Generated
from sordino.generation.stable_diffusion import StableDiffusion
from sordino.generation.stable_diffusion_3 import StableDiffusion3
from sordino.generation.stable_diffusion_xl import StableDiffusionXL
from sordino.testing import RunningServer, serve_in_thread
from tests.generation.sd_common import (
    generate_one,
    model_for,
    pipeline_of,
    scheduler_sources,
    sd_request,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sd"
XL_SCHEDULERS = {
    "euler": (None, {}),  # the export's own EulerDiscreteScheduler
    "euler_ancestral": ("EulerAncestralDiscreteScheduler", {}),
    "dpmpp": ("DPMSolverMultistepScheduler", {"use_karras_sigmas": True}),
}
SD3_SCHEDULERS = {"flow": (None, {})}  # the export's FlowMatchEulerDiscreteScheduler
FLOW = "FlowMatchEulerDiscreteScheduler"
KINDS = {
    # kind: (export, references, model prefix, schedulers, the export's scheduler class)
    "sdxl": ("tiny-sdxl", "sdxl_references.npz", "xi", XL_SCHEDULERS, "EulerDiscreteScheduler"),
    "sd3": ("tiny-sd3", "sd3_references.npz", "si", SD3_SCHEDULERS, FLOW),
}
REFERENCES = {kind: np.load(FIXTURES / spec[1]) for kind, spec in KINDS.items()}
CASES = [
    (kind, case)
    for kind, references in REFERENCES.items()
    for case in json.loads(str(references["cases"]))
    if case.get("image")
]


def _model(kind: str, case: dict[str, Any]) -> str:
    _, _, prefix, schedulers, default = KINDS[kind]
    return model_for(case, prefix, schedulers, default=default)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    sources = []
    for export, _, prefix, schedulers, _ in KINDS.values():
        sources.extend(scheduler_sources(prefix, FIXTURES / export, schedulers))
    with serve_in_thread(sources=sources) as running:
        yield running


def _body(kind: str, case: dict[str, Any]) -> dict[str, Any]:
    references = REFERENCES[kind]
    return {
        **case["request"],
        "image": references["img2img/png"].tobytes(),
        "latents": references[f"{case['name']}/latents_in"],
    }


def _assert_equal(kind: str, result: Generated, name: str) -> None:
    references = REFERENCES[kind]
    assert result.sample is not None
    np.testing.assert_allclose(result.sample, references[f"{name}/latents_out"], atol=1e-3)
    image = result.image if result.image.ndim == 4 else result.image[None]
    expected = references[f"{name}/image"]
    assert image.shape == expected.shape
    assert np.abs(image / 255.0 - expected).max() <= 0.5 / 255 + 1e-3


def _steps_run(kind: str, steps: int, strength: float) -> int:
    """diffusers' get_timesteps: SDXL's int(steps x strength); SD3's own rounding."""
    if kind == "sd3":
        return steps - int(max(steps - min(steps * strength, steps), 0))
    return min(int(steps * strength), steps)


def test_the_cases_cover_both_exports_and_sd3s_rounding() -> None:
    assert {kind for kind, _ in CASES} == {"sdxl", "sd3"}
    rounded = [
        c for k, c in CASES if k == "sd3" and (c["request"]["steps"] * c["request"]["strength"]) % 1
    ]
    assert rounded  # a case where SD3 keeps one more step than SD's int(steps x strength)


@pytest.mark.parametrize(("kind", "case"), CASES, ids=[f"{k}-{c['name']}" for k, c in CASES])
def test_image_to_image_equals_diffusers(
    server: RunningServer, kind: str, case: dict[str, Any]
) -> None:
    model = _model(kind, case)
    pipeline = pipeline_of(server, model, StableDiffusion)
    result = server.call(generate_one(pipeline, model, _body(kind, case)))
    assert isinstance(result, Generated)
    _assert_equal(kind, result, case["name"])
    request = case["request"]
    assert result.steps_used == _steps_run(kind, request["steps"], request["strength"])


def test_sd3_image_requests_share_transformer_batches_with_text_ones(
    server: RunningServer,
) -> None:
    """Image-to-image requests run among text-to-image ones, sharing denoiser calls,
    and each still equals diffusers'."""
    case = next(c for k, c in CASES if k == "sd3" and c["request"].get("num_images", 1) == 1)
    text = {"prompt": "a red house", "steps": 6, "guidance": 5.0, "width": 48, "height": 64}
    model = server.runtime.registry.get("si-flow")
    before = model.scheduler.statistics()

    async def run_all() -> list[Generated]:
        pipeline = pipeline_of(server, "si-flow", StableDiffusion3)

        async def later(body: dict[str, Any], delay: float, tenant: str) -> Generated:
            await asyncio.sleep(delay)
            return await generate_one(pipeline, "si-flow", body, tenant)

        jobs = [later({**text, "seed": 50 + i}, 0.0, "text") for i in range(2)]
        # The same request as two tenants (neither reuses the other's): both diffusers'.
        body = _body("sd3", case)
        jobs += [later(body, 0.005, "one"), later(body, 0.01, "two")]
        return list(await asyncio.gather(*jobs))

    results = server.call(run_all())
    assert isinstance(results, list)
    for result in results[2:]:
        _assert_equal("sd3", result, case["name"])
    after = model.scheduler.statistics()
    calls = 2 * 6 + 2 * results[2].steps_used
    assert after.succeeded - before.succeeded == len(results)
    assert after.batches - before.batches < calls  # some calls held several requests


def test_the_encoders_are_served_and_the_config_says_image_to_image(
    server: RunningServer,
) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for model in ("xi-euler", "si-flow"):
            encoder = client.get(f"/v2/models/{model}.vae_encoder")
            assert encoder.status_code == 200, encoder.text
            config = client.get(f"/v2/models/{model}/config").json()
            assert config["parameters"]["sordino_image_to_image"] == {"string_value": "true"}
            metadata = client.get(f"/v2/models/{model}").json()
            assert {"image", "strength"} <= {i["name"] for i in metadata["inputs"]}


def test_generate_over_http_and_named_mistakes(server: RunningServer) -> None:
    png = base64.b64encode(REFERENCES["sd3"]["img2img/png"].tobytes()).decode()
    body = {"prompt": "a green tree", "steps": 4, "strength": 0.7, "seed": 3, "image": png}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        sd3 = client.post("/v2/models/si-flow/generate", json=body)
        xl = client.post("/v2/models/xi-euler/generate", json=body)
        bad_side = client.post(
            "/v2/models/si-flow/generate",
            json={**body, "image": base64.b64encode(bytes(40 * 32 * 3)).decode(),
                  "width": 40, "height": 32},
        )  # fmt: skip
        refiner = client.post("/v2/models/xi-euler/generate", json={**body, "denoising_end": 0.8})
    assert sd3.status_code == 200, sd3.text
    assert xl.status_code == 200, xl.text
    # 4 x 0.7 = 2.8: SD3 runs 4 - int(1.2) = 3 steps, SDXL int(2.8) = 2.
    assert sd3.json()["parameters"]["steps_used"] == 3
    assert xl.json()["parameters"]["steps_used"] == 2
    assert bad_side.status_code == 400 and "multiples of 16" in bad_side.text
    assert refiner.status_code == 400 and "has no input 'denoising_end'" in refiner.text


def test_sdxl_latents_mean_and_std_scale_the_encoded_image_as_the_decoder_undoes(
    server: RunningServer,
) -> None:
    """With the VAE's ``latents_mean``/``latents_std`` (the fixture has none), the encoded
    latents are diffusers' ``(x - mean) * scaling_factor / std``: the decoder's own
    inverse (``latents * std / scaling_factor + mean``) gives back the VAE's sample."""
    pipeline = pipeline_of(server, "xi-euler", StableDiffusionXL)
    params = pipeline.parse(sd_request("xi-euler", _body("sdxl", CASES[0][1])))
    plain = server.call(pipeline._encode_image(params))
    factor = np.float32(pipeline.scaling_factor)
    mean = np.linspace(-0.5, 0.5, 4, dtype=np.float32).reshape(1, 4, 1, 1)
    std = np.linspace(0.5, 2.0, 4, dtype=np.float32).reshape(1, 4, 1, 1)
    pipeline.latents_mean, pipeline.latents_std = mean, std
    try:
        shifted = server.call(pipeline._encode_image(params))
    finally:
        pipeline.latents_mean = pipeline.latents_std = None
    assert not np.allclose(shifted, plain)
    np.testing.assert_allclose(shifted * std / factor + mean, plain / factor, atol=1e-5)


@pytest.mark.parametrize(
    ("steps", "strength", "sd", "sd3"),
    [(10, 0.7, 7, 7), (5, 0.6, 3, 3), (4, 0.7, 2, 3), (5, 0.1, 0, 1), (3, 1.0, 3, 3)],
)
def test_a_strength_sent_as_fp32_runs_diffusers_step_count(
    server: RunningServer, steps: int, strength: float, sd: int, sd3: int
) -> None:
    """FP32's 0.7 is 0.69999999: 10 x it is 7 steps, as diffusers counts from the decimal
    (not 6); SD3 keeps ``steps - int(steps - steps x strength)``."""
    sent = float(np.float32(strength))
    for model, expected in (("xi-euler", sd), ("si-flow", sd3)):
        sampler = pipeline_of(server, model, StableDiffusion).spec.start(steps)
        fractional = pipeline_of(server, model, StableDiffusion).fractional_strength
        if expected == 0:
            with pytest.raises(ValueError, match="runs no step"):
                sampler.image_start(sent, fractional=fractional)
        else:
            assert steps - sampler.image_start(sent, fractional=fractional) == expected
