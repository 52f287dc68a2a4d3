"""One generation's diffusers scheduler: :class:`Sampler`, made by ``SchedulerSpec.start``.

The sampler holds what a diffusers scheduler holds for one run — its timesteps and
sigmas (diffusers_timesteps.py), its generator and its multistep history — and
answers the loop's questions per denoiser call: the input scaling, the step
(diffusers_steps.py), the clean estimate, and image to image's start and noising
(diffusers' ``StableDiffusionImg2ImgPipeline``: :meth:`Sampler.image_start` is the
first call for a ``strength`` and :meth:`Sampler.add_noise` noises the encoded image to
that call's timestep, each as the scheduler's ``add_noise`` (flow matching's
``scale_noise``) does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from sordino.generation import diffusers_steps
from sordino.generation.diffusers_steps import F32, alpha, alpha_sigma, x0_from_sigma
from sordino.generation.diffusers_timesteps import timesteps_for

if TYPE_CHECKING:
    from sordino.generation.diffusers_schedulers import SchedulerSpec

__all__ = ["Sampler", "image_steps"]


class Sampler:
    """One generation's scheduler state: call :meth:`scale_input` and :meth:`step` per timestep.

    ``timesteps[i]`` is the denoiser's timestep at call ``i``; ``init_noise_sigma``
    scales the initial noise (diffusers' ``latents * scheduler.init_noise_sigma``).
    """

    def __init__(self, spec: SchedulerSpec, steps: int, rng: np.random.Generator) -> None:
        self.spec = spec
        self.steps = steps
        self.rng = rng
        """The generator of the noise Euler ancestral and LCM add between steps."""
        self.timesteps, self.sigmas = timesteps_for(spec, steps)
        self.history: list[F32] = []
        """The multistep history: PNDM's ets, DPM-Solver's clean estimates."""
        self.held_sample: F32 | None = None
        """PNDM's sample held over its first two calls."""
        self.counter = 0
        """PNDM's and DPM-Solver's count of the steps taken (their order depends on it)."""
        self.prev_timesteps: npt.NDArray[np.float64] | None = None
        """DDIM's timestep each call steps to, once a cut re-spaced the run."""
        self.pairs: dict[int, tuple[float, float]] | None = None
        """PNDM's (timestep, timestep stepped to) per call, once a cut re-spaced the run."""
        self.init_noise_sigma = 1.0
        if spec.kind.startswith("Euler"):
            assert self.sigmas is not None
            top = float(self.sigmas.max())
            leading = spec.spacing not in ("linspace", "trailing")
            self.init_noise_sigma = float((top**2 + 1) ** 0.5) if leading else top

    def scale_input(self, sample: F32, index: int) -> F32:
        """The denoiser's input at call ``index`` (Euler's divide by sqrt(sigma^2 + 1))."""
        if self.spec.kind.startswith("Euler"):
            assert self.sigmas is not None
            sigma = self.sigmas[index]
            return np.asarray(sample / ((sigma**2 + 1) ** 0.5), dtype=np.float32)
        return sample

    def step(self, model_output: F32, index: int, sample: F32) -> F32:
        """The sample after call ``index`` given the denoiser's (guided) output."""
        out = np.asarray(model_output, dtype=np.float32)
        x = np.asarray(sample, dtype=np.float32)
        return diffusers_steps.step(self, out, index, x)

    def predict_x0(self, model_output: F32, index: int, sample: F32) -> F32:
        """The clean latents the (guided) output at call ``index`` predicts from ``sample``."""
        out = np.asarray(model_output, dtype=np.float32)
        x = np.asarray(sample, dtype=np.float32)
        prediction = self.spec.prediction
        if self.sigmas is not None:
            sigma = self.sigmas[index]
            if self.spec.kind == "FlowMatchEulerDiscreteScheduler":
                return np.asarray(x - sigma * out, dtype=np.float32)
            if self.spec.kind == "DPMSolverMultistepScheduler":
                alpha_t, sigma_t = alpha_sigma(sigma)
                if prediction == "epsilon":
                    return np.asarray((x - sigma_t * out) / alpha_t, dtype=np.float32)
                if prediction == "v_prediction":
                    return np.asarray(alpha_t * x - sigma_t * out, dtype=np.float32)
                return out
            return x0_from_sigma(prediction, out, x, sigma)
        a = alpha(self, float(self.timesteps[index]))
        if prediction == "epsilon":
            return np.asarray((x - (1 - a) ** 0.5 * out) / a**0.5, dtype=np.float32)
        if prediction == "v_prediction":
            return np.asarray(a**0.5 * x - (1 - a) ** 0.5 * out, dtype=np.float32)
        return out

    # -- image to image -------------------------------------------------------------------

    def image_start(self, strength: float, *, fractional: bool = False) -> int:
        """The first call of an image-to-image run at ``strength`` (diffusers' ``t_start``).

        SD 1.x/2.x and SDXL keep ``int(steps x strength)`` calls; SD3's pipeline
        (``fractional``) starts at ``int(steps - steps x strength)``, keeping one more
        when ``steps x strength`` is not whole. Raises ValueError when ``strength``
        leaves no step to run.
        """
        kept = image_steps(self.steps, strength, fractional=fractional)
        if kept < 1:
            raise ValueError(
                f"strength {strength:g} with {self.steps} steps runs no step "
                f"(int(steps x strength) = 0); raise strength or steps"
            )
        return self.steps - kept

    def add_noise(self, latents: F32, noise: F32, index: int) -> F32:
        """``latents`` noised to call ``index``'s timestep, as the scheduler's ``add_noise``."""
        x = np.asarray(latents, dtype=np.float32)
        eps = np.asarray(noise, dtype=np.float32)
        kind = self.spec.kind
        if self.sigmas is not None and kind == "FlowMatchEulerDiscreteScheduler":
            sigma = self.sigmas[index]
            return np.asarray(sigma * eps + (np.float32(1) - sigma) * x, dtype=np.float32)
        if self.sigmas is not None and kind == "DPMSolverMultistepScheduler":
            alpha_t, sigma_t = alpha_sigma(self.sigmas[index])
            return np.asarray(alpha_t * x + sigma_t * eps, dtype=np.float32)
        if self.sigmas is not None:  # Euler, Euler ancestral
            return np.asarray(x + eps * self.sigmas[index], dtype=np.float32)
        a = self.spec.alphas_cumprod[int(self.timesteps[index])]
        return np.asarray(a**0.5 * x + (1 - a) ** 0.5 * eps, dtype=np.float32)


def image_steps(steps: int, strength: float, *, fractional: bool = False) -> int:
    """The calls an image-to-image run of ``steps`` at ``strength`` makes, as diffusers'
    ``get_timesteps``: ``min(int(steps x strength), steps)``, or with ``fractional``
    (``StableDiffusion3Img2ImgPipeline``) ``steps - int(max(steps - steps x strength, 0))``.
    """
    product = steps * strength
    if abs(product - round(product)) < 1e-5:
        # A strength sent as FP32 (0.6 is 0.60000002): the product diffusers computes
        # from the decimal is whole, so count it whole, as diffusers does.
        product = round(product)
    if fractional:
        return steps - int(max(steps - min(product, steps), 0))
    return min(int(product), steps)
