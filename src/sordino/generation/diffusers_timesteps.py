"""Where a diffusers scheduler calls the denoiser: its timesteps and sigmas, in numpy.

:func:`timesteps_for` gives one generation's timesteps (largest first, one a denoiser
call) and, for the schedulers that step in sigma (Euler, Euler ancestral, DPM-Solver,
flow matching), its sigmas with a trailing zero, each as the diffusers class of the
same name (version 0.35) computes them in ``set_timesteps``: the ``leading``,
``trailing`` and ``linspace`` spacings with ``steps_offset``, PNDM's PLMS order, LCM's
``original_inference_steps`` grid, Karras sigmas, flow matching's ``shift``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from sordino.generation.diffusers_schedulers import SchedulerSpec

__all__ = ["Timesteps", "timesteps_for"]

Timesteps = tuple[npt.NDArray[np.float64], npt.NDArray[np.float32] | None]
"""A generation's timesteps, and its sigmas (one more than the timesteps) or None."""


def timesteps_for(spec: SchedulerSpec, steps: int) -> Timesteps:
    """The timesteps (and sigmas) of a generation of ``steps`` inference steps.

    Raises ValueError when the scheduler cannot run that many (LCM's bound).
    """
    kind = spec.kind
    if kind == "PNDMScheduler":
        return _pndm(spec, steps), None
    if kind == "DDIMScheduler":
        return _spaced(spec, steps, float_steps=False), None
    if kind == "DPMSolverMultistepScheduler":
        return _dpm(spec, steps)
    if kind == "LCMScheduler":
        return _lcm(spec, steps), None
    if kind == "FlowMatchEulerDiscreteScheduler":
        return _flow(spec, steps)
    return _euler(spec, steps)


def _spaced(spec: SchedulerSpec, n: int, *, float_steps: bool) -> npt.NDArray[np.float64]:
    """DDIM's (and Euler's) spacing of ``n`` timesteps, largest first."""
    train, spacing = spec.train_timesteps, spec.spacing
    if spacing == "linspace":
        steps = np.linspace(0, train - 1, n, dtype=np.float32 if float_steps else np.float64)
        return np.asarray(steps[::-1] if float_steps else steps[::-1].round(), dtype=np.float64)
    if spacing == "leading":
        ratio = train // n
        steps = (np.arange(0, n) * ratio).round()[::-1] + spec.steps_offset
        return np.asarray(steps, dtype=np.float64)
    ratio_f = train / n
    return np.asarray(np.round(np.arange(train, 0, -ratio_f)) - 1, dtype=np.float64)


def _pndm(spec: SchedulerSpec, n: int) -> npt.NDArray[np.float64]:
    train, spacing = spec.train_timesteps, spec.spacing
    if spacing == "linspace":
        base = np.linspace(0, train - 1, n).round().astype(np.int64)
    elif spacing == "leading":
        base = (np.arange(0, n) * (train // n)).round() + spec.steps_offset
    else:
        base = np.round(np.arange(train, 0, -train / n))[::-1].astype(np.int64) - 1
    plms = np.concatenate([base[:-1], base[-2:-1], base[-1:]])[::-1]
    return np.asarray(plms, dtype=np.float64)


def _log_sigmas(spec: SchedulerSpec) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    ac = spec.alphas_cumprod
    sigmas = np.array(((1 - ac) / ac) ** 0.5)
    return sigmas, np.log(sigmas)


def _with_zero(sigmas: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    return np.concatenate([sigmas, [0.0]]).astype(np.float32)


def _euler(spec: SchedulerSpec, n: int) -> Timesteps:
    sigmas, log_sigmas = _log_sigmas(spec)
    timesteps = _spaced(spec, n, float_steps=True).astype(np.float32)
    sig = np.interp(timesteps, np.arange(0, len(sigmas)), sigmas)
    if spec.kind == "EulerDiscreteScheduler" and spec.settings.get("use_karras_sigmas"):
        sig = _karras(spec, sig, n)
        timesteps = np.array([_sigma_to_t(np.asarray(s), log_sigmas) for s in sig])
    return np.asarray(timesteps.astype(np.float32), dtype=np.float64), _with_zero(sig)


def _dpm(spec: SchedulerSpec, n: int) -> Timesteps:
    train, spacing = spec.train_timesteps, spec.spacing
    if spacing == "linspace":
        steps = np.linspace(0, train - 1, n + 1).round()[::-1][:-1].astype(np.int64)
    elif spacing == "leading":
        ratio = train // (n + 1)
        steps = (np.arange(0, n + 1) * ratio).round()[::-1][:-1].astype(np.int64)
        steps = steps + spec.steps_offset
    else:
        steps = np.arange(train, 0, -train / n).round().astype(np.int64) - 1
    sigmas, log_sigmas = _log_sigmas(spec)
    if spec.settings.get("use_karras_sigmas"):
        sig = _karras(spec, np.flip(sigmas).copy(), n)
        steps_f = np.array([_sigma_to_t(np.asarray(s), log_sigmas) for s in sig])
        if spec.settings.get("beta_schedule") != "squaredcos_cap_v2":
            steps_f = steps_f.round()
        steps = steps_f.astype(np.int64)
    else:
        sig = np.interp(steps, np.arange(0, len(sigmas)), sigmas)
    return np.asarray(steps, dtype=np.float64), _with_zero(sig)


def _lcm(spec: SchedulerSpec, n: int) -> npt.NDArray[np.float64]:
    train = spec.train_timesteps
    original = int(spec.settings.get("original_inference_steps", 50))
    if n > original:
        raise ValueError(
            f"LCMScheduler runs at most original_inference_steps ({original}) steps, asked for {n}"
        )
    origin = (np.arange(1, original + 1) * (train // original) - 1)[::-1]
    picked = np.floor(np.linspace(0, len(origin), num=n, endpoint=False))
    return np.asarray(origin[picked.astype(np.int64)], dtype=np.float64)


def _flow(spec: SchedulerSpec, n: int) -> Timesteps:
    train = spec.train_timesteps
    shift = float(spec.settings.get("shift", 1.0))
    base = np.linspace(1, train, train, dtype=np.float32)[::-1] / np.float32(train)
    shifted = (shift * base / (1 + (shift - 1) * base)).astype(np.float32)
    high, low = float(shifted[0]) * train, float(shifted[-1]) * train
    sig = np.linspace(high, low, n) / train
    sig = (shift * sig / (1 + (shift - 1) * sig)).astype(np.float32)
    sigmas = np.concatenate([sig, np.zeros(1, np.float32)])
    return np.asarray(sig * np.float32(train), dtype=np.float64), sigmas


def _karras(
    spec: SchedulerSpec, in_sigmas: npt.NDArray[np.float64], n: int
) -> npt.NDArray[np.float64]:
    sigma_min = spec.settings.get("sigma_min") or float(in_sigmas[-1])
    sigma_max = spec.settings.get("sigma_max") or float(in_sigmas[0])
    rho = 7.0
    ramp = np.linspace(0, 1, n)
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    return np.asarray((hi + ramp * (lo - hi)) ** rho, dtype=np.float64)


def _sigma_to_t(sigma: npt.NDArray[np.float64], log_sigmas: npt.NDArray[np.float64]) -> Any:
    log_sigma = np.log(np.maximum(sigma, 1e-10))
    dists = log_sigma - log_sigmas[:, np.newaxis]
    low = np.cumsum((dists >= 0), axis=0).argmax(axis=0).clip(max=log_sigmas.shape[0] - 2)
    high = low + 1
    lo, hi = log_sigmas[low], log_sigmas[high]
    w = np.clip((lo - log_sigma) / (lo - hi), 0, 1)
    return ((1 - w) * low + w * high).reshape(sigma.shape)
