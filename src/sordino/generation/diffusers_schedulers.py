"""Diffusers' schedulers in numpy, step for step: the sampler of a served diffusers export.

:func:`scheduler_from_config` reads an export's ``scheduler/scheduler_config.json`` and
gives a :class:`SchedulerSpec`; :meth:`SchedulerSpec.start` gives one generation its
:class:`Sampler`: the timesteps the denoiser is called at, the scale of the initial
noise, and the per-call ``scale_input`` / ``step``. Each follows the diffusers class of
the same name (version 0.35) line for line in float32, so a generation equals
diffusers' own to float rounding (tests/generation/test_diffusers_schedulers.py checks
step outputs recorded from diffusers):

- ``PNDMScheduler`` with ``skip_prk_steps`` (SD 1.x's default: PLMS, one extra call);
- ``DDIMScheduler`` (eta = 0, optional ``clip_sample``);
- ``EulerDiscreteScheduler`` (optionally Karras sigmas);
- ``EulerAncestralDiscreteScheduler`` (its noise drawn from the request's seeded
  generator, numpy's — diffusers draws from torch's, so equal images need equal noise);
- ``DPMSolverMultistepScheduler`` as DPM-Solver++ 2M (optionally Karras sigmas);
- ``LCMScheduler`` (the latent consistency model's: ``original_inference_steps``
  timesteps, the boundary-condition scalings, fresh noise from the same generator as
  Euler ancestral's between steps);
- ``FlowMatchEulerDiscreteScheduler`` (SD3's: flow matching with ``shift``; the model
  output is the velocity, no dynamic shifting).

Beta schedules ``linear``, ``scaled_linear``, ``squaredcos_cap_v2``; prediction types
``epsilon``, ``v_prediction`` and ``sample`` where diffusers has it (not PNDM's nor Euler
ancestral's: diffusers refuses those too); timestep spacings ``leading``, ``trailing``,
``linspace``; ``steps_offset``. Any other setting is refused with :class:`ValueError`
naming it (the loader turns it into a clear load error).

The parts, one job each: this module reads the configuration; diffusers_timesteps.py
computes the timesteps and sigmas, diffusers_steps.py each scheduler's step, and
diffusers_sampler.py holds one generation's state (and image to image's start and
noising).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from sordino.generation.diffusers_sampler import Sampler, image_steps

__all__ = ["SCHEDULERS", "Sampler", "SchedulerSpec", "image_steps", "scheduler_from_config"]
SCHEDULERS = (
    "PNDMScheduler",
    "DDIMScheduler",
    "EulerDiscreteScheduler",
    "EulerAncestralDiscreteScheduler",
    "DPMSolverMultistepScheduler",
    "LCMScheduler",
    "FlowMatchEulerDiscreteScheduler",
)
# diffusers raises for these prediction types in these schedulers' step.
_NO_SAMPLE_PREDICTION = ("PNDMScheduler", "EulerAncestralDiscreteScheduler")


@dataclass(frozen=True)
class SchedulerSpec:
    """One export's scheduler: its class name and the settings the sampler uses."""

    kind: str
    train_timesteps: int
    alphas_cumprod: npt.NDArray[np.float32]
    prediction: str
    spacing: str
    steps_offset: int
    settings: Mapping[str, Any] = field(default_factory=dict)

    def start(self, steps: int, rng: np.random.Generator | None = None) -> Sampler:
        """A fresh sampler for one generation of ``steps`` inference steps."""
        if steps < 1:
            raise ValueError(f"a generation needs at least 1 step, got {steps}")
        return Sampler(self, steps, rng or np.random.default_rng(0))


def scheduler_from_config(config: Mapping[str, Any]) -> SchedulerSpec:
    """The scheduler ``config`` (a ``scheduler_config.json``) describes.

    Raises ValueError naming the setting when it is one sordino does not run.
    """
    kind = str(config.get("_class_name", ""))
    if kind not in SCHEDULERS:
        raise ValueError(
            f"scheduler {kind or '(no _class_name)'} is not supported; sordino runs "
            f"{', '.join(SCHEDULERS)}"
        )
    train = int(config.get("num_train_timesteps", 1000))
    schedule = str(config.get("beta_schedule", "linear"))
    start, end = float(config.get("beta_start", 0.0001)), float(config.get("beta_end", 0.02))
    if config.get("trained_betas") is not None:
        betas = np.asarray(config["trained_betas"], dtype=np.float32)
    elif schedule == "linear":
        betas = np.linspace(start, end, train, dtype=np.float32)
    elif schedule == "scaled_linear":
        betas = (np.linspace(start**0.5, end**0.5, train, dtype=np.float32) ** 2).astype(np.float32)
    elif schedule == "squaredcos_cap_v2":
        betas = _cosine_betas(train)
    else:
        raise ValueError(f"beta_schedule {schedule!r} is not supported")
    prediction = str(config.get("prediction_type", "epsilon"))
    if kind == "FlowMatchEulerDiscreteScheduler":
        prediction = "flow"  # the model output is the velocity; the config has no type
    elif prediction not in ("epsilon", "v_prediction", "sample"):
        raise ValueError(
            f"{kind} with prediction_type {prediction!r} is not supported; use epsilon, "
            "v_prediction or sample"
        )
    elif prediction == "sample" and kind in _NO_SAMPLE_PREDICTION:
        raise ValueError(
            f"{kind} with prediction_type 'sample' is not supported (diffusers refuses it "
            "too); use epsilon or v_prediction, or DDIMScheduler, EulerDiscreteScheduler, "
            "DPMSolverMultistepScheduler or LCMScheduler for sample prediction"
        )
    leading_default = kind in ("PNDMScheduler", "DDIMScheduler", "LCMScheduler")
    spacing = str(config.get("timestep_spacing", "leading" if leading_default else "linspace"))
    if spacing not in ("leading", "trailing", "linspace"):
        raise ValueError(f"timestep_spacing {spacing!r} is not supported")
    _refuse_unsupported(kind, config)
    alphas_cumprod = np.cumprod(1.0 - betas, dtype=np.float32)
    return SchedulerSpec(
        kind,
        train,
        alphas_cumprod.astype(np.float32),
        prediction,
        spacing,
        int(config.get("steps_offset", 0)),
        dict(config),
    )


def _refuse_unsupported(kind: str, config: Mapping[str, Any]) -> None:
    unsupported = {
        "PNDMScheduler": {"skip_prk_steps": False},
        "DDIMScheduler": {"thresholding": True, "rescale_betas_zero_snr": True},
        "EulerDiscreteScheduler": {
            "use_exponential_sigmas": True,
            "use_beta_sigmas": True,
            "rescale_betas_zero_snr": True,
        },
        "EulerAncestralDiscreteScheduler": {"rescale_betas_zero_snr": True},
        "DPMSolverMultistepScheduler": {
            "thresholding": True,
            "use_lu_lambdas": True,
            "use_exponential_sigmas": True,
            "use_beta_sigmas": True,
            "use_flow_sigmas": True,
        },
        "LCMScheduler": {"thresholding": True, "rescale_betas_zero_snr": True},
        "FlowMatchEulerDiscreteScheduler": {
            "use_dynamic_shifting": True,
            "invert_sigmas": True,
            "use_karras_sigmas": True,
            "use_exponential_sigmas": True,
            "use_beta_sigmas": True,
            "stochastic_sampling": True,
        },
    }[kind]
    for key, bad in unsupported.items():
        if config.get(key, not bad) == bad:
            raise ValueError(f"{kind} with {key}: {str(bad).lower()} is not supported")
    if kind == "EulerDiscreteScheduler":
        if config.get("interpolation_type", "linear") != "linear":
            raise ValueError(
                "EulerDiscreteScheduler interpolation_type other than linear is not supported"
            )
        if config.get("timestep_type", "discrete") != "discrete":
            raise ValueError("EulerDiscreteScheduler timestep_type continuous is not supported")
        if config.get("final_sigmas_type", "zero") != "zero":
            raise ValueError("EulerDiscreteScheduler final_sigmas_type sigma_min is not supported")
    if kind == "FlowMatchEulerDiscreteScheduler" and config.get("shift_terminal"):
        raise ValueError("FlowMatchEulerDiscreteScheduler with shift_terminal is not supported")
    if kind == "LCMScheduler":
        original = int(config.get("original_inference_steps", 50))
        if not 1 <= original <= int(config.get("num_train_timesteps", 1000)):
            raise ValueError(
                f"LCMScheduler original_inference_steps {original} must be between 1 and "
                "num_train_timesteps"
            )
    if kind == "DPMSolverMultistepScheduler":
        wanted = {"algorithm_type": "dpmsolver++", "solver_order": 2, "solver_type": "midpoint"}
        for key, value in wanted.items():
            if config.get(key, value) != value:
                raise ValueError(
                    f"DPMSolverMultistepScheduler with {key} {config.get(key)!r} is not "
                    f"supported (sordino runs DPM-Solver++ 2M: {key} {value!r})"
                )
        if config.get("final_sigmas_type", "zero") != "zero" or config.get("euler_at_final"):
            raise ValueError(
                "DPMSolverMultistepScheduler: only final_sigmas_type zero is supported"
            )
        if config.get("lambda_min_clipped", -math.inf) != -math.inf:
            raise ValueError("DPMSolverMultistepScheduler: lambda_min_clipped is not supported")


def _cosine_betas(train: int) -> npt.NDArray[np.float32]:
    def alpha_bar(t: float) -> float:
        return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2

    betas = [
        min(1 - alpha_bar((i + 1) / train) / alpha_bar(i / train), 0.999) for i in range(train)
    ]
    return np.asarray(betas, dtype=np.float32)
