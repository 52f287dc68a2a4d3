"""An SDXL export served as made by optimum, equal to diffusers' StableDiffusionXLPipeline.

The fixture ``tests/fixtures/sd/tiny-sdxl`` is a real ``optimum`` ONNX export of a tiny
random-weight SDXL pipeline (``tools/make_tiny_sd_export.py --xl``: two text encoders of
different widths, a UNet with ``text_time`` micro-conditioning); the references are
diffusers' own ``StableDiffusionXLPipeline`` on the same weights with fixed initial latents
(``tools/make_sd_references.py --xl``). One server serves the export once per scheduler,
in-process (``isolation: thread``) to stay light.
"""

from __future__ import annotations

import asyncio
import base64
import functools
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
from sordino.errors import ModelLoadError
from sordino.generation.clip_tokens import ClipTokenizer
from sordino.generation.reuse import Generated
from sordino.generation.stable_diffusion_xl import StableDiffusionXL
from sordino.models.repository import scan_repository, sources_for
from sordino.testing import RunningServer, serve_in_thread
from tests.generation.sd_common import (
    generate_one,
    model_for,
    pipeline_of,
    scheduler_sources,
    sd_request,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sd"
EXPORT = FIXTURES / "tiny-sdxl"
REFERENCES = np.load(FIXTURES / "sdxl_references.npz")
# Image to image's cases are test_sd_xl_sd3_image_to_image.py's.
CASES: list[dict[str, Any]] = [
    c for c in json.loads(str(REFERENCES["cases"])) if not c.get("image")
]
SCHEDULERS = {
    "euler": (None, {}),  # the export's own: EulerDiscreteScheduler as SDXL ships it
    "dpmpp": ("DPMSolverMultistepScheduler", {"use_karras_sigmas": True}),
}


_request, _one = sd_request, generate_one


def _model(case: dict[str, Any]) -> str:
    return model_for(case, "xl", SCHEDULERS, default="EulerDiscreteScheduler")


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with serve_in_thread(sources=scheduler_sources("xl", EXPORT, SCHEDULERS)) as running:
        yield running


def _pipeline(server: RunningServer, model: str) -> StableDiffusionXL:
    return pipeline_of(server, model, StableDiffusionXL)


@functools.cache
def _decoder() -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(str(EXPORT / "vae_decoder" / "model.onnx"))


def _assert_equal(result: Generated, name: str) -> None:
    assert result.sample is not None
    np.testing.assert_allclose(result.sample, REFERENCES[f"{name}/latents_out"], atol=1e-3)
    expected = REFERENCES[f"{name}/image"]
    # The pixels in [0, 1] before rounding: sordino's latents through the export's decoder.
    (decoded,) = _decoder().run(None, {"latent_sample": result.sample / np.float32(0.13025)})
    pixels = np.clip(decoded / 2 + 0.5, 0.0, 1.0).transpose(0, 2, 3, 1)
    assert np.abs(pixels - expected).max() <= 1e-3
    image = result.image if result.image.ndim == 4 else result.image[None]
    assert image.shape == expected.shape
    # The answer is those pixels * 255 rounded.
    assert np.abs(image / 255.0 - expected).max() <= 0.5 / 255 + 1e-3


def test_the_export_serves_as_four_models(server: RunningServer) -> None:
    names = {m.key.name for m in server.runtime.registry.models()}
    assert {"xl-euler", "xl-euler.text_encoder", "xl-euler.text_encoder_2"} <= names
    assert "xl-euler.vae_decoder" in names
    pipeline = _pipeline(server, "xl-euler")
    assert pipeline.config.guidance == 5.0  # diffusers' SDXL default
    assert pipeline.scaling_factor == pytest.approx(0.13025)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_images_equal_diffusers(server: RunningServer, case: dict[str, Any]) -> None:
    model = _model(case)
    body = {**case["request"], "latents": REFERENCES[f"{case['name']}/latents_in"]}
    result = server.call(_one(_pipeline(server, model), model, body))
    assert isinstance(result, Generated)
    _assert_equal(result, case["name"])


def test_concurrent_requests_share_unet_batches_and_equal_diffusers(
    server: RunningServer,
) -> None:
    """Requests of different sizes and guidance at different steps, each equal to diffusers."""
    picked = [c for c in CASES if _model(c) == "xl-euler"]
    model = server.runtime.registry.get("xl-euler")
    pipeline = _pipeline(server, "xl-euler")
    before = model.scheduler.statistics()

    async def run_all() -> list[Generated]:
        async def one(case: dict[str, Any], delay: float) -> Generated:
            await asyncio.sleep(delay)
            body = {**case["request"], "latents": REFERENCES[f"{case['name']}/latents_in"]}
            body["seed"] = 2000 + int(delay * 1000)  # no reuse of an earlier result
            return await _one(pipeline, "xl-euler", body)

        return list(await asyncio.gather(*(one(c, d) for c in picked for d in (0.0, 0.01, 0.02))))

    results = server.call(run_all())
    assert isinstance(results, list)
    for result, case in zip(results, [c for c in picked for _ in range(3)], strict=True):
        _assert_equal(result, case["name"])
    after = model.scheduler.statistics()
    calls = 3 * sum(len(pipeline.spec.start(c["request"]["steps"]).timesteps) for c in picked)
    assert after.succeeded - before.succeeded == len(results)
    assert after.batches - before.batches < calls  # some UNet batches held several requests


def test_both_tokenizers_equal_clip_tokenizer() -> None:
    prompt = "a photo of an astronaut riding a horse on the moon"
    first = ClipTokenizer(EXPORT / "tokenizer")([prompt, ""])
    second = ClipTokenizer(EXPORT / "tokenizer_2")([prompt, ""])
    np.testing.assert_array_equal(first, REFERENCES["input_ids"])
    np.testing.assert_array_equal(second, REFERENCES["input_ids_2"])
    assert not np.array_equal(first, second)  # the second pads with "!", not end-of-text


def test_generate_and_stream_answer_rgb_pngs(server: RunningServer) -> None:
    body = {"prompt": "a red house", "steps": 3, "seed": 5, "width": 48, "height": 32}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        answer = client.post("/v2/models/xl-euler/generate", json={**body, "num_images": 2})
        assert answer.status_code == 200, answer.text
        pngs = answer.json()["png"]
        assert len(pngs) == 2
        png = Image.open(io.BytesIO(base64.b64decode(pngs[0])))
        assert png.mode == "RGB" and png.size == (48, 32)
        stream = client.post("/v2/models/xl-dpmpp/generate_stream", json=body)
        assert stream.status_code == 200, stream.text
        metadata = client.get("/v2/models/xl-euler").json()
    events = [json.loads(line[6:]) for line in stream.text.splitlines() if line.strip()]
    assert [e["parameters"]["step"] for e in events[:-1]] == [1, 2]
    assert all(len(e["image"]) == (32 // 8) * (48 // 8) * 3 for e in events[:-1])
    assert "png" in events[-1] and len(events[-1]["image"]) == 32 * 48 * 3
    assert {i["name"] for i in metadata["inputs"]} >= {"prompt", "negative_prompt", "latents"}


def test_the_refiners_denoising_start_is_refused_by_name(server: RunningServer) -> None:
    image = base64.b64encode(bytes(32 * 48 * 3)).decode()
    body = {"prompt": "a red house", "steps": 3, "width": 48, "height": 32, "image": image}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        answer = client.post("/v2/models/xl-euler/generate", json={**body, "denoising_start": 0.8})
    names = {m.key.name for m in server.runtime.registry.models()}
    assert answer.status_code == 400
    assert "has no input 'denoising_start'" in answer.text
    assert "xl-euler.vae_encoder" in names  # image to image is served


def test_an_empty_negative_prompt_is_zeros_and_a_given_one_is_encoded(
    server: RunningServer,
) -> None:
    pipeline = _pipeline(server, "xl-euler")

    def condition(body: dict[str, Any]) -> Any:
        return server.call(pipeline.condition(pipeline.parse(_request("xl-euler", body))))

    absent = condition({"prompt": "a cat", "guidance": 5.0})
    empty = condition({"prompt": "a cat", "guidance": 5.0, "negative_prompt": ""})
    given = condition({"prompt": "a cat", "guidance": 5.0, "negative_prompt": "a dog"})
    assert absent.hidden.shape == (2, 77, 32 + 48) and absent.pooled.shape == (2, 24)
    assert not absent.hidden[0].any() and not absent.pooled[0].any()
    np.testing.assert_array_equal(empty.hidden, absent.hidden)
    assert given.hidden[0].any() and given.pooled[0].any()
    np.testing.assert_array_equal(given.hidden[1], absent.hidden[1])


def test_prompt_2_and_the_sizes_reach_the_unet_and_default_as_diffusers(
    server: RunningServer,
) -> None:
    """The equality itself is the case ``euler_prompt_2_and_sizes``; here, what each sets."""
    pipeline = _pipeline(server, "xl-euler")
    body = {"prompt": "a cat", "guidance": 5.0, "negative_prompt": "a dog", "width": 48}

    def condition(extra: dict[str, Any]) -> Any:
        return server.call(pipeline.condition(pipeline.parse(_request("xl-euler", extra))))

    plain = condition(body)
    explicit = condition({**body, "prompt_2": "a cat", "negative_prompt_2": "a dog"})
    np.testing.assert_array_equal(explicit.hidden, plain.hidden)
    second = condition({**body, "prompt_2": "a lion"})
    width_1 = 32  # text_encoder's width: its rows keep the first prompt
    np.testing.assert_array_equal(second.hidden[:, :, :width_1], plain.hidden[:, :, :width_1])
    assert not np.array_equal(second.hidden[1, :, width_1:], plain.hidden[1, :, width_1:])
    assert not np.array_equal(second.pooled[1], plain.pooled[1])
    np.testing.assert_array_equal(second.pooled[0], plain.pooled[0])  # negative_2 = negative
    sized = pipeline.parse(
        _request("xl-euler", {**body, "original_size": np.array([96, 80], dtype=np.int32)})
    )
    assert sized.time_ids == (96, 80, 0, 0, 64, 48)
    assert pipeline.parse(_request("xl-euler", body)).time_ids == (64, 48, 0, 0, 64, 48)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        three = client.post(
            "/v2/models/xl-euler/generate",
            json={"prompt": "a cat", "steps": 2, "crops_coords_top_left": [1, 2, 3]},
        )
        negative = client.post(
            "/v2/models/xl-euler/generate",
            json={"prompt": "a cat", "steps": 2, "target_size": [-64, 64]},
        )
        metadata = client.get("/v2/models/xl-euler").json()
    assert three.status_code == 400 and "'crops_coords_top_left' has shape [2]" in three.text
    assert negative.status_code == 400
    assert "target_size must be two integers between 0 and" in negative.json()["error"]
    names = {i["name"] for i in metadata["inputs"]}
    assert {"prompt_2", "negative_prompt_2", "original_size", "target_size"} <= names


def test_a_repository_folder_serves_sdxl_and_refuses_other_pipelines(tmp_path: Path) -> None:
    shutil.copytree(EXPORT, tmp_path / "repo" / "poster")
    names = [s.name for s in scan_repository(tmp_path / "repo")]
    assert names == [
        "poster.text_encoder",
        "poster.text_encoder_2",
        "poster.vae_decoder",
        "poster.vae_encoder",
        "poster",
    ]
    index = tmp_path / "repo" / "poster" / "model_index.json"
    index.write_text(json.dumps({"_class_name": "FluxPipeline"}), encoding="utf-8")
    with pytest.raises(ModelLoadError, match=r"FluxPipeline.*not other pipelines"):
        scan_repository(tmp_path / "repo")


def test_an_sdxl_export_without_its_second_encoder_or_hidden_states_is_named(
    tmp_path: Path,
) -> None:
    import onnx

    export = tmp_path / "xl"
    shutil.copytree(EXPORT, export)
    shutil.rmtree(export / "text_encoder_2")
    with pytest.raises(ModelLoadError, match=r"has no text_encoder_2/model\.onnx"):
        sources_for(ModelConfig(name="xl", path=export))
    shutil.copytree(EXPORT / "text_encoder_2", export / "text_encoder_2")
    encoder = onnx.load(str(export / "text_encoder" / "model.onnx"))
    kept = [o for o in encoder.graph.output if not o.name.startswith("hidden_states.")]
    del encoder.graph.output[:]
    encoder.graph.output.extend(kept)
    onnx.save(encoder, str(export / "text_encoder" / "model.onnx"))
    with pytest.raises(ModelLoadError, match=r"no outputs hidden_states\.0"):
        sources_for(ModelConfig(name="xl", path=export))


def test_a_vae_with_latents_mean_and_std_decodes_as_diffusers(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """diffusers: latents * std / scaling_factor + mean, when the VAE's config has them."""
    pipeline = _pipeline(server, "xl-euler")
    mean = np.array([0.1, -0.2, 0.3, 0.0], np.float32).reshape(1, 4, 1, 1)
    std = np.array([0.5, 1.5, 1.0, 2.0], np.float32).reshape(1, 4, 1, 1)
    monkeypatch.setattr(pipeline, "latents_mean", mean)
    monkeypatch.setattr(pipeline, "latents_std", std)
    sample = np.random.default_rng(3).standard_normal((1, 4, 8, 8)).astype(np.float32)
    image = server.call(pipeline._decode(sample))
    (decoded,) = _decoder().run(None, {"latent_sample": sample * std / np.float32(0.13025) + mean})
    expected = np.clip(decoded / 2 + 0.5, 0.0, 1.0).transpose(0, 2, 3, 1)[0]
    assert np.abs(image / 255.0 - expected).max() <= 0.5 / 255 + 1e-4
