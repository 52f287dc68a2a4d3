"""sordino's diffusers schedulers equal diffusers' own, step for step.

The references were recorded from diffusers 0.35 (tools/make_sd_references.py): each
case drives diffusers' scheduler with recorded model outputs; sordino's sampler, fed the
same outputs, must give the same scaled inputs and samples.
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
    for index, output in enumerate(RECORDED[f"{name}/outputs"]):
        scaled = sampler.scale_input(sample, index)
        np.testing.assert_allclose(scaled, RECORDED[f"{name}/scaled"][index], rtol=1e-5, atol=1e-4)
        sample = sampler.step(output, index, sample)
        np.testing.assert_allclose(
            sample,
            RECORDED[f"{name}/samples"][index],
            rtol=1e-5,
            atol=1e-4,
            err_msg=f"{name} step {index}",
        )


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
    ],
)
def test_unsupported_settings_are_named(config: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        scheduler_from_config(config)
