"""Record diffusers' own results for sordino's equality tests (tests/fixtures/sd/).

Run in the side virtual environment of tools/make_tiny_sd_export.py (torch, diffusers)::

    python tools/make_tiny_sd_export.py /tmp/tiny-sd
    python tools/make_sd_references.py /tmp/tiny-sd tests/fixtures/sd
    python tools/make_tiny_sd_export.py --xl /tmp/tiny-sdxl
    python tools/make_sd_references.py --xl /tmp/tiny-sdxl tests/fixtures/sd
    python tools/make_tiny_sd_export.py --sd3 /tmp/tiny-sd3
    python tools/make_sd_references.py --sd3 /tmp/tiny-sd3 tests/fixtures/sd

Writes two files (with ``--xl``, ``sdxl_references.npz`` alone; with ``--sd3``,
``sd3_references.npz`` alone):

- ``scheduler_steps.npz``: per scheduler case, diffusers' scheduler driven by recorded
  model outputs: its timesteps, ``init_noise_sigma``, each scaled input and each
  sample after ``step`` (tests/generation/test_diffusers_schedulers.py);
  Image-to-image cases (a ``strength``) start as ``StableDiffusionImg2ImgPipeline``
  does: from ``t_start`` (``set_begin_index``), the sample the scheduler's ``add_noise``
  (flow matching: ``scale_noise``) makes of a clean latent and noise;
- ``pipeline_references.npz``: per scheduler, diffusers' ``StableDiffusionPipeline``
  (torch, the weights the export was made from) on fixed prompts, seeds and initial
  ``latents``: the final latents and the image in [0, 1]; and per image-to-image case
  ``StableDiffusionImg2ImgPipeline`` on a fixed image (``img2img/png``), ``strength``
  and noise (tests/generation/test_stable_diffusion.py, test_sd_image_to_image.py);
- ``sdxl_references.npz``: the same from diffusers' ``StableDiffusionXLPipeline``
  (two text encoders, micro-conditioning, the pooled embedding; a negative prompt left
  out is zeros, ``force_zeros_for_empty_prompt``), and both tokenizers' ``input_ids``
  (tests/generation/test_stable_diffusion_xl.py); and image-to-image cases from
  ``StableDiffusionXLImg2ImgPipeline`` (the base model's settings, no aesthetic score);
- ``sd3_references.npz``: the same from diffusers' ``StableDiffusion3Pipeline`` (three
  text encoders, flow-matching Euler with shift), and the three tokenizers' ``input_ids``
  (T5's at SD3's ``max_sequence_length``, 256) (tests/generation/test_stable_diffusion_3.py);
  and image-to-image cases from ``StableDiffusion3Img2ImgPipeline`` at the image's size
  (tests/generation/test_sd_xl_sd3_image_to_image.py).

A rerun may not write the same files byte for byte: torch's CPU kernels vary in the last
bits from run to run (measured on the 2-core machine: latents and images within 3e-6 for
``--sd3``, 5e-5 for ``--xl``; the recorded inputs, tokens and initial latents equal
exactly). Compare arrays, well inside the tests' 1e-3, not files.

Euler ancestral and LCM draw noise at every step; diffusers draws it from torch's
generator, sordino from numpy's. Here diffusers' draw is replaced by sordino's (numpy
``default_rng([1, seed])``, in the same order), so the comparison checks the arithmetic.
Image to image draws two more: the VAE encoder's latent sample (``latent_dist.sample``)
is sordino's ``default_rng([2, seed])``, and the noise added at the start timestep is
the case's ``latents_in`` (sordino's ``latents`` input).
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from diffusers import (
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    LCMScheduler,
    PNDMScheduler,
)
from diffusers.models.autoencoders import vae as vae_module
from diffusers.pipelines.stable_diffusion import pipeline_stable_diffusion_img2img as img2img
from diffusers.schedulers import scheduling_euler_ancestral_discrete as ancestral_module
from diffusers.schedulers import scheduling_lcm as lcm_module

SD15 = {
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "num_train_timesteps": 1000,
    "steps_offset": 1,
    "set_alpha_to_one": False,
    "clip_sample": False,
}
CLASSES = {
    "PNDMScheduler": PNDMScheduler,
    "DDIMScheduler": DDIMScheduler,
    "EulerDiscreteScheduler": EulerDiscreteScheduler,
    "EulerAncestralDiscreteScheduler": EulerAncestralDiscreteScheduler,
    "DPMSolverMultistepScheduler": DPMSolverMultistepScheduler,
    "LCMScheduler": LCMScheduler,
    "FlowMatchEulerDiscreteScheduler": FlowMatchEulerDiscreteScheduler,
}
# (case name, class, config changes from SD 1.5's, steps[, image-to-image strength])
CASES: list[tuple[str, str, dict[str, Any], int] | tuple[str, str, dict[str, Any], int, float]] = [
    ("pndm", "PNDMScheduler", {"skip_prk_steps": True}, 6),
    (
        "pndm_v_trailing",
        "PNDMScheduler",
        {"skip_prk_steps": True, "prediction_type": "v_prediction", "timestep_spacing": "trailing"},
        5,
    ),
    ("pndm_linspace", "PNDMScheduler", {"skip_prk_steps": True, "timestep_spacing": "linspace"}, 4),
    ("ddim", "DDIMScheduler", {}, 6),
    (
        "ddim_v_trailing",
        "DDIMScheduler",
        {"prediction_type": "v_prediction", "timestep_spacing": "trailing"},
        5,
    ),
    (
        "ddim_linspace_clip",
        "DDIMScheduler",
        {"timestep_spacing": "linspace", "clip_sample": True, "set_alpha_to_one": True},
        4,
    ),
    ("euler", "EulerDiscreteScheduler", {}, 6),
    (
        "euler_v_linspace",
        "EulerDiscreteScheduler",
        {"prediction_type": "v_prediction", "timestep_spacing": "linspace"},
        5,
    ),
    (
        "euler_karras_trailing",
        "EulerDiscreteScheduler",
        {"use_karras_sigmas": True, "timestep_spacing": "trailing"},
        5,
    ),
    ("euler_ancestral", "EulerAncestralDiscreteScheduler", {}, 6),
    (
        "euler_ancestral_v_trailing",
        "EulerAncestralDiscreteScheduler",
        {"prediction_type": "v_prediction", "timestep_spacing": "trailing"},
        5,
    ),
    ("dpmpp_2m", "DPMSolverMultistepScheduler", {}, 6),
    ("dpmpp_2m_karras", "DPMSolverMultistepScheduler", {"use_karras_sigmas": True}, 6),
    (
        "dpmpp_2m_v_trailing",
        "DPMSolverMultistepScheduler",
        {"prediction_type": "v_prediction", "timestep_spacing": "trailing"},
        5,
    ),
    ("dpmpp_2m_linspace", "DPMSolverMultistepScheduler", {"timestep_spacing": "linspace"}, 4),
    ("ddim_sample", "DDIMScheduler", {"prediction_type": "sample"}, 5),
    ("euler_sample", "EulerDiscreteScheduler", {"prediction_type": "sample"}, 5),
    ("dpmpp_2m_sample", "DPMSolverMultistepScheduler", {"prediction_type": "sample"}, 5),
    ("lcm", "LCMScheduler", {}, 4),
    (
        "lcm_v_original_30",
        "LCMScheduler",
        {"prediction_type": "v_prediction", "original_inference_steps": 30},
        6,
    ),
    (
        "lcm_sample_scaling_5",
        "LCMScheduler",
        {"prediction_type": "sample", "timestep_scaling": 5.0},
        3,
    ),
    ("flow_euler_shift_3", "FlowMatchEulerDiscreteScheduler", {"shift": 3.0}, 6),
    ("flow_euler", "FlowMatchEulerDiscreteScheduler", {}, 4),
    # Image to image: from t_start, after add_noise.
    ("pndm_from_image", "PNDMScheduler", {"skip_prk_steps": True}, 6, 0.6),
    ("ddim_from_image", "DDIMScheduler", {}, 5, 0.5),
    ("euler_from_image", "EulerDiscreteScheduler", {}, 6, 0.7),
    ("euler_ancestral_from_image", "EulerAncestralDiscreteScheduler", {}, 5, 0.8),
    (
        "dpmpp_2m_karras_from_image",
        "DPMSolverMultistepScheduler",
        {"use_karras_sigmas": True},
        6,
        0.5,
    ),
    ("lcm_from_image", "LCMScheduler", {}, 4, 0.75),
    ("flow_euler_from_image", "FlowMatchEulerDiscreteScheduler", {"shift": 3.0}, 5, 0.6),
]
SEED = 7


class NumpyNoise:
    """Replaces diffusers' torch draw of Euler ancestral's noise with sordino's numpy one."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng([1, seed])

    def __call__(self, shape: Any, **_: Any) -> torch.Tensor:
        return torch.from_numpy(self.rng.standard_normal(tuple(shape)).astype(np.float32))


class GivenNoise:
    """Replaces the image-to-image pipeline's draw of the start noise with given values."""

    def __init__(self, noise: np.ndarray) -> None:
        self.noise = noise

    def __call__(self, shape: Any, **_: Any) -> torch.Tensor:
        assert tuple(shape) == self.noise.shape, (shape, self.noise.shape)
        return torch.from_numpy(self.noise)


def scheduler_config(kind: str, changes: dict[str, Any]) -> dict[str, Any]:
    if kind == "FlowMatchEulerDiscreteScheduler":
        return {"_class_name": kind, "num_train_timesteps": 1000, **changes}
    config = {"_class_name": kind, **SD15, **changes}
    if kind != "DDIMScheduler":
        config.pop("clip_sample", None)
    if kind not in ("DDIMScheduler", "PNDMScheduler", "LCMScheduler"):
        config.pop("set_alpha_to_one", None)
    return config


def record_schedulers(out: Path) -> None:
    arrays: dict[str, np.ndarray] = {}
    cases = []
    for name, kind, changes, steps, *image in CASES:
        config = scheduler_config(kind, changes)
        scheduler = CLASSES[kind].from_config(config)
        scheduler.set_timesteps(steps)
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        sample = torch.from_numpy(rng.standard_normal((1, 4, 4, 4)).astype(np.float32))
        timesteps = scheduler.timesteps
        begin = 0
        if image:
            # StableDiffusionImg2ImgPipeline.get_timesteps and prepare_latents.
            kept = min(int(steps * image[0]), steps)
            begin = max(steps - kept, 0) * scheduler.order
            timesteps = scheduler.timesteps[begin:]
            if hasattr(scheduler, "set_begin_index"):
                scheduler.set_begin_index(begin)
            clean = torch.from_numpy(rng.standard_normal((1, 4, 4, 4)).astype(np.float32))
            arrays[f"{name}/clean"] = clean.numpy()
            arrays[f"{name}/noise"] = sample.numpy()
            if kind == "FlowMatchEulerDiscreteScheduler":
                sample = scheduler.scale_noise(clean, timesteps[:1], sample)
            else:
                sample = scheduler.add_noise(clean, sample, timesteps[:1])
        else:
            sample = sample * getattr(scheduler, "init_noise_sigma", 1.0)
        arrays[f"{name}/initial"] = sample.numpy()
        ancestral_module.randn_tensor = NumpyNoise(SEED)
        lcm_module.randn_tensor = NumpyNoise(SEED)
        scale = getattr(scheduler, "scale_model_input", lambda sample, t: sample)
        scaled, outputs, samples = [], [], []
        for t in timesteps:
            model_in = scale(sample, t)
            output = 0.3 * model_in + torch.from_numpy(
                rng.standard_normal((1, 4, 4, 4)).astype(np.float32)
            )
            sample = scheduler.step(output, t, sample).prev_sample
            scaled.append(model_in.numpy())
            outputs.append(output.numpy())
            samples.append(sample.numpy())
        arrays[f"{name}/timesteps"] = scheduler.timesteps.numpy().astype(np.float64)
        arrays[f"{name}/scaled"] = np.stack(scaled)
        arrays[f"{name}/outputs"] = np.stack(outputs)
        arrays[f"{name}/samples"] = np.stack(samples)
        arrays[f"{name}/init_noise_sigma"] = np.array(
            float(getattr(scheduler, "init_noise_sigma", 1.0))
        )
        case = {"name": name, "config": config, "steps": steps, "seed": SEED}
        if image:
            case.update(strength=image[0], begin=begin)
        cases.append(case)
    arrays["cases"] = np.array(json.dumps(cases))
    np.savez_compressed(out / "scheduler_steps.npz", **arrays)
    print(f"wrote {out / 'scheduler_steps.npz'}: {len(cases)} cases")


# (case, scheduler class, options, request): the requests sordino's test sends too.
PIPELINE_CASES: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("pndm", "PNDMScheduler", {}, {"steps": 5, "guidance": 7.5}),
    ("ddim", "DDIMScheduler", {}, {"steps": 5, "guidance": 7.5}),
    ("euler", "EulerDiscreteScheduler", {}, {"steps": 5, "guidance": 7.5}),
    ("euler_ancestral", "EulerAncestralDiscreteScheduler", {}, {"steps": 5, "guidance": 7.5}),
    (
        "dpmpp_2m_karras",
        "DPMSolverMultistepScheduler",
        {"use_karras_sigmas": True},
        {"steps": 5, "guidance": 7.5},
    ),
    (
        "pndm_two_images",
        "PNDMScheduler",
        {},
        {
            "steps": 4,
            "guidance": 5.0,
            "num_images": 2,
            "width": 48,
            "height": 64,
            "negative_prompt": "blue sky",
        },
    ),
    ("ddim_unguided", "DDIMScheduler", {}, {"steps": 3, "guidance": 1.0}),
    ("lcm", "LCMScheduler", {}, {"steps": 4, "guidance": 7.5}),
]
# The same for StableDiffusionImg2ImgPipeline on IMAGE (its size is the request's).
IMAGE_CASES: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("img2img_pndm", "PNDMScheduler", {}, {"steps": 5, "guidance": 7.5, "strength": 0.6}),
    (
        "img2img_ddim_two",
        "DDIMScheduler",
        {},
        {
            "steps": 4,
            "guidance": 5.0,
            "strength": 0.8,
            "num_images": 2,
            "negative_prompt": "blue sky",
        },
    ),
    (
        "img2img_euler_ancestral",
        "EulerAncestralDiscreteScheduler",
        {},
        {"steps": 5, "guidance": 7.5, "strength": 0.5},
    ),
    (
        "img2img_dpmpp_2m_karras",
        "DPMSolverMultistepScheduler",
        {"use_karras_sigmas": True},
        {"steps": 5, "guidance": 7.5, "strength": 0.7},
    ),
    ("img2img_lcm", "LCMScheduler", {}, {"steps": 4, "guidance": 1.0, "strength": 1.0}),
]
IMAGE_SIZE = (48, 64)  # width, height


def test_image() -> np.ndarray:
    """A fixed RGB image: smooth gradients and a little noise, [H, W, 3] uint8."""
    width, height = IMAGE_SIZE
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rgb = np.stack([x / width, y / height, 0.5 + 0.5 * np.sin((x + y) / 7.0)], axis=-1)
    rgb += np.random.default_rng(3).normal(0.0, 0.05, rgb.shape)
    return np.round(np.clip(rgb, 0.0, 1.0) * 255).astype(np.uint8)


PROMPT = "a photo of an astronaut riding a horse on the moon"


def record_pipelines(export: Path, out: Path) -> None:
    """diffusers' StableDiffusionPipeline (the torch weights of ``export``) per case."""
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(
        str(export.parent / (export.name + ".torch")), safety_checker=None
    )
    pipe.set_progress_bar_config(disable=True)
    arrays: dict[str, np.ndarray] = {}
    cases = []
    base_config = dict(pipe.scheduler.config)
    for name, kind, options, request in PIPELINE_CASES:
        pipe.scheduler = CLASSES[kind].from_config(base_config, **options)
        request = {
            "prompt": PROMPT,
            "seed": 11,
            "width": 64,
            "height": 64,
            "num_images": 1,
            "negative_prompt": "",
            **request,
        }
        shape = (request["num_images"], 4, request["height"] // 8, request["width"] // 8)
        latents = np.random.default_rng(zlib.crc32(name.encode())).standard_normal(shape)
        latents = latents.astype(np.float32)
        results = {}
        for output_type in ("latent", "np"):
            ancestral_module.randn_tensor = NumpyNoise(request["seed"])
            lcm_module.randn_tensor = NumpyNoise(request["seed"])
            results[output_type] = pipe(
                request["prompt"],
                negative_prompt=request["negative_prompt"] or None,
                width=request["width"],
                height=request["height"],
                num_inference_steps=request["steps"],
                guidance_scale=request["guidance"],
                num_images_per_prompt=request["num_images"],
                latents=torch.from_numpy(latents),
                output_type=output_type,
            ).images
        arrays[f"{name}/latents_in"] = latents
        arrays[f"{name}/latents_out"] = np.asarray(results["latent"], dtype=np.float32)
        arrays[f"{name}/image"] = np.asarray(results["np"], dtype=np.float32)
        cases.append({"name": name, "scheduler": kind, "options": options, "request": request})
    record_image_to_image(pipe, base_config, arrays, cases)
    arrays["input_ids"] = pipe.tokenizer(
        [PROMPT, ""], padding="max_length", max_length=77, truncation=True, return_tensors="np"
    ).input_ids
    arrays["cases"] = np.array(json.dumps(cases))
    np.savez_compressed(out / "pipeline_references.npz", **arrays)
    print(f"wrote {out / 'pipeline_references.npz'}: {len(cases)} cases")


# (case, scheduler class, options, request) for the SDXL export; SDXL's default guidance.
XL_CASES: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("euler", "EulerDiscreteScheduler", {}, {"steps": 5, "guidance": 5.0}),
    (
        "euler_two_images",
        "EulerDiscreteScheduler",
        {},
        {
            "steps": 4,
            "guidance": 6.0,
            "num_images": 2,
            "width": 48,
            "height": 64,
            "negative_prompt": "blue sky",
        },
    ),
    ("euler_unguided", "EulerDiscreteScheduler", {}, {"steps": 3, "guidance": 1.0}),
    (
        "dpmpp_2m_karras",
        "DPMSolverMultistepScheduler",
        {"use_karras_sigmas": True},
        {"steps": 5, "guidance": 5.0, "width": 64, "height": 48},
    ),
    (
        # The second encoder's own texts and non-default micro-conditioning.
        "euler_prompt_2_and_sizes",
        "EulerDiscreteScheduler",
        {},
        {
            "steps": 3,
            "guidance": 5.0,
            "width": 48,
            "height": 64,
            "negative_prompt": "blue sky",
            "prompt_2": "a green field at dawn",
            "negative_prompt_2": "fog",
            "original_size": [96, 80],
            "crops_coords_top_left": [8, 16],
            "target_size": [64, 48],
        },
    ),
]
# Passed to diffusers only where a case sets them (sizes as the tuples diffusers takes).
XL_EXTRAS = ("prompt_2", "negative_prompt_2", "original_size", "crops_coords_top_left",
             "target_size")  # fmt: skip


# Image to image for the SDXL export (StableDiffusionXLImg2ImgPipeline on IMAGE).
XL_IMAGE_CASES: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("img2img_euler", "EulerDiscreteScheduler", {}, {"steps": 5, "guidance": 5.0, "strength": 0.6}),
    (
        "img2img_euler_ancestral_two",
        "EulerAncestralDiscreteScheduler",
        {},
        {
            "steps": 4,
            "guidance": 6.0,
            "strength": 0.8,
            "num_images": 2,
            "negative_prompt": "blue sky",
        },
    ),
    (
        "img2img_dpmpp_2m_karras",
        "DPMSolverMultistepScheduler",
        {"use_karras_sigmas": True},
        {"steps": 5, "guidance": 5.0, "strength": 0.7},
    ),
]


def record_xl(export: Path, out: Path) -> None:
    """diffusers' StableDiffusionXLPipeline (the torch weights of ``export``) per case."""
    from diffusers import StableDiffusionXLImg2ImgPipeline, StableDiffusionXLPipeline
    from diffusers.pipelines.stable_diffusion_xl import (
        pipeline_stable_diffusion_xl_img2img as xl_img2img,
    )

    pipe = StableDiffusionXLPipeline.from_pretrained(
        str(export.parent / (export.name + ".torch")), add_watermarker=False
    )
    pipe.set_progress_bar_config(disable=True)
    arrays: dict[str, np.ndarray] = {}
    cases = []
    base_config = dict(pipe.scheduler.config)
    for name, kind, options, request in XL_CASES:
        pipe.scheduler = CLASSES[kind].from_config(base_config, **options)
        request = {
            "prompt": PROMPT,
            "seed": 11,
            "width": 64,
            "height": 64,
            "num_images": 1,
            "negative_prompt": "",
            **request,
        }
        shape = (request["num_images"], 4, request["height"] // 8, request["width"] // 8)
        latents = np.random.default_rng(zlib.crc32(("xl/" + name).encode())).standard_normal(shape)
        latents = latents.astype(np.float32)
        results = {}
        extras = {
            key: tuple(value) if isinstance(value, list) else value
            for key, value in request.items()
            if key in XL_EXTRAS
        }
        for output_type in ("latent", "np"):
            results[output_type] = pipe(
                request["prompt"],
                # No negative prompt: SDXL's zeros (force_zeros_for_empty_prompt).
                negative_prompt=request["negative_prompt"] or None,
                **extras,
                width=request["width"],
                height=request["height"],
                num_inference_steps=request["steps"],
                guidance_scale=request["guidance"],
                num_images_per_prompt=request["num_images"],
                latents=torch.from_numpy(latents),
                output_type=output_type,
            ).images
        arrays[f"{name}/latents_in"] = latents
        arrays[f"{name}/latents_out"] = np.asarray(results["latent"], dtype=np.float32)
        arrays[f"{name}/image"] = np.asarray(results["np"], dtype=np.float32)
        cases.append({"name": name, "scheduler": kind, "options": options, "request": request})
    record_image_to_image(
        pipe,
        base_config,
        arrays,
        cases,
        # SDXL base's settings (no aesthetic score: the time_ids are text to image's).
        image2image=StableDiffusionXLImg2ImgPipeline(
            **pipe.components,
            requires_aesthetics_score=False,
            force_zeros_for_empty_prompt=pipe.config.force_zeros_for_empty_prompt,
            add_watermarker=False,
        ),
        module=xl_img2img,
        image_cases=XL_IMAGE_CASES,
        prefix="xl/",
    )
    for key, tokenizer in (("input_ids", pipe.tokenizer), ("input_ids_2", pipe.tokenizer_2)):
        arrays[key] = tokenizer(
            [PROMPT, ""], padding="max_length", max_length=77, truncation=True, return_tensors="np"
        ).input_ids
    arrays["cases"] = np.array(json.dumps(cases))
    np.savez_compressed(out / "sdxl_references.npz", **arrays)
    print(f"wrote {out / 'sdxl_references.npz'}: {len(cases)} cases")


def record_image_to_image(
    pipe: Any,
    base_config: dict[str, Any],
    arrays: dict[str, np.ndarray],
    cases: list[Any],
    *,
    image2image: Any = None,
    module: Any = img2img,
    image_cases: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = IMAGE_CASES,
    channels: int = 4,
    prefix: str = "",
    extra: dict[str, Any] | None = None,
) -> None:
    """An image-to-image pipeline (the same weights; SD's StableDiffusionImg2ImgPipeline
    unless given, ``module`` the one whose start-noise draw is replaced) on
    ``test_image()`` per case; the noise of a case is seeded by ``prefix + name``."""
    import io

    from diffusers import StableDiffusionImg2ImgPipeline
    from PIL import Image

    if image2image is None:
        image2image = StableDiffusionImg2ImgPipeline(**pipe.components)
    image2image.set_progress_bar_config(disable=True)
    pixels = test_image()
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    arrays["img2img/pixels"] = pixels
    arrays["img2img/png"] = np.frombuffer(buffer.getvalue(), dtype=np.uint8)
    width, height = IMAGE_SIZE
    for name, kind, options, request in image_cases:
        image2image.scheduler = CLASSES[kind].from_config(base_config, **options)
        request = {"prompt": PROMPT, "seed": 11, "num_images": 1, "negative_prompt": "", **request}
        shape = (request["num_images"], channels, height // 8, width // 8)
        seed = zlib.crc32((prefix + name).encode())
        noise = np.random.default_rng(seed).standard_normal(shape)
        noise = noise.astype(np.float32)
        results = {}
        for output_type in ("latent", "np"):
            ancestral_module.randn_tensor = NumpyNoise(request["seed"])
            lcm_module.randn_tensor = NumpyNoise(request["seed"])
            encoder_noise = np.random.default_rng([2, request["seed"]])
            vae_module.randn_tensor = lambda shape, rng=encoder_noise, **_: torch.from_numpy(
                rng.standard_normal(tuple(shape)).astype(np.float32)
            )
            module.randn_tensor = GivenNoise(noise)
            results[output_type] = image2image(
                request["prompt"],
                image=Image.open(io.BytesIO(buffer.getvalue())),
                strength=request["strength"],
                negative_prompt=request["negative_prompt"] or None,
                num_inference_steps=request["steps"],
                guidance_scale=request["guidance"],
                num_images_per_prompt=request["num_images"],
                output_type=output_type,
                **(extra or {}),
            ).images
        arrays[f"{name}/latents_in"] = noise
        arrays[f"{name}/latents_out"] = np.asarray(results["latent"], dtype=np.float32)
        arrays[f"{name}/image"] = np.asarray(results["np"], dtype=np.float32)
        cases.append(
            {"name": name, "scheduler": kind, "options": options, "request": request, "image": True}
        )


# (case, options of the export's FlowMatchEulerDiscreteScheduler, request); SD3's guidance 7.
SD3_CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("flow", {}, {"steps": 5, "guidance": 7.0}),
    (
        "flow_two_images",
        {},
        {
            "steps": 4,
            "guidance": 5.0,
            "num_images": 2,
            "width": 48,
            "height": 64,
            "negative_prompt": "blue sky",
        },
    ),
    ("flow_unguided", {}, {"steps": 3, "guidance": 1.0}),
    ("flow_shift_1", {"shift": 1.0}, {"steps": 4, "guidance": 7.0, "width": 64, "height": 32}),
]
# Image to image for the SD3 export (StableDiffusion3Img2ImgPipeline on IMAGE); the second
# keeps steps - int(steps - steps x strength) = 3 calls where SD's rule keeps 2.
SD3_IMAGE_CASES: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    (
        "img2img_flow",
        "FlowMatchEulerDiscreteScheduler",
        {},
        {"steps": 5, "guidance": 7.0, "strength": 0.6},
    ),
    (
        "img2img_flow_two",
        "FlowMatchEulerDiscreteScheduler",
        {},
        {
            "steps": 4,
            "guidance": 5.0,
            "strength": 0.7,
            "num_images": 2,
            "negative_prompt": "blue sky",
        },
    ),
]
T5_LENGTH = 256  # StableDiffusion3Pipeline's max_sequence_length default
# The tokenizers' cases: the prompt, none, case and spacing and the "!" the second CLIP
# pads with, and one longer than every tokenizer's length (truncated).
SD3_PROMPTS = [PROMPT, "", "A  Poster of THE sea, at night!", "a zebra, " * 80]


def record_sd3(export: Path, out: Path) -> None:
    """diffusers' StableDiffusion3Pipeline (the torch weights of ``export``) per case."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        StableDiffusion3Img2ImgPipeline,
        StableDiffusion3Pipeline,
    )
    from diffusers.pipelines.stable_diffusion_3 import (
        pipeline_stable_diffusion_3_img2img as sd3_img2img,
    )

    pipe = StableDiffusion3Pipeline.from_pretrained(str(export.parent / (export.name + ".torch")))
    pipe.set_progress_bar_config(disable=True)
    arrays: dict[str, np.ndarray] = {}
    cases = []
    base_config = dict(pipe.scheduler.config)
    for name, options, request in SD3_CASES:
        pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(base_config, **options)
        request = {
            "prompt": PROMPT,
            "seed": 11,
            "width": 64,
            "height": 64,
            "num_images": 1,
            "negative_prompt": "",
            **request,
        }
        shape = (request["num_images"], 16, request["height"] // 8, request["width"] // 8)
        latents = np.random.default_rng(zlib.crc32(("sd3/" + name).encode())).standard_normal(shape)
        latents = latents.astype(np.float32)
        results = {}
        for output_type in ("latent", "np"):
            results[output_type] = pipe(
                request["prompt"],
                negative_prompt=request["negative_prompt"] or None,
                width=request["width"],
                height=request["height"],
                num_inference_steps=request["steps"],
                guidance_scale=request["guidance"],
                num_images_per_prompt=request["num_images"],
                latents=torch.from_numpy(latents),
                output_type=output_type,
                max_sequence_length=T5_LENGTH,
            ).images
        arrays[f"{name}/latents_in"] = latents
        arrays[f"{name}/latents_out"] = np.asarray(results["latent"], dtype=np.float32)
        arrays[f"{name}/image"] = np.asarray(results["np"], dtype=np.float32)
        cases.append(
            {
                "name": name,
                "scheduler": "FlowMatchEulerDiscreteScheduler",
                "options": options,
                "request": request,
            }
        )
    record_image_to_image(
        pipe,
        base_config,
        arrays,
        cases,
        image2image=StableDiffusion3Img2ImgPipeline(**pipe.components),
        module=sd3_img2img,
        image_cases=SD3_IMAGE_CASES,
        channels=16,
        prefix="sd3/",
        # Its size is the image's (left out, diffusers' SD3 img2img resizes the image to
        # the transformer's default size; sordino answers at the image's size).
        extra={
            "max_sequence_length": T5_LENGTH,
            "width": IMAGE_SIZE[0],
            "height": IMAGE_SIZE[1],
        },
    )
    for key, tokenizer, length in (
        ("input_ids", pipe.tokenizer, 77),
        ("input_ids_2", pipe.tokenizer_2, 77),
        ("input_ids_3", pipe.tokenizer_3, T5_LENGTH),
    ):
        arrays[key] = tokenizer(
            SD3_PROMPTS,
            padding="max_length",
            max_length=length,
            truncation=True,
            add_special_tokens=True,
            return_tensors="np",
        ).input_ids
    arrays["cases"] = np.array(json.dumps(cases))
    np.savez_compressed(out / "sd3_references.npz", **arrays)
    print(f"wrote {out / 'sd3_references.npz'}: {len(cases)} cases")


def main() -> None:
    args = sys.argv[1:]
    xl, sd3 = "--xl" in args, "--sd3" in args
    args = [a for a in args if a not in ("--xl", "--sd3")]
    export = Path(args[0])
    out = Path(args[1])
    out.mkdir(parents=True, exist_ok=True)
    if sd3:
        record_sd3(export, out)
        return
    if xl:
        record_xl(export, out)
        return
    record_schedulers(out)
    record_pipelines(export, out)


if __name__ == "__main__":
    main()
