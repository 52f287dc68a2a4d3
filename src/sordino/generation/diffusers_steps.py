"""One denoiser call's step of each diffusers scheduler, in numpy float32.

Each function takes the generation's :class:`~sordino.generation.diffusers_sampler.Sampler`
(its spec, timesteps, sigmas, generator and multistep history), the (guided) model
output at call ``index`` and the sample, and returns the next sample as the diffusers
class's ``step`` does (version 0.35, line for line): PNDM's PLMS, DDIM (eta 0), Euler
and Euler ancestral, DPM-Solver++ 2M, LCM's consistency step, flow matching's Euler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from sordino.generation.diffusers_sampler import Sampler

__all__ = ["F32", "alpha", "alpha_sigma", "step", "x0_from_sigma"]

F32 = npt.NDArray[np.floating[Any]]  # float32 throughout; numpy types the arithmetic loosely


def step(sampler: Sampler, out: F32, index: int, x: F32) -> F32:
    """The sample after call ``index`` of ``sampler`` given the denoiser's output."""
    kind = sampler.spec.kind
    if kind == "PNDMScheduler":
        return _pndm(sampler, out, index, x)
    if kind == "DDIMScheduler":
        return _ddim(sampler, out, index, x)
    if kind == "DPMSolverMultistepScheduler":
        return _dpm(sampler, out, index, x)
    if kind == "LCMScheduler":
        return _lcm(sampler, out, index, x)
    assert sampler.sigmas is not None
    if kind == "FlowMatchEulerDiscreteScheduler":
        dt = sampler.sigmas[index + 1] - sampler.sigmas[index]
        return np.asarray(x + dt * out, dtype=np.float32)
    return _euler(sampler, out, index, x, ancestral=kind == "EulerAncestralDiscreteScheduler")


def alpha(sampler: Sampler, t: float) -> np.float32:
    """``alphas_cumprod`` at timestep ``t``; before the first, the scheduler's final alpha."""
    ac = sampler.spec.alphas_cumprod
    if t >= 0:
        return np.float32(ac[int(t)])
    # diffusers' defaults differ: DDIM sets alpha to one, PNDM does not.
    default = sampler.spec.kind in ("DDIMScheduler", "LCMScheduler")
    to_one = sampler.spec.settings.get("set_alpha_to_one", default)
    return np.float32(1.0) if to_one else ac[0]


def alpha_sigma(sigma: np.float32) -> tuple[np.float32, np.float32]:
    """DPM-Solver's ``alpha_t`` and ``sigma_t`` of a (Karras-style) sigma."""
    alpha_t = np.float32(1 / ((sigma**2 + 1) ** 0.5))
    return alpha_t, np.float32(sigma * alpha_t)


def x0_from_sigma(prediction: str, out: F32, x: F32, sigma: np.float32) -> F32:
    """Euler's clean estimate at ``sigma`` for the ``prediction`` type."""
    if prediction == "epsilon":
        return np.asarray(x - sigma * out, dtype=np.float32)
    if prediction == "v_prediction":
        return np.asarray(
            out * (-sigma / (sigma**2 + 1) ** 0.5) + x / (sigma**2 + 1), dtype=np.float32
        )
    return out


def _pndm(sampler: Sampler, out: F32, index: int, x: F32) -> F32:
    t = int(sampler.timesteps[index])
    ratio = sampler.spec.train_timesteps // sampler.steps
    prev_t = t - ratio
    if sampler.counter != 1:
        sampler.history = [*sampler.history[-3:], out]
    else:
        prev_t, t = t, t + ratio
    if sampler.pairs is not None and index in sampler.pairs:  # a cut re-spaced the run
        t, prev_t = (int(v) for v in sampler.pairs[index])
    ets = sampler.history
    if len(ets) == 1 and sampler.counter == 0:
        sampler.held_sample = x
    elif len(ets) == 1 and sampler.counter == 1:
        assert sampler.held_sample is not None
        out = (out + ets[-1]) / 2
        x, sampler.held_sample = sampler.held_sample, None
    elif len(ets) == 2:
        out = (3 * ets[-1] - ets[-2]) / 2
    elif len(ets) == 3:
        out = (23 * ets[-1] - 16 * ets[-2] + 5 * ets[-3]) / 12
    else:
        out = (1 / 24) * (55 * ets[-1] - 59 * ets[-2] + 37 * ets[-3] - 9 * ets[-4])
    sampler.counter += 1
    a, a_prev = alpha(sampler, t), alpha(sampler, prev_t)
    beta, beta_prev = 1 - a, 1 - a_prev
    if sampler.spec.prediction == "v_prediction":
        out = (a**0.5) * out + (beta**0.5) * x
    sample_coeff = (a_prev / a) ** 0.5
    denom = a * beta_prev**0.5 + (a * beta * a_prev) ** 0.5
    return np.asarray(sample_coeff * x - (a_prev - a) * out / denom, dtype=np.float32)


def _ddim(sampler: Sampler, out: F32, index: int, x: F32) -> F32:
    spec = sampler.spec
    t = int(sampler.timesteps[index])
    prev_t = t - spec.train_timesteps // sampler.steps
    if sampler.prev_timesteps is not None:  # a cut re-spaced the run
        prev_t = int(sampler.prev_timesteps[index])
    a, a_prev = alpha(sampler, t), alpha(sampler, prev_t)
    beta = 1 - a
    x0: F32
    if spec.prediction == "epsilon":
        x0 = (x - beta**0.5 * out) / a**0.5
        eps = out
    elif spec.prediction == "sample":
        x0 = out
        eps = (x - a**0.5 * x0) / beta**0.5
    else:
        x0 = a**0.5 * x - beta**0.5 * out
        eps = a**0.5 * out + beta**0.5 * x
    if spec.settings.get("clip_sample", True):
        limit = float(spec.settings.get("clip_sample_range", 1.0))
        x0 = np.clip(x0, -limit, limit)
    return np.asarray(a_prev**0.5 * x0 + (1 - a_prev) ** 0.5 * eps, dtype=np.float32)


def _lcm(sampler: Sampler, out: F32, index: int, x: F32) -> F32:
    spec = sampler.spec
    t = int(sampler.timesteps[index])
    last = index == len(sampler.timesteps) - 1
    a = alpha(sampler, t)
    a_prev = a if last else alpha(sampler, sampler.timesteps[index + 1])
    beta = 1 - a
    x0: F32
    if spec.prediction == "epsilon":
        x0 = (x - beta**0.5 * out) / a**0.5
    elif spec.prediction == "sample":
        x0 = out
    else:
        x0 = a**0.5 * x - beta**0.5 * out
    if spec.settings.get("clip_sample", False):
        limit = float(spec.settings.get("clip_sample_range", 1.0))
        x0 = np.clip(x0, -limit, limit)
    # The boundary-condition scalings (sigma_data 0.5), in float32 as diffusers'.
    scaled = np.float32(t * float(spec.settings.get("timestep_scaling", 10.0)))
    c_skip = np.float32(0.25) / (scaled**2 + np.float32(0.25))
    c_out = scaled / (scaled**2 + np.float32(0.25)) ** np.float32(0.5)
    denoised = np.asarray(c_out * x0 + c_skip * x, dtype=np.float32)
    if last:
        return denoised
    noise = sampler.rng.standard_normal(x.shape).astype(np.float32)
    return np.asarray(a_prev**0.5 * denoised + (1 - a_prev) ** 0.5 * noise, dtype=np.float32)


def _euler(sampler: Sampler, out: F32, index: int, x: F32, *, ancestral: bool) -> F32:
    assert sampler.sigmas is not None
    sigma, sigma_next = sampler.sigmas[index], sampler.sigmas[index + 1]
    x0 = x0_from_sigma(sampler.spec.prediction, out, x, sigma)
    derivative = (x - x0) / sigma
    if not ancestral:
        return np.asarray(x + derivative * (sigma_next - sigma), dtype=np.float32)
    up = (sigma_next**2 * (sigma**2 - sigma_next**2) / sigma**2) ** 0.5
    down = (sigma_next**2 - up**2) ** 0.5
    moved = x + derivative * (down - sigma)
    noise = sampler.rng.standard_normal(x.shape).astype(np.float32)
    return np.asarray(moved + noise * up, dtype=np.float32)


def _dpm(sampler: Sampler, out: F32, index: int, x: F32) -> F32:
    assert sampler.sigmas is not None
    sigmas, prediction = sampler.sigmas, sampler.spec.prediction
    sigma = sigmas[index]
    alpha_t, sigma_t = alpha_sigma(sigma)
    x0: F32
    if prediction == "epsilon":
        x0 = (x - sigma_t * out) / alpha_t
    elif prediction == "v_prediction":
        x0 = alpha_t * x - sigma_t * out
    else:
        x0 = out
    x0 = np.asarray(x0, dtype=np.float32)
    lower_final = index == len(sampler.timesteps) - 1  # final_sigmas_type "zero"
    sampler.history = [*sampler.history[-1:], x0]
    # Order 2 from the second call on; the last call is first order (diffusers'
    # lower_order_final with final_sigmas_type "zero").
    first_order = sampler.counter < 1 or lower_final
    sampler.counter = min(sampler.counter + 1, 2)
    s_next = sigmas[index + 1]
    a_next, sg_next = alpha_sigma(s_next)
    lam_s0 = np.log(alpha_t) - np.log(sigma_t)
    if s_next == 0:
        return np.asarray(a_next * x0, dtype=np.float32)  # exp(-h) = 0, sigma ratio 0
    lam_t = np.log(a_next) - np.log(sg_next)
    h = lam_t - lam_s0
    if first_order:
        return np.asarray(
            (sg_next / sigma_t) * x - a_next * (np.exp(-h) - 1.0) * x0, dtype=np.float32
        )
    a_prev, sg_prev = alpha_sigma(sigmas[index - 1])
    lam_s1 = np.log(a_prev) - np.log(sg_prev)
    r0 = (lam_s0 - lam_s1) / h
    history = sampler.history
    d0, d1 = history[-1], (1.0 / r0) * (history[-1] - history[-2])
    moved = (
        (sg_next / sigma_t) * x
        - a_next * (np.exp(-h) - 1.0) * d0
        - 0.5 * a_next * (np.exp(-h) - 1.0) * d1
    )
    return np.asarray(moved, dtype=np.float32)
