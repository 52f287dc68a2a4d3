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

Image to image (diffusers' ``StableDiffusionImg2ImgPipeline``) starts part way:
:meth:`Sampler.image_start` is the first call for a ``strength`` and
:meth:`Sampler.add_noise` noises the encoded image to that call's timestep, each as the
scheduler's ``add_noise`` (flow matching's ``scale_noise``) does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["SCHEDULERS", "Sampler", "SchedulerSpec", "image_steps", "scheduler_from_config"]

F32 = npt.NDArray[np.floating[Any]]  # float32 throughout; numpy types the arithmetic loosely
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


class Sampler:
    """One generation's scheduler state: call :meth:`scale_input` and :meth:`step` per timestep.

    ``timesteps[i]`` is the denoiser's timestep at call ``i``; ``init_noise_sigma``
    scales the initial noise (diffusers' ``latents * scheduler.init_noise_sigma``).
    """

    def __init__(self, spec: SchedulerSpec, steps: int, rng: np.random.Generator) -> None:
        self.spec = spec
        self.steps = steps
        self.rng = rng
        self.init_noise_sigma = 1.0
        self.sigmas: npt.NDArray[np.float32] | None = None
        self._outputs: list[F32] = []  # PNDM's ets, DPM-Solver's model outputs
        self._cur_sample: F32 | None = None
        self._counter = 0
        kind = spec.kind
        if kind == "PNDMScheduler":
            self.timesteps = self._pndm_timesteps()
        elif kind == "DDIMScheduler":
            self.timesteps = self._spaced(steps, float_steps=False)
        elif kind == "DPMSolverMultistepScheduler":
            self.timesteps = self._dpm_timesteps()
        elif kind == "LCMScheduler":
            self.timesteps = self._lcm_timesteps()
        elif kind == "FlowMatchEulerDiscreteScheduler":
            self.timesteps = self._flow_timesteps()
        else:
            self.timesteps = self._euler_timesteps()
            assert self.sigmas is not None
            top = float(self.sigmas.max())
            leading = spec.spacing not in ("linspace", "trailing")
            self.init_noise_sigma = float((top**2 + 1) ** 0.5) if leading else top

    # -- timesteps --------------------------------------------------------------------

    def _spaced(self, n: int, *, float_steps: bool) -> npt.NDArray[np.float64]:
        """DDIM's (and Euler's) spacing of ``n`` timesteps, largest first."""
        train, spacing = self.spec.train_timesteps, self.spec.spacing
        if spacing == "linspace":
            steps = np.linspace(0, train - 1, n, dtype=np.float32 if float_steps else np.float64)
            return np.asarray(steps[::-1] if float_steps else steps[::-1].round(), dtype=np.float64)
        if spacing == "leading":
            ratio = train // n
            steps = (np.arange(0, n) * ratio).round()[::-1] + self.spec.steps_offset
            return np.asarray(steps, dtype=np.float64)
        ratio_f = train / n
        return np.asarray(np.round(np.arange(train, 0, -ratio_f)) - 1, dtype=np.float64)

    def _pndm_timesteps(self) -> npt.NDArray[np.float64]:
        train, n, spacing = self.spec.train_timesteps, self.steps, self.spec.spacing
        if spacing == "linspace":
            base = np.linspace(0, train - 1, n).round().astype(np.int64)
        elif spacing == "leading":
            base = (np.arange(0, n) * (train // n)).round() + self.spec.steps_offset
        else:
            base = np.round(np.arange(train, 0, -train / n))[::-1].astype(np.int64) - 1
        plms = np.concatenate([base[:-1], base[-2:-1], base[-1:]])[::-1]
        return np.asarray(plms, dtype=np.float64)

    def _log_sigmas(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        ac = self.spec.alphas_cumprod
        sigmas = np.array(((1 - ac) / ac) ** 0.5)
        return sigmas, np.log(sigmas)

    def _euler_timesteps(self) -> npt.NDArray[np.float64]:
        sigmas, log_sigmas = self._log_sigmas()
        timesteps = self._spaced(self.steps, float_steps=True).astype(np.float32)
        sig = np.interp(timesteps, np.arange(0, len(sigmas)), sigmas)
        karras = self.spec.kind == "EulerDiscreteScheduler" and self.spec.settings.get(
            "use_karras_sigmas"
        )
        if karras:
            sig = self._karras(sig)
            timesteps = np.array([_sigma_to_t(np.asarray(s), log_sigmas) for s in sig])
        self.sigmas = np.concatenate([sig, [0.0]]).astype(np.float32)
        return np.asarray(timesteps.astype(np.float32), dtype=np.float64)

    def _dpm_timesteps(self) -> npt.NDArray[np.float64]:
        train, n, spacing = self.spec.train_timesteps, self.steps, self.spec.spacing
        if spacing == "linspace":
            steps = np.linspace(0, train - 1, n + 1).round()[::-1][:-1].astype(np.int64)
        elif spacing == "leading":
            ratio = train // (n + 1)
            steps = (np.arange(0, n + 1) * ratio).round()[::-1][:-1].astype(np.int64)
            steps = steps + self.spec.steps_offset
        else:
            steps = np.arange(train, 0, -train / n).round().astype(np.int64) - 1
        sigmas, log_sigmas = self._log_sigmas()
        if self.spec.settings.get("use_karras_sigmas"):
            sig = self._karras(np.flip(sigmas).copy())
            steps_f = np.array([_sigma_to_t(np.asarray(s), log_sigmas) for s in sig])
            if self.spec.settings.get("beta_schedule") != "squaredcos_cap_v2":
                steps_f = steps_f.round()
            steps = steps_f.astype(np.int64)
        else:
            sig = np.interp(steps, np.arange(0, len(sigmas)), sigmas)
        self.sigmas = np.concatenate([sig, [0.0]]).astype(np.float32)
        return np.asarray(steps, dtype=np.float64)

    def _lcm_timesteps(self) -> npt.NDArray[np.float64]:
        train = self.spec.train_timesteps
        original = int(self.spec.settings.get("original_inference_steps", 50))
        if self.steps > original:
            raise ValueError(
                f"LCMScheduler runs at most original_inference_steps ({original}) steps, "
                f"asked for {self.steps}"
            )
        origin = (np.arange(1, original + 1) * (train // original) - 1)[::-1]
        picked = np.floor(np.linspace(0, len(origin), num=self.steps, endpoint=False))
        return np.asarray(origin[picked.astype(np.int64)], dtype=np.float64)

    def _flow_timesteps(self) -> npt.NDArray[np.float64]:
        train = self.spec.train_timesteps
        shift = float(self.spec.settings.get("shift", 1.0))
        base = np.linspace(1, train, train, dtype=np.float32)[::-1] / np.float32(train)
        shifted = (shift * base / (1 + (shift - 1) * base)).astype(np.float32)
        high, low = float(shifted[0]) * train, float(shifted[-1]) * train
        sig = np.linspace(high, low, self.steps) / train
        sig = (shift * sig / (1 + (shift - 1) * sig)).astype(np.float32)
        self.sigmas = np.concatenate([sig, np.zeros(1, np.float32)])
        return np.asarray(sig * np.float32(train), dtype=np.float64)

    def _karras(self, in_sigmas: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        sigma_min = self.spec.settings.get("sigma_min") or float(in_sigmas[-1])
        sigma_max = self.spec.settings.get("sigma_max") or float(in_sigmas[0])
        rho = 7.0
        ramp = np.linspace(0, 1, self.steps)
        lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
        return np.asarray((hi + ramp * (lo - hi)) ** rho, dtype=np.float64)

    # -- steps ------------------------------------------------------------------------

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
        kind = self.spec.kind
        if kind == "PNDMScheduler":
            return self._pndm(out, index, x)
        if kind == "DDIMScheduler":
            return self._ddim(out, index, x)
        if kind == "DPMSolverMultistepScheduler":
            return self._dpm(out, index, x)
        if kind == "LCMScheduler":
            return self._lcm(out, index, x)
        if kind == "FlowMatchEulerDiscreteScheduler":
            assert self.sigmas is not None
            dt = self.sigmas[index + 1] - self.sigmas[index]
            return np.asarray(x + dt * out, dtype=np.float32)
        return self._euler(out, index, x, ancestral=kind == "EulerAncestralDiscreteScheduler")

    def _alpha(self, t: float) -> np.float32:
        ac = self.spec.alphas_cumprod
        if t >= 0:
            return np.float32(ac[int(t)])
        # diffusers' defaults differ: DDIM sets alpha to one, PNDM does not.
        default = self.spec.kind in ("DDIMScheduler", "LCMScheduler")
        to_one = self.spec.settings.get("set_alpha_to_one", default)
        return np.float32(1.0) if to_one else ac[0]

    def _pndm(self, out: F32, index: int, x: F32) -> F32:
        t = int(self.timesteps[index])
        ratio = self.spec.train_timesteps // self.steps
        prev_t = t - ratio
        if self._counter != 1:
            self._outputs = [*self._outputs[-3:], out]
        else:
            prev_t, t = t, t + ratio
        ets = self._outputs
        if len(ets) == 1 and self._counter == 0:
            self._cur_sample = x
        elif len(ets) == 1 and self._counter == 1:
            assert self._cur_sample is not None
            out = (out + ets[-1]) / 2
            x, self._cur_sample = self._cur_sample, None
        elif len(ets) == 2:
            out = (3 * ets[-1] - ets[-2]) / 2
        elif len(ets) == 3:
            out = (23 * ets[-1] - 16 * ets[-2] + 5 * ets[-3]) / 12
        else:
            out = (1 / 24) * (55 * ets[-1] - 59 * ets[-2] + 37 * ets[-3] - 9 * ets[-4])
        self._counter += 1
        a, a_prev = self._alpha(t), self._alpha(prev_t)
        beta, beta_prev = 1 - a, 1 - a_prev
        if self.spec.prediction == "v_prediction":
            out = (a**0.5) * out + (beta**0.5) * x
        sample_coeff = (a_prev / a) ** 0.5
        denom = a * beta_prev**0.5 + (a * beta * a_prev) ** 0.5
        return np.asarray(sample_coeff * x - (a_prev - a) * out / denom, dtype=np.float32)

    def _ddim(self, out: F32, index: int, x: F32) -> F32:
        t = int(self.timesteps[index])
        prev_t = t - self.spec.train_timesteps // self.steps
        a, a_prev = self._alpha(t), self._alpha(prev_t)
        beta = 1 - a
        x0: F32
        if self.spec.prediction == "epsilon":
            x0 = (x - beta**0.5 * out) / a**0.5
            eps = out
        elif self.spec.prediction == "sample":
            x0 = out
            eps = (x - a**0.5 * x0) / beta**0.5
        else:
            x0 = a**0.5 * x - beta**0.5 * out
            eps = a**0.5 * out + beta**0.5 * x
        if self.spec.settings.get("clip_sample", True):
            limit = float(self.spec.settings.get("clip_sample_range", 1.0))
            x0 = np.clip(x0, -limit, limit)
        return np.asarray(a_prev**0.5 * x0 + (1 - a_prev) ** 0.5 * eps, dtype=np.float32)

    def _lcm(self, out: F32, index: int, x: F32) -> F32:
        t = int(self.timesteps[index])
        last = index == len(self.timesteps) - 1
        a = self._alpha(t)
        a_prev = a if last else self._alpha(self.timesteps[index + 1])
        beta = 1 - a
        x0: F32
        if self.spec.prediction == "epsilon":
            x0 = (x - beta**0.5 * out) / a**0.5
        elif self.spec.prediction == "sample":
            x0 = out
        else:
            x0 = a**0.5 * x - beta**0.5 * out
        if self.spec.settings.get("clip_sample", False):
            limit = float(self.spec.settings.get("clip_sample_range", 1.0))
            x0 = np.clip(x0, -limit, limit)
        # The boundary-condition scalings (sigma_data 0.5), in float32 as diffusers'.
        scaled = np.float32(t * float(self.spec.settings.get("timestep_scaling", 10.0)))
        c_skip = np.float32(0.25) / (scaled**2 + np.float32(0.25))
        c_out = scaled / (scaled**2 + np.float32(0.25)) ** np.float32(0.5)
        denoised = np.asarray(c_out * x0 + c_skip * x, dtype=np.float32)
        if last:
            return denoised
        noise = self.rng.standard_normal(x.shape).astype(np.float32)
        return np.asarray(a_prev**0.5 * denoised + (1 - a_prev) ** 0.5 * noise, dtype=np.float32)

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
            alpha_t, sigma_t = _alpha_sigma(self.sigmas[index])
            return np.asarray(alpha_t * x + sigma_t * eps, dtype=np.float32)
        if self.sigmas is not None:  # Euler, Euler ancestral
            return np.asarray(x + eps * self.sigmas[index], dtype=np.float32)
        a = self.spec.alphas_cumprod[int(self.timesteps[index])]
        return np.asarray(a**0.5 * x + (1 - a) ** 0.5 * eps, dtype=np.float32)

    def predict_x0(self, model_output: F32, index: int, sample: F32) -> F32:
        """The clean latents the (guided) output at call ``index`` predicts from ``sample``."""
        out = np.asarray(model_output, dtype=np.float32)
        x = np.asarray(sample, dtype=np.float32)
        if self.sigmas is not None:
            sigma = self.sigmas[index]
            if self.spec.kind == "FlowMatchEulerDiscreteScheduler":
                return np.asarray(x - sigma * out, dtype=np.float32)
            if self.spec.kind == "DPMSolverMultistepScheduler":
                alpha_t, sigma_t = _alpha_sigma(sigma)
                if self.spec.prediction == "epsilon":
                    return np.asarray((x - sigma_t * out) / alpha_t, dtype=np.float32)
                if self.spec.prediction == "v_prediction":
                    return np.asarray(alpha_t * x - sigma_t * out, dtype=np.float32)
                return out
            return self._x0_from_sigma(out, x, sigma)
        a = self._alpha(float(self.timesteps[index]))
        if self.spec.prediction == "epsilon":
            return np.asarray((x - (1 - a) ** 0.5 * out) / a**0.5, dtype=np.float32)
        if self.spec.prediction == "v_prediction":
            return np.asarray(a**0.5 * x - (1 - a) ** 0.5 * out, dtype=np.float32)
        return out

    def _x0_from_sigma(self, out: F32, x: F32, sigma: np.float32) -> F32:
        if self.spec.prediction == "epsilon":
            return np.asarray(x - sigma * out, dtype=np.float32)
        if self.spec.prediction == "v_prediction":
            return np.asarray(
                out * (-sigma / (sigma**2 + 1) ** 0.5) + x / (sigma**2 + 1), dtype=np.float32
            )
        return out

    def _euler(self, out: F32, index: int, x: F32, *, ancestral: bool) -> F32:
        assert self.sigmas is not None
        sigma, sigma_next = self.sigmas[index], self.sigmas[index + 1]
        x0 = self._x0_from_sigma(out, x, sigma)
        derivative = (x - x0) / sigma
        if not ancestral:
            return np.asarray(x + derivative * (sigma_next - sigma), dtype=np.float32)
        up = (sigma_next**2 * (sigma**2 - sigma_next**2) / sigma**2) ** 0.5
        down = (sigma_next**2 - up**2) ** 0.5
        moved = x + derivative * (down - sigma)
        noise = self.rng.standard_normal(x.shape).astype(np.float32)
        return np.asarray(moved + noise * up, dtype=np.float32)

    def _dpm(self, out: F32, index: int, x: F32) -> F32:
        assert self.sigmas is not None
        sigma = self.sigmas[index]
        alpha_t, sigma_t = _alpha_sigma(sigma)
        x0: F32
        if self.spec.prediction == "epsilon":
            x0 = (x - sigma_t * out) / alpha_t
        elif self.spec.prediction == "v_prediction":
            x0 = alpha_t * x - sigma_t * out
        else:
            x0 = out
        x0 = np.asarray(x0, dtype=np.float32)
        n = len(self.timesteps)
        lower_final = index == n - 1  # final_sigmas_type "zero": the last step is first order
        self._outputs = [*self._outputs[-1:], x0]
        # Order 2 from the second call on; the last call is first order (diffusers'
        # lower_order_final with final_sigmas_type "zero").
        first_order = self._counter < 1 or lower_final
        self._counter = min(self._counter + 1, 2)
        s_next = self.sigmas[index + 1]
        a_next, sg_next = _alpha_sigma(s_next)
        lam_s0 = np.log(alpha_t) - np.log(sigma_t)
        if s_next == 0:
            return np.asarray(a_next * x0, dtype=np.float32)  # exp(-h) = 0, sigma ratio 0
        lam_t = np.log(a_next) - np.log(sg_next)
        h = lam_t - lam_s0
        if first_order:
            return np.asarray(
                (sg_next / sigma_t) * x - a_next * (np.exp(-h) - 1.0) * x0, dtype=np.float32
            )
        a_prev, sg_prev = _alpha_sigma(self.sigmas[index - 1])
        lam_s1 = np.log(a_prev) - np.log(sg_prev)
        r0 = (lam_s0 - lam_s1) / h
        d0, d1 = self._outputs[-1], (1.0 / r0) * (self._outputs[-1] - self._outputs[-2])
        moved = (
            (sg_next / sigma_t) * x
            - a_next * (np.exp(-h) - 1.0) * d0
            - 0.5 * a_next * (np.exp(-h) - 1.0) * d1
        )
        return np.asarray(moved, dtype=np.float32)


def _alpha_sigma(sigma: np.float32) -> tuple[np.float32, np.float32]:
    alpha = np.float32(1 / ((sigma**2 + 1) ** 0.5))
    return alpha, np.float32(sigma * alpha)


def _sigma_to_t(sigma: npt.NDArray[np.float64], log_sigmas: npt.NDArray[np.float64]) -> Any:
    log_sigma = np.log(np.maximum(sigma, 1e-10))
    dists = log_sigma - log_sigmas[:, np.newaxis]
    low = np.cumsum((dists >= 0), axis=0).argmax(axis=0).clip(max=log_sigmas.shape[0] - 2)
    high = low + 1
    lo, hi = log_sigmas[low], log_sigmas[high]
    w = np.clip((lo - log_sigma) / (lo - hi), 0, 1)
    return ((1 - w) * low + w * high).reshape(sigma.shape)


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
