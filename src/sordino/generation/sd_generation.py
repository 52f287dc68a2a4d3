"""One Stable Diffusion request's denoising loop: :class:`SDGeneration`, the scheduler's stepper.

The pipeline (stable_diffusion.py) makes one per request once its text is encoded.
It plans the run (degrade applies before the first step), draws the initial latents
(or starts part way: image to image's encoded image, approximate reuse's cached clean
estimate, each noised to the start), and between UNet calls guides the noise, steps
the export's scheduler (diffusers_sampler.py), keeps or skips calls with the step
cache and hands out the previews. SDXL's and SD3's add their own UNet conditioning
(:meth:`SDGeneration.unet_conditioning`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from sordino.errors import InferenceFailed
from sordino.generation.diffusers_schedulers import Sampler
from sordino.generation.sd_request import SDParams
from sordino.generation.step_cache import StepCache
from sordino.memory.refs import Tensors, TensorsBuilder

if TYPE_CHECKING:
    from sordino.generation.stable_diffusion import StableDiffusion

__all__ = ["SDGeneration"]


class SDGeneration:
    """One request's diffusers loop; the scheduler calls :meth:`advance` after each UNet call."""

    def __init__(
        self,
        pipeline: StableDiffusion,
        params: SDParams,
        embeddings: npt.NDArray[np.float32],
        *,
        priority: int,
        progress: bool,
        now: float,
        deadline: float | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.params = params
        self.priority = priority
        self.progress = progress
        self.guided = params.guidance > 1.0
        self.embeddings = embeddings
        shape = (params.num_images, pipeline.latent_channels, params.height // 8, params.width // 8)
        # Degrade applies here, before the first step: the whole run is planned with the
        # fewer steps (a diffusers scheduler's timesteps depend on the count), so the
        # image is diffusers' own at that count.
        steps = pipeline.planned_steps(params, priority=priority, now=now, deadline=deadline)
        self.degraded = steps < params.steps
        pipeline.degrader.note(params.steps - steps, first=True)
        self.sampler: Sampler = pipeline.spec.start(steps, np.random.default_rng([1, params.seed]))
        latents = params.latents
        if latents is None:
            latents = np.random.default_rng(params.seed).standard_normal(shape).astype(np.float32)
        self.begin = 0  # image to image (and approximate reuse) starts part way
        self.reused_steps = 0
        self._store_at: int | None = None
        self.state_key = (
            self.embeddings.tobytes(),
            params.guidance,
            pipeline.spec.kind,
            steps,
            shape,
            getattr(params, "time_ids", ()),
        )
        cached = self._approximate(steps) if params.encoded is None else None
        if cached is not None:
            # Another request's clean estimate of the same prompt, re-noised with this
            # request's own noise to call ``begin`` (as image to image starts): the
            # calls before it are not run.
            self.latents = self.sampler.add_noise(cached, latents, self.begin)
        elif params.encoded is not None:
            self.begin = self.sampler.image_start(
                params.strength, fractional=pipeline.fractional_strength
            )
            start = np.repeat(params.encoded, params.num_images // len(params.encoded), axis=0)
            self.latents = self.sampler.add_noise(start, latents, self.begin)
        else:
            self.latents = np.asarray(
                latents * np.float32(self.sampler.init_noise_sigma), dtype=np.float32
            )
        self.run_steps = steps - self.begin
        self.index = self.begin
        self.steps_used = self.reused_steps
        self.closed = False
        self._last = now
        self.cache = StepCache(pipeline.config.step_cache, pipeline.step_cache)
        self._scaled: npt.NDArray[np.float32] | None = None  # the next call's, when known
        self._input: npt.NDArray[np.float32] | None = None  # the queued call's
        self._moved = 1  # steps the last advance moved the latents

    def _approximate(self, steps: int) -> npt.NDArray[np.float32] | None:
        """With ``reuse.approximate``: a cached clean estimate to start from (``begin`` and
        ``reused_steps`` set), or None (and where to keep this run's estimate)."""
        reuse = self.pipeline.config.reuse
        if not reuse.approximate:
            return None
        skip = min(steps - 1, round(steps * reuse.approximate_skip))
        if skip <= 0:
            return None
        cached = self.pipeline.states.get(self.state_key)
        if cached is None:
            self._store_at = skip - 1  # after this call, its clean estimate is kept
            return None
        self.begin = self.reused_steps = skip
        self.pipeline.states.steps_saved += skip
        return cached

    def inputs(self) -> Tensors:
        """The next UNet call: the scaled latents (twice when guided), timestep, text rows."""
        pipeline = self.pipeline
        scaled = self._scaled
        if scaled is None:
            scaled = self.sampler.scale_input(self.latents, self.index)
        self._scaled = None
        self._input = scaled
        rows = 2 * len(scaled) if self.guided else len(scaled)
        state = TensorsBuilder(pipeline.arena())
        try:
            sample = state.empty(
                pipeline.config.sample_input, np.dtype(np.float32), (rows, *scaled.shape[1:])
            )
            sample[: len(scaled)] = scaled
            sample[len(scaled) :] = scaled
        except BaseException:
            state.abandon()
            raise
        timestep = np.full(rows, self.sampler.timesteps[self.index], dtype=pipeline.timestep_dtype)
        small = Tensors.of({"timestep": timestep, **self.unet_conditioning()})
        with state.finish() as placed:
            return Tensors.compose(
                {
                    pipeline.config.sample_input: (placed, pipeline.config.sample_input),
                    **{key: (small, key) for key in small},
                }
            )

    def unet_conditioning(self) -> dict[str, npt.NDArray[np.float32]]:
        """The UNet's inputs besides ``sample`` and ``timestep``, one row per sample row.

        SD 1.x/2.x: the text rows; SDXL adds its own (generation/stable_diffusion_xl.py).
        """
        return {"encoder_hidden_states": self.embeddings}

    def advance(self, outputs: Tensors, now: float) -> tuple[Tensors | None, Tensors | None]:
        predicted = np.asarray(outputs[self.pipeline.config.noise_output], dtype=np.float32)
        n = len(self.latents)
        if predicted.shape[0] != (2 * n if self.guided else n):
            raise InferenceFailed(
                f"the UNet of {self.pipeline.key} returned {predicted.shape[0]} rows for a call "
                f"of {2 * n if self.guided else n}"
            )
        noise = predicted
        if self.guided:
            uncond, cond = predicted[:n], predicted[n:]
            noise = uncond + np.float32(self.params.guidance) * (cond - uncond)
        assert self._input is not None
        self.cache.computed(self._input)
        # The time since the last advance moved the latents ``_moved`` steps (more than
        # one when the step cache skipped some): the pace is per step.
        self.pipeline.note_step(self.priority, (now - self._last) / self._moved)
        self._last = now
        self._moved = 0
        delivered = None
        calls = len(self.sampler.timesteps)
        while True:
            if self.index == self._store_at:
                x0 = self.sampler.predict_x0(noise, self.index, self.latents)
                self.pipeline.states.put(self.state_key, x0)
            self.latents = self.sampler.step(noise, self.index, self.latents)
            self.index += 1
            self._moved += 1
            self.steps_used = min(self.index - self.begin, self.run_steps) + self.reused_steps
            if self.index == calls:
                return None, Tensors.of({"sample": self.latents})
            delivered = self._preview() if self.progress else delivered
            if not self.pipeline.config.step_cache.enabled:
                break
            # The step cache: a call whose input (the scaled latents, both guidance rows
            # alike) moved little since the last computed one reuses its guided noise and
            # steps the scheduler with it, as TeaCache does in diffusers (the
            # scheduler's multistep history takes the reused output). Never the last call.
            self._scaled = self.sampler.scale_input(self.latents, self.index)
            if not self.cache.may_skip(self._scaled, last=self.index == calls - 1):
                break
        return self.inputs(), delivered

    def _preview(self) -> Tensors:
        """The cheap preview of the latents now (a linear projection to RGB)."""
        rgb = np.einsum("chw,cr->hwr", self.latents[0], self.pipeline.preview_rgb)
        preview = np.round(np.clip((rgb + 1.0) / 2.0, 0, 1) * 255).astype(np.uint8)
        return Tensors.of(
            {
                "image": preview,
                "step": np.array([self.steps_used], dtype=np.int32),
                "steps": np.array([self.run_steps + self.reused_steps], dtype=np.int32),
            }
        )

    def close(self) -> None:
        self.closed = True
