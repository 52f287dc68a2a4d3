"""Prompts, the sampler math and the images, without a server."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from sordino.errors import InvalidRequest
from sordino.generation.image import png_bytes, to_image
from sordino.generation.prompts import parse_digit_prompt
from sordino.generation.samplers import Schedule


@pytest.mark.parametrize(
    ("prompt", "digit"),
    [("a handwritten 7", 7), ("seven", 7), ("7", 7), ("draw a three", 3), ("ZERO!", 0),
     ("a 9, please", 9), ("Five five", 5)],
)  # fmt: skip
def test_prompts_name_a_digit(prompt: str, digit: int) -> None:
    assert parse_digit_prompt(prompt) == digit


@pytest.mark.parametrize("prompt", ["a cat", "12", "3 and 4", "", "seventy"])
def test_unreadable_prompts_say_what_is_understood(prompt: str) -> None:
    with pytest.raises(InvalidRequest, match="numeral 0-9 or a word") as caught:
        parse_digit_prompt(prompt)
    assert "'a handwritten 7'" in str(caught.value)


@pytest.mark.parametrize("sampler", ["ddim", "euler"])
def test_sampler_steps_are_row_wise(sampler: str) -> None:
    """Rows at different timesteps, stepped together, equal each row stepped alone."""
    schedule = Schedule()
    rng = np.random.default_rng(1)
    sample = rng.standard_normal((3, 64)).astype(np.float32)
    noise = rng.standard_normal((3, 64)).astype(np.float32)
    t, t_next = np.array([999.0, 500.0, 3.0]), np.array([900.0, 400.0, -1.0])
    together = schedule.step(sampler, sample, noise, t, t_next)  # type: ignore[arg-type]
    for row in range(3):
        alone = schedule.step(
            sampler,  # type: ignore[arg-type]
            sample[row : row + 1],
            noise[row : row + 1],
            t[row : row + 1],
            t_next[row : row + 1],
        )
        assert np.array_equal(together[row : row + 1], alone)
    assert np.all(np.abs(together[2]) <= 1.0)  # the last step returns the clipped x0


def test_plans_and_a_perfect_denoiser_recovers_the_sample() -> None:
    schedule = Schedule()
    assert schedule.plan(1).tolist() == [999.0]
    assert schedule.plan(4).tolist() == [999.0, 666.0, 333.0, 0.0]
    assert schedule.plan(3, start=500.0).tolist() == [500.0, 250.0, 0.0]
    with pytest.raises(ValueError):
        schedule.plan(0)
    x0 = np.linspace(-0.9, 0.9, 64, dtype=np.float32)[None]
    eps = np.random.default_rng(0).standard_normal((1, 64)).astype(np.float32)
    for sampler in ("ddim", "euler"):
        plan = schedule.plan(5)
        x = schedule.renoise(x0, eps, plan[:1])
        for i, t in enumerate(plan):
            t_next = plan[i + 1] if i + 1 < len(plan) else -1.0
            # A perfect denoiser: the noise that takes x back to x0.
            ab = schedule.alpha_bar(t)
            true_eps = ((x - np.sqrt(ab) * x0) / np.sqrt(1 - ab)).astype(np.float32)
            x = schedule.step(sampler, x, true_eps, np.array([t]), np.array([t_next]))  # type: ignore[arg-type]
        assert np.max(np.abs(x - x0)) < 1e-4


def test_image_and_png() -> None:
    sample = np.full(64, -1.0, dtype=np.float32)
    sample[0] = 1.0
    image = to_image(sample)
    assert image.shape == (32, 32) and image.dtype == np.uint8
    assert image[:4, :4].min() == 255 and image[4:, 4:].max() == 0
    data = png_bytes(image)
    assert data == png_bytes(image)  # deterministic
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))), image)


@pytest.mark.parametrize("sampler", ["ddim", "euler"])
@pytest.mark.parametrize(("t", "t_next"), [(999.0, 500.0), (40.0, 0.0), (3.0, -1.0)])
def test_one_request_step_equals_the_batched_step(sampler: str, t: float, t_next: float) -> None:
    schedule = Schedule()
    rng = np.random.default_rng(2)
    sample = rng.standard_normal((2, 64)).astype(np.float32)
    noise = rng.standard_normal((2, 64)).astype(np.float32)
    batched = schedule.step(sampler, sample, noise, np.full(2, t), np.full(2, t_next))  # type: ignore[arg-type]
    one = schedule.step_one(sampler, sample, noise, t, t_next)  # type: ignore[arg-type]
    assert np.max(np.abs(batched - one)) <= 1e-6


def test_the_result_cache_is_bounded_lru_per_tenant() -> None:
    from sordino.generation.reuse import Generated, ResultCache

    def result(seed: int) -> Generated:
        return Generated(np.zeros((32, 32), np.uint8), b"png%d" % seed, 4, 4, seed)

    cache = ResultCache(entries=2)
    cache.put("a", 1, result(1))
    cache.put("a", 2, result(2))
    assert cache.get("a", 1) is not None  # 1 is now the most recently used
    cache.put("a", 3, result(3))  # evicts 2
    assert cache.get("a", 2) is None and cache.get("a", 3) is not None
    assert cache.get("b", 1) is None  # another tenant sees nothing of a's
    cache.put("b", 1, result(1))
    assert cache.size("a") == 2 and cache.size("b") == 1
    assert (cache.hits, cache.misses) == (2, 2)
    off = ResultCache(entries=0)
    off.put("a", 1, result(1))
    assert off.get("a", 1) is None


def test_a_denoiser_without_the_tensors_its_iterative_section_names_is_refused() -> None:
    """``check_denoiser``: an input or the output the section names and the model lacks
    fails the load, naming the setting and what the model has."""
    from sordino.config.iterative import IterativeConfig
    from sordino.errors import ModelLoadError
    from sordino.generation.pipeline import check_denoiser
    from sordino.inference import ModelKey, ModelMetadata, TensorSpec

    def spec(name: str) -> TensorSpec:
        return TensorSpec(name, "FP32", (-1, 64))

    metadata = ModelMetadata(
        name="d",
        version="1",
        platform="onnxruntime_onnx",
        inputs=(spec("sample"), spec("timestep"), spec("condition")),
        outputs=(spec("noise"),),
        batched=True,
    )
    key = ModelKey("d", "1")
    check_denoiser(key, IterativeConfig(), metadata)  # the defaults' names: all there
    with pytest.raises(ModelLoadError, match=r"denoiser input 'latent'.*sample, timestep"):
        check_denoiser(key, IterativeConfig(sample_input="latent"), metadata)
    with pytest.raises(ModelLoadError, match=r"noise_output 'eps' is not an output.*noise"):
        check_denoiser(key, IterativeConfig(noise_output="eps"), metadata)
