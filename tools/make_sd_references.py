"""Record diffusers' own results for sordino's equality tests (tests/fixtures/sd/).

Run in the side virtual environment of tools/make_tiny_sd_export.py (torch, diffusers)::

    python tools/make_tiny_sd_export.py /tmp/tiny-sd
    python tools/make_sd_references.py /tmp/tiny-sd tests/fixtures/sd

Writes two files:

- ``scheduler_steps.npz``: per scheduler case, diffusers' scheduler driven by recorded
  model outputs: its timesteps, ``init_noise_sigma``, each scaled input and each
  sample after ``step`` (tests/generation/test_diffusers_schedulers.py);
- ``pipeline_references.npz``: per scheduler, diffusers' ``StableDiffusionPipeline``
  (torch, the weights the export was made from) on fixed prompts, seeds and initial
  ``latents``: the final latents and the image in [0, 1]
  (tests/generation/test_stable_diffusion.py).

Euler ancestral draws noise at every step; diffusers draws it from torch's generator,
sordino from numpy's. Here diffusers' draw is replaced by sordino's (numpy
``default_rng([1, seed])``, in the same order), so the comparison checks the arithmetic.
"""

from __future__ import annotations

import json
import zlib
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from diffusers import (
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    PNDMScheduler,
)
from diffusers.schedulers import scheduling_euler_ancestral_discrete as ancestral_module

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
}
# (case name, class, config changes from SD 1.5's, steps)
CASES: list[tuple[str, str, dict[str, Any], int]] = [
    ("pndm", "PNDMScheduler", {"skip_prk_steps": True}, 6),
    ("pndm_v_trailing", "PNDMScheduler", {"skip_prk_steps": True, "prediction_type": "v_prediction", "timestep_spacing": "trailing"}, 5),
    ("pndm_linspace", "PNDMScheduler", {"skip_prk_steps": True, "timestep_spacing": "linspace"}, 4),
    ("ddim", "DDIMScheduler", {}, 6),
    ("ddim_v_trailing", "DDIMScheduler", {"prediction_type": "v_prediction", "timestep_spacing": "trailing"}, 5),
    ("ddim_linspace_clip", "DDIMScheduler", {"timestep_spacing": "linspace", "clip_sample": True, "set_alpha_to_one": True}, 4),
    ("euler", "EulerDiscreteScheduler", {}, 6),
    ("euler_v_linspace", "EulerDiscreteScheduler", {"prediction_type": "v_prediction", "timestep_spacing": "linspace"}, 5),
    ("euler_karras_trailing", "EulerDiscreteScheduler", {"use_karras_sigmas": True, "timestep_spacing": "trailing"}, 5),
    ("euler_ancestral", "EulerAncestralDiscreteScheduler", {}, 6),
    ("euler_ancestral_v_trailing", "EulerAncestralDiscreteScheduler", {"prediction_type": "v_prediction", "timestep_spacing": "trailing"}, 5),
    ("dpmpp_2m", "DPMSolverMultistepScheduler", {}, 6),
    ("dpmpp_2m_karras", "DPMSolverMultistepScheduler", {"use_karras_sigmas": True}, 6),
    ("dpmpp_2m_v_trailing", "DPMSolverMultistepScheduler", {"prediction_type": "v_prediction", "timestep_spacing": "trailing"}, 5),
    ("dpmpp_2m_linspace", "DPMSolverMultistepScheduler", {"timestep_spacing": "linspace"}, 4),
]
SEED = 7


class NumpyNoise:
    """Replaces diffusers' torch draw of Euler ancestral's noise with sordino's numpy one."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng([1, seed])

    def __call__(self, shape: Any, **_: Any) -> torch.Tensor:
        return torch.from_numpy(self.rng.standard_normal(tuple(shape)).astype(np.float32))


def scheduler_config(kind: str, changes: dict[str, Any]) -> dict[str, Any]:
    config = {"_class_name": kind, **SD15, **changes}
    if kind != "DDIMScheduler":
        config.pop("clip_sample", None)
    if kind not in ("DDIMScheduler", "PNDMScheduler"):
        config.pop("set_alpha_to_one", None)
    return config


def record_schedulers(out: Path) -> None:
    arrays: dict[str, np.ndarray] = {}
    cases = []
    for name, kind, changes, steps in CASES:
        config = scheduler_config(kind, changes)
        scheduler = CLASSES[kind].from_config(config)
        scheduler.set_timesteps(steps)
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        sample = torch.from_numpy(rng.standard_normal((1, 4, 4, 4)).astype(np.float32))
        sample = sample * scheduler.init_noise_sigma
        arrays[f"{name}/initial"] = sample.numpy()
        ancestral_module.randn_tensor = NumpyNoise(SEED)
        scaled, outputs, samples = [], [], []
        for t in scheduler.timesteps:
            model_in = scheduler.scale_model_input(sample, t)
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
        arrays[f"{name}/init_noise_sigma"] = np.array(float(scheduler.init_noise_sigma))
        cases.append({"name": name, "config": config, "steps": steps, "seed": SEED})
    arrays["cases"] = np.array(json.dumps(cases))
    np.savez_compressed(out / "scheduler_steps.npz", **arrays)
    print(f"wrote {out / 'scheduler_steps.npz'}: {len(cases)} cases")


def main() -> None:
    export = Path(sys.argv[1])
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    record_schedulers(out)
    if export.exists():
        from sd_pipeline_references import record_pipelines  # noqa: PLC0415

        record_pipelines(export, out)


if __name__ == "__main__":
    main()
