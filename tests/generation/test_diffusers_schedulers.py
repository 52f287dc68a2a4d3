"""sordino's diffusers schedulers equal diffusers' own, step for step.

The references were recorded from diffusers 0.35 (tools/make_sd_references.py): each
case drives diffusers' scheduler with recorded model outputs; sordino's sampler, fed the
same outputs, must give the same scaled inputs and samples. An image-to-image case
(``strength``) starts part way, from a clean latent noised by the scheduler's
``add_noise``, as diffusers' ``StableDiffusionImg2ImgPipeline`` runs it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sordino.generation.diffusers_schedulers import scheduler_from_config

FIXTURE = Path(__file__).parent.parent / "fixtures" / "sd" / "scheduler_steps.npz"
RECORDED = np.load(FIXTURE)
CASES: list[dict[str, Any]] = json.loads(str(RECORDED["cases"]))


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_sampler_equals_diffusers(case: dict[str, Any]) -> None:
    name = case["name"]
    spec = scheduler_from_config(case["config"])
    sampler = spec.start(case["steps"], np.random.default_rng([1, case["seed"]]))
    np.testing.assert_allclose(sampler.timesteps, RECORDED[f"{name}/timesteps"], atol=1e-4)
    assert sampler.init_noise_sigma == pytest.approx(
        float(RECORDED[f"{name}/init_noise_sigma"]), rel=1e-5
    )
    sample = RECORDED[f"{name}/initial"]
    begin = 0
    if "strength" in case:
        begin = sampler.image_start(case["strength"])
        assert begin == case["begin"]
        noised = sampler.add_noise(RECORDED[f"{name}/clean"], RECORDED[f"{name}/noise"], begin)
        np.testing.assert_allclose(noised, sample, rtol=1e-5, atol=1e-5)
    for offset, output in enumerate(RECORDED[f"{name}/outputs"]):
        index = begin + offset
        scaled = sampler.scale_input(sample, index)
        np.testing.assert_allclose(scaled, RECORDED[f"{name}/scaled"][offset], rtol=1e-5, atol=1e-4)
        sample = sampler.step(output, index, sample)
        np.testing.assert_allclose(
            sample,
            RECORDED[f"{name}/samples"][offset],
            rtol=1e-5,
            atol=1e-4,
            err_msg=f"{name} step {index}",
        )
    assert begin + len(RECORDED[f"{name}/outputs"]) == len(sampler.timesteps)


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"_class_name": "LMSDiscreteScheduler"}, "LMSDiscreteScheduler is not supported"),
        ({"_class_name": "PNDMScheduler", "skip_prk_steps": False}, "skip_prk_steps: false"),
        ({"_class_name": "DDIMScheduler", "timestep_spacing": "karras"}, "timestep_spacing"),
        (
            {"_class_name": "DPMSolverMultistepScheduler", "solver_order": 3},
            "solver_order 3 is not supported",
        ),
        ({"_class_name": "EulerDiscreteScheduler", "beta_schedule": "sigmoid"}, "sigmoid"),
        (
            {"_class_name": "PNDMScheduler", "prediction_type": "sample"},
            "PNDMScheduler with prediction_type 'sample' is not supported \\(diffusers refuses",
        ),
        (
            {"_class_name": "EulerAncestralDiscreteScheduler", "prediction_type": "sample"},
            "EulerAncestralDiscreteScheduler with prediction_type 'sample'",
        ),
        ({"_class_name": "DDIMScheduler", "prediction_type": "x0"}, "use epsilon, v_prediction"),
        (
            {"_class_name": "FlowMatchEulerDiscreteScheduler", "use_dynamic_shifting": True},
            "use_dynamic_shifting: true is not supported",
        ),
        (
            {"_class_name": "LCMScheduler", "original_inference_steps": 2000},
            "original_inference_steps 2000",
        ),
        ({"_class_name": "KarrasVeScheduler"}, "LCMScheduler, FlowMatchEulerDiscreteScheduler"),
    ],
)
def test_unsupported_settings_are_named(config: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        scheduler_from_config(config)


def test_lcm_refuses_more_steps_than_its_original_schedule() -> None:
    spec = scheduler_from_config({"_class_name": "LCMScheduler", "original_inference_steps": 8})
    assert len(spec.start(8).timesteps) == 8
    with pytest.raises(ValueError, match=r"at most original_inference_steps \(8\) steps"):
        spec.start(9)


def test_a_strength_that_runs_no_step_is_named() -> None:
    sampler = scheduler_from_config({"_class_name": "DDIMScheduler"}).start(4)
    assert sampler.image_start(1.0) == 0 and sampler.image_start(0.25) == 3
    with pytest.raises(ValueError, match=r"strength 0\.2 with 4 steps runs no step"):
        sampler.image_start(0.2)
