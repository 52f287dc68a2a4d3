"""Cut a running diffusers generation: its remaining calls re-spaced to fewer steps.

Degrade-instead-of-drop cuts an export's generation at a step boundary, as it cuts
digits-diffusion's (sd_generation.py asks the degrader after every call). The calls
already made stay as they were; :func:`replan` replaces the calls from ``index`` on
with ``keep`` steps from the point the latents are at now (call ``index``'s timestep
or sigma) down to the run's last one, spaced as the scheduler spaces a run:

- Euler, Euler ancestral: timesteps evenly spaced from the current one to the last,
  sigmas interpolated from the training sigmas as ``set_timesteps`` does (Karras sigmas:
  the Karras ramp from the current sigma to the last, timesteps from the sigmas);
- flow-matching Euler: the unshifted sigmas evenly spaced, then shifted (``shift``);
- DDIM: timesteps evenly spaced, each call stepping to the next one (the last to the
  final alpha, as before);
- DPM-Solver++ 2M: the new sigmas continue the old ones; its second-order update
  already takes each step's own size (its ``lambda`` ratio), so its history carries on;
- PNDM (PLMS): the multistep warm-up restarts from the current point, as diffusers'
  starts a run: the first new timestep called twice, the history emptied. Not while
  the warm-up's second call is pending (:func:`can_replan` is False then).

LCM keeps its plan (its grid comes from ``original_inference_steps``): only the cut
before the first step applies to it. Without a cut nothing here runs, so an uncut
run stays diffusers' own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sordino.generation.diffusers_timesteps import _log_sigmas, _sigma_to_t

if TYPE_CHECKING:
    from sordino.generation.diffusers_sampler import Sampler

__all__ = ["can_replan", "replan"]

_SIGMA_KINDS = (
    "EulerDiscreteScheduler",
    "EulerAncestralDiscreteScheduler",
    "DPMSolverMultistepScheduler",
    "FlowMatchEulerDiscreteScheduler",
)


def can_replan(sampler: Sampler, index: int) -> bool:
    """Whether the calls from ``index`` on may be re-spaced now (at least two are left)."""
    kind = sampler.spec.kind
    if len(sampler.timesteps) - index < 2 or index < 1:
        return False
    if kind == "PNDMScheduler":
        return sampler.counter != 1  # the warm-up's second call redoes the first
    return kind == "DDIMScheduler" or kind in _SIGMA_KINDS


def replan(sampler: Sampler, index: int, keep: int) -> None:
    """Replace the calls from ``index`` on with ``keep`` (>= 1) steps from the current point.

    Requires :func:`can_replan`; ``keep`` is fewer than the steps left.
    """
    kind, timesteps = sampler.spec.kind, sampler.timesteps
    if kind in _SIGMA_KINDS:
        assert sampler.sigmas is not None
        tail_t, tail_s = _sigma_tail(sampler, index, keep)
        sampler.timesteps = np.concatenate([timesteps[:index], tail_t])
        sampler.sigmas = np.concatenate([sampler.sigmas[:index], tail_s, [0.0]]).astype(np.float32)
        return
    ratio = sampler.spec.train_timesteps // sampler.steps
    final_prev = float(timesteps[-1]) - ratio  # where the last call stepped to
    spaced = np.linspace(float(timesteps[index]), float(timesteps[-1]), keep).round()
    spaced[0] = timesteps[index]
    if kind == "DDIMScheduler":
        if sampler.prev_timesteps is None:
            sampler.prev_timesteps = timesteps - ratio
        prev = np.concatenate([spaced[1:], [final_prev]])
        sampler.prev_timesteps = np.concatenate([sampler.prev_timesteps[:index], prev])
        sampler.timesteps = np.concatenate([timesteps[:index], spaced])
        return
    # PNDM: PLMS restarted here, as at a run's start (diffusers' skip_prk_steps order).
    calls = [spaced[0], *spaced[1:2], *spaced[1:]] if keep > 1 else [spaced[0]]
    targets = [*spaced[1:2], *spaced[1:], final_prev] if keep > 1 else [final_prev]
    pairs = {
        index + i: (float(c), float(p)) for i, (c, p) in enumerate(zip(calls, targets, strict=True))
    }
    if keep > 1:
        pairs[index + 1] = (float(spaced[0]), float(spaced[1]))  # the warm-up's redo
    sampler.pairs = {**(sampler.pairs or {}), **pairs}
    sampler.timesteps = np.concatenate([timesteps[:index], np.asarray(calls, dtype=np.float64)])
    sampler.history, sampler.held_sample, sampler.counter = [], None, 0


def _sigma_tail(sampler: Sampler, index: int, keep: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``keep`` timesteps and sigmas (no trailing zero) from call ``index`` on."""
    spec = sampler.spec
    assert sampler.sigmas is not None
    sigma_now, sigma_last = float(sampler.sigmas[index]), float(sampler.sigmas[-2])
    t_now, t_last = float(sampler.timesteps[index]), float(sampler.timesteps[-1])
    if spec.kind == "FlowMatchEulerDiscreteScheduler":
        shift = float(spec.settings.get("shift", 1.0))

        def unshift(s: float) -> float:
            return s / (shift - (shift - 1) * s)

        u = np.linspace(unshift(sigma_now), unshift(sigma_last), keep)
        sig = (shift * u / (1 + (shift - 1) * u)).astype(np.float32)
        sig[0] = sampler.sigmas[index]
        tail_t = np.asarray(sig * np.float32(spec.train_timesteps), dtype=np.float64)
        tail_t[0] = t_now
        return tail_t, sig
    table, log_sigmas = _log_sigmas(spec)
    if spec.settings.get("use_karras_sigmas") and spec.kind != "EulerAncestralDiscreteScheduler":
        # Karras' ramp (rho 7) from the current sigma to the last.
        lo, hi = sigma_last ** (1 / 7), sigma_now ** (1 / 7)
        ramp = (hi + np.linspace(0, 1, keep) * (lo - hi)) ** 7
        steps = np.array([_sigma_to_t(np.asarray(s), log_sigmas) for s in ramp])
        if spec.kind == "DPMSolverMultistepScheduler":
            if spec.settings.get("beta_schedule") != "squaredcos_cap_v2":
                steps = steps.round()
            steps = steps.astype(np.int64)
        else:
            steps = steps.astype(np.float32)
        sig = ramp.astype(np.float32)
    else:
        steps = np.linspace(t_now, t_last, keep)
        if spec.kind == "DPMSolverMultistepScheduler":
            steps = steps.round()
        else:
            steps = steps.astype(np.float32)
        sig = np.interp(steps, np.arange(0, len(table)), table).astype(np.float32)
    tail_t = np.asarray(steps, dtype=np.float64)
    tail_t[0], sig[0] = t_now, sampler.sigmas[index]
    return tail_t, sig
