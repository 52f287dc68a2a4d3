"""The ``iterative:`` entry of a model: a denoiser the runtime runs in a sampler loop.

An iterative model is a denoiser (sample, timestep, condition -> predicted noise)
served as a generator: a request carries a prompt (and optionally a seed, a step
count and a guidance scale); the runtime turns the prompt into the condition (the
built-in digit parser, or a ``text_encoder`` model), runs one work item per step in
the model's scheduler, moves the sample between steps with the configured sampler
(numpy, in the runtime) and hands the final sample to a ``decoder`` model or turns it
into the image itself. The same shape as a Stable-Diffusion-style ONNX export
(text encoder -> UNet loop -> VAE decoder). ``docs/generation.md`` is the guide.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from sordino.config.base import Section

__all__ = [
    "MAX_STEP_CACHE_SKIPS",
    "DegradeConfig",
    "IterativeConfig",
    "IterativeSteps",
    "ReuseConfig",
    "StepCacheConfig",
]

MAX_STEP_CACHE_SKIPS = 16
"""The most denoiser calls in a row the step cache may skip."""


class IterativeSteps(Section):
    """How many denoising steps a request may ask for, and how many it gets by default."""

    default: int = Field(default=20, ge=1)
    """Steps of a request that names none."""
    max: int = Field(default=50, ge=1)
    """Most steps a request may ask for; more is a 400."""

    @model_validator(mode="after")
    def _default_within_max(self) -> IterativeSteps:
        if self.default > self.max:
            raise ValueError(f"steps.default ({self.default}) exceeds steps.max ({self.max})")
        return self


class DegradeConfig(Section):
    """Degrade instead of drop: fewer remaining steps for a request that would be late."""

    enabled: bool = True
    """Lower the remaining steps of a request whose predicted finish misses its deadline."""
    min_steps: int = Field(default=4, ge=1)
    """The floor: a degraded request still gets at least this many steps in all."""
    floors: dict[int, int] = Field(default_factory=dict)
    """Per priority level (1 = highest) floors that replace ``min_steps``."""
    protect_priority: int = Field(default=1, ge=0)
    """Requests at this priority level or higher (1 = highest) never degrade; 0 = none protected."""


class ReuseConfig(Section):
    """Result reuse: exact results, identical requests in flight, cached intermediate states."""

    cache_entries: int = Field(default=256, ge=0)
    """Exact results kept per tenant (LRU), keyed by prompt, seed, steps, guidance and
    model version; 0 turns the cache off."""
    coalesce: bool = True
    """Identical requests in flight share one generation."""
    approximate: bool = False
    """Start a request from a cached intermediate state of the same prompt and skip steps."""
    approximate_skip: float = Field(default=0.5, gt=0.0, lt=1.0)
    """With ``approximate``: the share of the schedule a cached state skips."""
    approximate_entries: int = Field(default=64, ge=1)
    """Intermediate states kept (one per prompt condition, guidance and sampler)."""


class StepCacheConfig(Section):
    """Step caching (TeaCache-style): skip a denoiser call whose input barely changed.

    Between two steps the denoiser's input moves a little; while the relative L1
    change of the sample, accumulated since the last step the denoiser ran, stays
    under ``threshold``, the step reuses that step's noise prediction instead of
    running the model. The first and last steps always run.
    """

    enabled: bool = False
    threshold: float = Field(default=0.1, ge=0.0, le=1.0)
    """The accumulated relative L1 change of the sample (mean |x - x_last| / mean
    |x_last|) under which a step reuses the last prediction; 0 never skips (the
    output is then bit-identical to the cache off). Larger skips more, and the image
    drifts further from the uncached one."""
    max_skips: int = Field(default=2, ge=1, le=MAX_STEP_CACHE_SKIPS)
    """Most steps in a row that may reuse one prediction."""


class IterativeConfig(Section):
    """Serve the model as a denoiser in a sampler loop the runtime owns (a generator)."""

    sampler: Literal["ddim", "euler"] = "ddim"
    """How the sample moves between timesteps (both deterministic)."""
    steps: IterativeSteps = IterativeSteps()
    guidance: float = Field(default=1.0, ge=0.0, le=20.0)
    """Default classifier-free guidance scale; 1 runs the conditional prediction only."""
    train_timesteps: int = Field(default=1000, ge=2)
    """Timesteps of the cosine noise schedule the denoiser was trained on."""
    sample_shape: tuple[int, ...] = (64,)
    """Shape of one sample (without the batch dimension)."""
    prompt: Literal["digits", "text_encoder"] = "digits"
    """How a prompt becomes the condition: the built-in digit parser ("a handwritten 7"
    -> one-hot of 7) or the ``text_encoder`` model."""
    max_prompt_length: int = Field(default=1024, ge=1, le=1_048_576)
    """Longest prompt accepted, in characters; a longer one is answered 400 naming this
    key (a prompt is read on the server's event loop: a huge one would stall it)."""
    text_encoder: str | None = None
    """A loaded model taking the prompt (BYTES [B, 1]) and giving the condition."""
    text_encoder_2: str | None = None
    """With ``export``: the second text encoder of an SDXL export (set by sordino); the
    generator then runs the SDXL loop (generation/stable_diffusion_xl.py)."""
    text_encoder_3: str | None = None
    """With ``export``: the T5 text encoder of an SD3 export (set by sordino; without it,
    as in diffusers, T5's rows are zeros)."""
    decoder: str | None = None
    """A loaded model taking the final sample and giving the image values in [-1, 1]."""
    image_encoder: str | None = None
    """With ``export``: the loaded VAE encoder (image to image: ``image`` and ``strength``
    inputs); set by sordino when the export has ``vae_encoder/model.onnx``."""
    sample_input: str = "sample"
    timestep_input: str = "timestep"
    condition_input: str = "condition"
    noise_output: str = "noise"
    export: Path | None = None
    """A diffusers export folder (set by sordino when it recognises one, models/
    diffusers_export.py): the tokenizer and the scheduler are read from it, and the
    generator runs the Stable Diffusion loop (generation/stable_diffusion.py)."""
    scheduler: str | None = None
    """With ``export``: run this diffusers scheduler instead of the export's (e.g.
    ``DPMSolverMultistepScheduler``), from the export's scheduler config as diffusers'
    ``Scheduler.from_config(pipe.scheduler.config)`` does."""
    scheduler_options: dict[str, bool | int | float | str] = Field(default_factory=dict)
    """With ``export``: scheduler settings that replace the export's (e.g.
    ``use_karras_sigmas: true``, ``timestep_spacing: trailing``)."""
    degrade: DegradeConfig = DegradeConfig()
    reuse: ReuseConfig = ReuseConfig()
    step_cache: StepCacheConfig = StepCacheConfig()
    batching: Literal["step", "request"] = "step"
    """step: every step is a work item (requests join and leave between steps);
    request: a generation runs as one unit, new requests wait for the running cohort
    (the baseline the benchmark compares against)."""

    @model_validator(mode="after")
    def _encoder_named(self) -> IterativeConfig:
        if self.prompt == "text_encoder" and not self.text_encoder:
            raise ValueError("prompt: text_encoder needs text_encoder: <model name>")
        if self.text_encoder and self.prompt != "text_encoder":
            raise ValueError("text_encoder is set but prompt is 'digits'; set prompt: text_encoder")
        return self
