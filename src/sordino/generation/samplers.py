"""The sampler math of an iterative (diffusion) model, in numpy, outside the model graph.

A denoiser predicts the noise in a sample at a timestep. Its noise schedule is the
cosine schedule of Nichol & Dhariwal (``alpha_bar``) over ``train_timesteps`` discrete
timesteps; the runtime decides which timesteps a generation visits (:meth:`Schedule.plan`)
and moves the sample from one to the next:

- DDIM (deterministic, eta = 0): predict x0, clip it to the data range, step to the
  next timestep along the same noise direction;
- Euler: the same path written as an ODE in sigma = sqrt((1 - alpha_bar) / alpha_bar),
  one Euler step per timestep.

Both are row-wise: each row of a batch may be at its own timestep, so the steps of
different requests share one batch and each row's result equals running it alone.
The last step returns the clipped x0 estimate (the sample at timestep "-1").
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = ["SamplerName", "Schedule"]


@functools.lru_cache(maxsize=4096)
def _alpha_bar_scalar(timesteps: int, offset: float, t: float) -> float:
    x = (t + 1.0) / timesteps
    f = math.cos((x + offset) / (1 + offset) * math.pi / 2) ** 2
    f0 = math.cos(offset / (1 + offset) * math.pi / 2) ** 2
    return min(max(f / f0, 1e-5), 0.9999)


SamplerName = Literal["ddim", "euler"]
FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Schedule:
    """A cosine noise schedule over ``train_timesteps`` steps; samples lie in [-1, 1]."""

    train_timesteps: int = 1000
    offset: float = 0.008

    def alpha_bar(self, t: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """alpha_bar at discrete timestep(s) ``t`` (0 = almost clean, T-1 = pure noise)."""
        return self._alpha_bar(np.asarray(t, dtype=np.float64))

    def _alpha_bar_of(self, t: float) -> float:
        """alpha_bar at one timestep, in plain floats (the per-request hot path)."""
        return _alpha_bar_scalar(self.train_timesteps, self.offset, t)

    def _alpha_bar(self, t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        x = (t + 1.0) / self.train_timesteps
        s = self.offset
        f = np.cos((x + s) / (1 + s) * np.pi / 2) ** 2
        f0 = np.cos(s / (1 + s) * np.pi / 2) ** 2
        return np.asarray(np.clip(f / f0, 1e-5, 0.9999), dtype=np.float64)

    def plan(self, steps: int, start: float | None = None) -> npt.NDArray[np.float64]:
        """The timesteps a generation of ``steps`` steps visits, from ``start`` down to 0."""
        if steps < 1:
            raise ValueError(f"a generation needs at least 1 step, got {steps}")
        top = float(self.train_timesteps - 1) if start is None else float(start)
        return np.round(np.linspace(top, 0.0, steps))

    def step(
        self,
        sampler: SamplerName,
        sample: FloatArray,
        noise: FloatArray,
        t: npt.NDArray[np.float64],
        t_next: npt.NDArray[np.float64],
    ) -> FloatArray:
        """Move ``sample`` (rows at timesteps ``t``) to ``t_next``; a negative t_next ends.

        ``noise`` is the denoiser's prediction for ``sample``; every argument has one
        entry (or row) per sample row.
        """
        x = sample.astype(np.float64)
        eps = noise.astype(np.float64)
        ab = self.alpha_bar(t)[:, None]
        x0 = np.clip((x - np.sqrt(1.0 - ab) * eps) / np.sqrt(ab), -1.0, 1.0)
        last = (t_next < 0)[:, None]
        ab_next = self.alpha_bar(np.maximum(t_next, 0.0))[:, None]
        if sampler == "ddim":
            eps_hat = (x - np.sqrt(ab) * x0) / np.sqrt(1.0 - ab)
            moved = np.sqrt(ab_next) * x0 + np.sqrt(1.0 - ab_next) * eps_hat
        else:  # euler, in sigma space: z = x / sqrt(alpha_bar)
            sigma = np.sqrt((1.0 - ab) / ab)
            sigma_next = np.sqrt((1.0 - ab_next) / ab_next)
            z = x / np.sqrt(ab)
            slope = (z - x0) / sigma
            moved = (z + (sigma_next - sigma) * slope) * np.sqrt(ab_next)
        return np.where(last, x0, moved).astype(np.float32)

    def step_one(
        self,
        sampler: SamplerName,
        sample: FloatArray,
        noise: FloatArray,
        t: float,
        t_next: float,
    ) -> FloatArray:
        """:meth:`step` for rows that share one ``t`` and ``t_next`` (one request's step).

        The same arithmetic as :meth:`step` with the coefficients computed once: a
        generation calls it once per step, so it is kept light.
        """
        ab = self._alpha_bar_of(t)
        x = sample.astype(np.float64)
        eps = noise.astype(np.float64)
        x0 = np.clip((x - math.sqrt(1.0 - ab) * eps) / math.sqrt(ab), -1.0, 1.0)
        if t_next < 0:
            return x0.astype(np.float32)
        ab_next = self._alpha_bar_of(t_next)
        if sampler == "ddim":
            eps_hat = (x - math.sqrt(ab) * x0) / math.sqrt(1.0 - ab)
            moved = math.sqrt(ab_next) * x0 + math.sqrt(1.0 - ab_next) * eps_hat
        else:
            sigma = math.sqrt((1.0 - ab) / ab)
            sigma_next = math.sqrt((1.0 - ab_next) / ab_next)
            z = x / math.sqrt(ab)
            slope = (z - x0) / sigma
            moved = (z + (sigma_next - sigma) * slope) * math.sqrt(ab_next)
        return moved.astype(np.float32)

    def predict_x0(
        self, sample: FloatArray, noise: FloatArray, t: npt.NDArray[np.float64]
    ) -> FloatArray:
        """The clean sample the denoiser sees in ``sample`` (for previews)."""
        ab = self.alpha_bar(t)[:, None]
        x0 = (sample.astype(np.float64) - np.sqrt(1.0 - ab) * noise) / np.sqrt(ab)
        return np.clip(x0, -1.0, 1.0).astype(np.float32)

    def renoise(self, x0: FloatArray, noise: FloatArray, t: npt.NDArray[np.float64]) -> FloatArray:
        """``x0`` noised to timestep ``t`` with ``noise`` (starting from a cached state)."""
        ab = self.alpha_bar(t)[:, None]
        return (np.sqrt(ab) * x0 + np.sqrt(1.0 - ab) * noise).astype(np.float32)
