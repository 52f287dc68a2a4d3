"""An SD3 export served as made by optimum, equal to diffusers' StableDiffusion3Pipeline.

The fixture ``tests/fixtures/sd/tiny-sd3`` is a real ``optimum`` ONNX export of a tiny
random-weight SD3 pipeline (``tools/make_tiny_sd_export.py --sd3``: two CLIP encoders of
different widths and a wider T5, an ``SD3Transformer2DModel`` with 16 latent channels,
flow-matching Euler with shift 3); the references are diffusers' own
``StableDiffusion3Pipeline`` on the same weights with fixed initial latents
(``tools/make_sd_references.py --sd3``). One server serves the export twice (its own
scheduler, and with ``shift: 1.0``), in-process (``isolation: thread``) to stay light.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import io
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
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
from sordino.generation.stable_diffusion_3 import StableDiffusion3
from sordino.generation.t5_tokens import T5Tokenizer
from sordino.models.repository import scan_repository, sources_for
from sordino.testing import RunningServer, serve_in_thread
from tests.generation.sd_common import generate_one, pipeline_of, sd_request

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sd"
EXPORT = FIXTURES / "tiny-sd3"
REFERENCES = np.load(FIXTURES / "sd3_references.npz")
# Image to image's cases are test_sd_xl_sd3_image_to_image.py's.
CASES: list[dict[str, Any]] = [
    c for c in json.loads(str(REFERENCES["cases"])) if not c.get("image")
]
MODELS = {"sd3": {}, "sd3-shift1": {"shift": 1.0}}
SCALING, SHIFT = np.float32(1.5305), np.float32(0.0609)  # the export's VAE


_request, _one = sd_request, generate_one


def _pipeline(server: RunningServer, model: str) -> StableDiffusion3:
    return pipeline_of(server, model, StableDiffusion3)


def _model(case: dict[str, Any]) -> str:
    return next(model for model, options in MODELS.items() if options == case["options"])


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    sources = []
    for model, options in MODELS.items():
        iterative = IterativeConfig(scheduler_options=options)
        config = ModelConfig(name=model, path=EXPORT, isolation="thread", iterative=iterative)
        sources.extend(sources_for(config))
    with serve_in_thread(sources=sources) as running:
        yield running


@functools.cache
def _decoder() -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(str(EXPORT / "vae_decoder" / "model.onnx"))


def _assert_equal(result: Generated, name: str) -> None:
    assert result.sample is not None
    np.testing.assert_allclose(result.sample, REFERENCES[f"{name}/latents_out"], atol=1e-3)
    expected = REFERENCES[f"{name}/image"]
    # The pixels in [0, 1] before rounding: sordino's latents through the export's decoder.
    (decoded,) = _decoder().run(None, {"latent_sample": result.sample / SCALING + SHIFT})
    pixels = np.clip(decoded / 2 + 0.5, 0.0, 1.0).transpose(0, 2, 3, 1)
    assert np.abs(pixels - expected).max() <= 1e-3
    image = result.image if result.image.ndim == 4 else result.image[None]
    assert image.shape == expected.shape
    # The answer is those pixels * 255 rounded.
    assert np.abs(image / 255.0 - expected).max() <= 0.5 / 255 + 1e-3


def test_the_export_serves_as_five_models_with_sd3_defaults(server: RunningServer) -> None:
    names = {m.key.name for m in server.runtime.registry.models()}
    encoders = {f"sd3.text_encoder{suffix}" for suffix in ("", "_2", "_3")}
    assert {"sd3", "sd3.vae_decoder", *encoders} <= names
    assert "sd3.vae_encoder" in names  # image to image
    pipeline = _pipeline(server, "sd3")
    assert (pipeline.config.guidance, pipeline.config.steps.default) == (7.0, 28)
    assert pipeline.spec.kind == "FlowMatchEulerDiscreteScheduler"
    assert (pipeline.scaling_factor, pipeline.shift_factor) == pytest.approx((1.5305, 0.0609))
    assert pipeline.config.sample_shape == (16, 8, 8)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_images_equal_diffusers(server: RunningServer, case: dict[str, Any]) -> None:
    model = _model(case)
    body = {**case["request"], "latents": REFERENCES[f"{case['name']}/latents_in"]}
    result = server.call(_one(_pipeline(server, model), model, body))
    assert isinstance(result, Generated)
    _assert_equal(result, case["name"])


def test_concurrent_requests_share_transformer_batches_and_equal_diffusers(
    server: RunningServer,
) -> None:
    """Requests of different sizes and guidance at different steps, each equal to diffusers."""
    picked = [c for c in CASES if _model(c) == "sd3"]
    model = server.runtime.registry.get("sd3")
    pipeline = _pipeline(server, "sd3")
    before = model.scheduler.statistics()

    async def run_all() -> list[Generated]:
        async def one(case: dict[str, Any], delay: float) -> Generated:
            await asyncio.sleep(delay)
            body = {**case["request"], "latents": REFERENCES[f"{case['name']}/latents_in"]}
            body["seed"] = 3000 + int(delay * 1000)  # no reuse of an earlier result
            return await _one(pipeline, "sd3", body)

        return list(await asyncio.gather(*(one(c, d) for c in picked for d in (0.0, 0.01, 0.02))))

    results = server.call(run_all())
    assert isinstance(results, list)
    for result, case in zip(results, [c for c in picked for _ in range(3)], strict=True):
        _assert_equal(result, case["name"])
    after = model.scheduler.statistics()
    calls = 3 * sum(c["request"]["steps"] for c in picked)
    assert after.succeeded - before.succeeded == len(results)
    assert after.batches - before.batches < calls  # some transformer batches held several


def test_the_three_tokenizers_equal_transformers() -> None:
    prompts = ["a photo of an astronaut riding a horse on the moon", ""]
    prompts += ["A  Poster of THE sea, at night!", "a zebra, " * 80]
    first = ClipTokenizer(EXPORT / "tokenizer")(prompts)
    second = ClipTokenizer(EXPORT / "tokenizer_2")(prompts)
    third = T5Tokenizer(EXPORT / "tokenizer_3", 256)(prompts)
    np.testing.assert_array_equal(first, REFERENCES["input_ids"])
    np.testing.assert_array_equal(second, REFERENCES["input_ids_2"])  # "!" is its pad token
    np.testing.assert_array_equal(third, REFERENCES["input_ids_3"])
    assert third.shape == (4, 256) and third[3, -1] == 1  # truncated, still ending in </s>


def test_the_text_rows_are_clip_padded_to_t5_then_t5(server: RunningServer) -> None:
    pipeline = _pipeline(server, "sd3")
    body = {"prompt": "a cat", "guidance": 7.0, "num_images": 2}
    condition = server.call(pipeline.condition(pipeline.parse(_request("sd3", body))))
    # [negative x 2, prompt x 2]; 77 CLIP tokens then 256 T5 tokens, T5's width 96.
    assert condition.hidden.shape == (4, 77 + 256, 96) and condition.pooled.shape == (4, 24 + 40)
    assert not condition.hidden[:, :77, 32 + 48 :].any()  # CLIP rows zero-padded
    assert condition.hidden[:, 77:].any() and condition.hidden[:, :77, : 32 + 48].any()
    assert condition.hidden[0].any()  # "" is encoded, not zeros
    np.testing.assert_array_equal(condition.hidden[0], condition.hidden[1])
    assert not np.array_equal(condition.hidden[1], condition.hidden[2])


def test_generate_and_stream_answer_rgb_pngs(server: RunningServer) -> None:
    body = {"prompt": "a red house", "steps": 3, "seed": 5, "width": 48, "height": 32}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        answer = client.post("/v2/models/sd3/generate", json={**body, "num_images": 2})
        assert answer.status_code == 200, answer.text
        pngs = answer.json()["png"]
        assert len(pngs) == 2
        png = Image.open(io.BytesIO(base64.b64decode(pngs[0])))
        assert png.mode == "RGB" and png.size == (48, 32)
        stream = client.post("/v2/models/sd3-shift1/generate_stream", json=body)
        assert stream.status_code == 200, stream.text
        metadata = client.get("/v2/models/sd3").json()
        odd = client.post("/v2/models/sd3/generate", json={**body, "width": 40})
        image = client.post(
            "/v2/models/sd3/generate", json={**body, "image": pngs[0], "strength": 0.5}
        )
    events = [json.loads(line[6:]) for line in stream.text.splitlines() if line.strip()]
    assert [e["parameters"]["step"] for e in events[:-1]] == [1, 2]
    assert all(len(e["image"]) == (32 // 8) * (48 // 8) * 3 for e in events[:-1])
    assert "png" in events[-1] and len(events[-1]["image"]) == 32 * 48 * 3
    assert {i["name"] for i in metadata["inputs"]} >= {"prompt", "negative_prompt", "latents"}
    latents = next(i for i in metadata["inputs"] if i["name"] == "latents")
    assert latents["shape"][1] == 16
    assert odd.status_code == 400 and "multiples of 16" in odd.text
    # SD3's rounding: 3 - int(3 - 3 x 0.5) = 2 steps (SD's int(3 x 0.5) would be 1).
    assert image.status_code == 200, image.text
    assert image.json()["parameters"]["steps_used"] == 2


def test_an_export_without_t5_serves_with_zero_t5_rows(tmp_path: Path) -> None:
    """diffusers' StableDiffusion3Pipeline(text_encoder_3=None): T5's rows are zeros."""
    export = tmp_path / "no-t5"
    shutil.copytree(EXPORT, export)
    shutil.rmtree(export / "text_encoder_3")
    config = ModelConfig(name="lite", path=export, isolation="thread")
    sources = sources_for(config)
    assert [s.name for s in sources] == [
        "lite.text_encoder",
        "lite.text_encoder_2",
        "lite.vae_decoder",
        "lite.vae_encoder",
        "lite",
    ]
    with serve_in_thread(sources=sources) as running:
        pipeline = _pipeline(running, "lite")
        params = pipeline.parse(_request("lite", {"prompt": "a cat", "guidance": 1.0}))
        condition = running.call(pipeline.condition(params))
    assert condition.hidden.shape == (1, 77 + 256, 96)
    assert not condition.hidden[:, 77:].any() and condition.hidden[:, :77].any()


def test_a_repository_folder_serves_sd3_and_a_missing_part_is_named(tmp_path: Path) -> None:
    shutil.copytree(EXPORT, tmp_path / "repo" / "poster")
    names = [s.name for s in scan_repository(tmp_path / "repo")]
    assert names == [
        "poster.text_encoder",
        "poster.text_encoder_2",
        "poster.text_encoder_3",
        "poster.vae_decoder",
        "poster.vae_encoder",
        "poster",
    ]
    shutil.rmtree(tmp_path / "repo" / "poster" / "transformer")
    with pytest.raises(ModelLoadError, match=r"has no transformer/model\.onnx"):
        scan_repository(tmp_path / "repo")
    export = tmp_path / "repo" / "poster"
    shutil.copytree(EXPORT / "transformer", export / "transformer")
    (export / "tokenizer_3" / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match=r"has no tokenizer_3/tokenizer\.json"):
        scan_repository(tmp_path / "repo")


def test_a_tokenizer_json_tokenizers_cannot_read_is_a_clear_error_at_start(
    tmp_path: Path,
) -> None:
    """A tokenizer.json in a format newer than the installed ``tokenizers`` reads (as an
    export saved by a newer transformers is, for tokenizers 0.15) ended ``sordino start``
    in a traceback ("data did not match any variant of untagged enum ...")."""
    export = tmp_path / "poster"
    shutil.copytree(EXPORT, export)
    file = export / "tokenizer_3" / "tokenizer.json"
    saved = json.loads(file.read_text(encoding="utf-8"))
    saved["pre_tokenizer"] = {"type": "FromAFutureRelease"}
    file.write_text(json.dumps(saved), encoding="utf-8")
    with pytest.raises(ValueError, match=r"cannot be read by tokenizers .*pip install -U"):
        T5Tokenizer(export / "tokenizer_3", 256)
    result = subprocess.run(
        [sys.executable, "-m", "sordino", "start", "--no-builtin", "--model",
         f"poster={export}", "--http-port", "0", "--grpc-port", "0",
         "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "model 'poster': cannot read its tokenizer_3:" in result.stderr
    assert "pip install -U tokenizers" in result.stderr
