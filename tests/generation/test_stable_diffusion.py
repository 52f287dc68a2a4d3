"""A Stable Diffusion export served as made by optimum, equal to diffusers.

The fixture ``tests/fixtures/sd/tiny-sd`` is a real ``optimum`` ONNX export of a tiny
random-weight SD 1.x pipeline (tools/make_tiny_sd_export.py); the references are
diffusers' own ``StableDiffusionPipeline`` on the same weights, per scheduler, with fixed
initial latents (tools/make_sd_references.py). One server serves the export once per
scheduler (``iterative.scheduler``), in-process (``isolation: thread``) to stay light.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import shutil
from collections.abc import Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from sordino.config import ModelConfig
from sordino.config.iterative import IterativeConfig
from sordino.errors import ModelLoadError
from sordino.generation.clip_tokens import ClipTokenizer
from sordino.generation.reuse import Generated
from sordino.generation.stable_diffusion import StableDiffusion
from sordino.models.repository import scan_repository, sources_for
from sordino.testing import RunningServer, serve_in_thread
from tests.generation.sd_common import model_for, scheduler_sources, sd_request

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sd"
EXPORT = FIXTURES / "tiny-sd"
REFERENCES = np.load(FIXTURES / "pipeline_references.npz")
# Text to image (image to image: test_sd_image_to_image.py).
CASES: list[dict[str, Any]] = [
    c for c in json.loads(str(REFERENCES["cases"])) if not c.get("image")
]
SCHEDULERS = {
    "pndm": ("PNDMScheduler", {}),
    "ddim": ("DDIMScheduler", {}),
    "euler": ("EulerDiscreteScheduler", {}),
    "euler_ancestral": ("EulerAncestralDiscreteScheduler", {}),
    "dpmpp": ("DPMSolverMultistepScheduler", {"use_karras_sigmas": True}),
    "lcm": ("LCMScheduler", {}),
}


_request = sd_request


def _model(case: dict[str, Any]) -> str:
    return model_for(case, "sd", SCHEDULERS)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with serve_in_thread(
        sources=scheduler_sources("sd", EXPORT, SCHEDULERS, guidance=7.5)
    ) as running:
        yield running


def _generate(server: RunningServer, model: str, body: dict[str, Any]) -> Generated:
    pipeline = server.runtime.registry.get(model).pipeline
    assert isinstance(pipeline, StableDiffusion)

    async def run() -> Generated:
        params = pipeline.parse(_request(model, body))
        running = pipeline.run(params, priority=2, timeout_s=None, request_id=None, progress=False)
        async with aclosing(running) as answers:
            async for answer in answers:
                if isinstance(answer, tuple):
                    return answer[0]
        raise AssertionError("no image")

    result = server.call(run())
    assert isinstance(result, Generated)
    return result


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_images_equal_diffusers(server: RunningServer, case: dict[str, Any]) -> None:
    name = case["name"]
    body = {**case["request"], "latents": REFERENCES[f"{name}/latents_in"]}
    result = _generate(server, _model(case), body)
    assert result.sample is not None
    np.testing.assert_allclose(result.sample, REFERENCES[f"{name}/latents_out"], atol=1e-3)
    image = result.image if result.image.ndim == 4 else result.image[None]
    expected = REFERENCES[f"{name}/image"]
    assert image.shape == expected.shape
    # The references are [0, 1] floats; sordino's answer is those * 255 rounded.
    assert np.abs(image / 255.0 - expected).max() <= 0.5 / 255 + 1e-3


def test_rows_at_different_steps_share_unet_batches(server: RunningServer) -> None:
    """Concurrent requests each equal their reference, and some UNet calls held several."""
    picked = [c for c in CASES if _model(c) == "sd-pndm"]
    model = server.runtime.registry.get("sd-pndm")
    before = model.scheduler.statistics()

    async def run_all() -> list[Generated]:
        pipeline = model.pipeline
        assert isinstance(pipeline, StableDiffusion)

        async def one(case: dict[str, Any], delay: float) -> Generated:
            await asyncio.sleep(delay)
            body = {**case["request"], "latents": REFERENCES[f"{case['name']}/latents_in"]}
            body["seed"] = 1000 + int(delay * 1000)  # no reuse of an earlier result
            params = pipeline.parse(_request("sd-pndm", body))
            running = pipeline.run(
                params, priority=2, timeout_s=None, request_id=None, progress=False
            )
            async with aclosing(running) as answers:
                async for answer in answers:
                    if isinstance(answer, tuple):
                        return answer[0]
            raise AssertionError("no image")

        jobs = [one(case, delay) for case in picked for delay in (0.0, 0.01, 0.02)]
        return list(await asyncio.gather(*jobs))

    results = server.call(run_all())
    assert isinstance(results, list)
    for result, case in zip(results, [c for c in picked for _ in range(3)], strict=True):
        np.testing.assert_allclose(
            result.sample, REFERENCES[f"{case['name']}/latents_out"], atol=1e-3
        )
    after = model.scheduler.statistics()
    pipeline = model.pipeline
    assert isinstance(pipeline, StableDiffusion)
    calls = 3 * sum(len(pipeline.spec.start(c["request"]["steps"]).timesteps) for c in picked)
    assert after.succeeded - before.succeeded == len(results)
    assert after.batches - before.batches < calls  # some UNet batches held several requests


def test_tokenizer_equals_clip_tokenizer() -> None:
    tokenizer = ClipTokenizer(EXPORT / "tokenizer")
    prompt = "a photo of an astronaut riding a horse on the moon"
    np.testing.assert_array_equal(tokenizer([prompt, ""]), REFERENCES["input_ids"])


def test_generate_answers_an_rgb_png(server: RunningServer) -> None:
    body = {"prompt": "a red house", "steps": 3, "seed": 5, "width": 48, "height": 32}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        answer = client.post("/v2/models/sd-pndm/generate", json=body)
        assert answer.status_code == 200, answer.text
        png = Image.open(io.BytesIO(base64.b64decode(answer.json()["png"])))
        assert png.mode == "RGB" and png.size == (48, 32)
        two = client.post("/v2/models/sd-ddim/generate", json={**body, "num_images": 2})
        assert two.status_code == 200, two.text
        assert len(two.json()["png"]) == 2
        metadata = client.get("/v2/models/sd-pndm").json()
        assert {i["name"] for i in metadata["inputs"]} >= {"prompt", "negative_prompt", "latents"}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"prompt": "a cat", "width": 50}, "multiples of 16"),
        ({"prompt": "a cat", "num_images": 9}, "num_images must be between 1 and 8"),
        ({"prompt": "a cat", "latents": [0.5] * 8}, "latents must be finite FP32 of shape"),
        ({"prompt": "a cat", "strength": 0.5}, "strength applies to image to image"),
        ({"prompt": "a cat", "mask": "x"}, "no input 'mask'"),
        ({"negative_prompt": "a cat"}, "needs the input 'prompt'"),
    ],
)
def test_mistakes_are_named(server: RunningServer, body: dict[str, Any], says: str) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        answer = client.post("/v2/models/sd-pndm/generate", json=body)
    assert answer.status_code == 400
    assert says in answer.text


def test_lcm_refuses_more_steps_than_its_original_schedule(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        answer = client.post("/v2/models/sd-lcm/generate", json={"prompt": "a cat", "steps": 51})
    assert answer.status_code == 400
    assert "at most original_inference_steps (50) steps, asked for 51" in answer.text


def test_repository_folder_serves_an_export_and_refuses_other_pipelines(tmp_path: Path) -> None:
    shutil.copytree(EXPORT, tmp_path / "repo" / "poster")
    names = [s.name for s in scan_repository(tmp_path / "repo")]
    assert names == ["poster.text_encoder", "poster.vae_decoder", "poster.vae_encoder", "poster"]
    index = tmp_path / "repo" / "poster" / "model_index.json"
    index.write_text(json.dumps({"_class_name": "FluxPipeline"}), encoding="utf-8")
    with pytest.raises(ModelLoadError, match=r"FluxPipeline.*not other pipelines"):
        scan_repository(tmp_path / "repo")


def test_generate_stream_sends_previews_then_the_image(server: RunningServer) -> None:
    body = {"prompt": "a red house", "steps": 5, "seed": 9, "width": 64, "height": 48}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        response = client.post("/v2/models/sd-ddim/generate_stream", json=body)
    assert response.status_code == 200, response.text
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.strip()]
    assert [e["parameters"]["step"] for e in events[:-1]] == [1, 2, 3, 4]
    assert all(len(e["image"]) == (48 // 8) * (64 // 8) * 3 for e in events[:-1])
    assert "png" in events[-1] and len(events[-1]["image"]) == 48 * 64 * 3


def test_warm_up_uses_the_shape_the_model_names() -> None:
    """The rewritten UNet names its latent size: warm-ups never send a 1x1 latent."""
    from sordino.backends.base import dummy_inputs
    from sordino.inference import ModelMetadata, TensorSpec

    metadata = ModelMetadata(
        name="unet",
        version="1",
        platform="onnxruntime_onnx",
        inputs=(TensorSpec("sample", "FP32", (-1, 4, -1, -1)), TensorSpec("t", "FP32", (-1,))),
        outputs=(TensorSpec("out", "FP32", (-1, 4, -1, -1)),),
        batched=True,
        extra={"sordino.warmup_shape.sample": "1,4,8,8"},
    )
    inputs = dummy_inputs(metadata, 3)
    assert inputs["sample"].shape == (3, 4, 8, 8) and inputs["t"].shape == (3,)


def test_a_unet_with_external_weights_is_rewritten_without_copying_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real UNet keeps its weights in model.onnx_data: the rewritten copy links to them."""
    import onnx
    import onnxruntime as ort

    from sordino.models.diffusers_export import per_row_timestep

    monkeypatch.setenv("SORDINO_CACHE_DIR", str(tmp_path / "cache"))
    unet = tmp_path / "export" / "unet"
    unet.mkdir(parents=True)
    shutil.copy(EXPORT / "unet" / "config.json", unet / "config.json")
    onnx.save_model(
        onnx.load(str(EXPORT / "unet" / "model.onnx")),
        str(unet / "model.onnx"),
        save_as_external_data=True,
        location="model.onnx_data",
        size_threshold=0,
    )
    rewritten = per_row_timestep(unet / "model.onnx", "big")
    weights = rewritten.parent / "model.onnx_data"
    assert weights.stat().st_ino == (unet / "model.onnx_data").stat().st_ino  # a hard link
    # The graph alone, as large as the export's own graph file: no weight was copied.
    assert rewritten.stat().st_size < (unet / "model.onnx").stat().st_size + 4096
    session = ort.InferenceSession(str(rewritten))
    rows = {
        "sample": np.zeros((3, 4, 8, 8), np.float32),
        "timestep": np.array([999.0, 500.0, 1.0], np.float32),
        "encoder_hidden_states": np.zeros((3, 77, 32), np.float32),
    }
    out = session.run(None, rows)[0]
    original = ort.InferenceSession(str(EXPORT / "unet" / "model.onnx"))
    for row in range(3):
        alone = original.run(
            None,
            {
                "sample": rows["sample"][row : row + 1],
                "timestep": np.array(rows["timestep"][row]),
                "encoder_hidden_states": rows["encoder_hidden_states"][row : row + 1],
            },
        )[0]
        np.testing.assert_allclose(out[row : row + 1], alone, atol=1e-5)
    assert per_row_timestep(unet / "model.onnx", "big") == rewritten  # cached


@pytest.mark.parametrize(
    ("iterative", "says"),
    [
        (IterativeConfig(scheduler="LMSDiscreteScheduler"), "LMSDiscreteScheduler is not"),
    ],
)
def test_what_an_export_cannot_do_yet_is_refused_at_load(
    iterative: IterativeConfig, says: str
) -> None:
    config = ModelConfig(name="sd", path=EXPORT, isolation="thread", iterative=iterative)
    with pytest.raises(ModelLoadError, match=says), serve_in_thread(sources=sources_for(config)):
        pass
