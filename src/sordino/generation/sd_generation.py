"""One Stable Diffusion request's denoising loop: :class:`SDGeneration`, the scheduler's stepper.

The pipeline (stable_diffusion.py) makes one per request once its text is encoded.
It plans the run (degrade applies before the first step, and again at every step
boundary where the scheduler's remaining calls can be re-spaced: diffusers_replan.py),
draws the initial latents (or starts part way: image to image's encoded image,
approximate reuse's cached clean estimate, each noised to the start), and between UNet
calls guides the noise, steps the export's scheduler (diffusers_sampler.py), keeps or
skips calls with the step cache and hands out the previews; a run whose deadline has
passed ends at the next step boundary with
:class:`~sordino.errors.DeadlineExceeded` (degrade.py). SDXL's and SD3's add their
own UNet conditioning
(:meth:`SDGeneration.unet_conditioning`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from sordino.errors import InferenceFailed
from sordino.generation.diffusers_replan import can_replan, replan
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
        # image is diffusers' own at that count. A running generation may be cut again
        # at a step boundary (:meth:`_cut`).
        steps = pipeline.planned_steps(params, priority=priority, now=now, deadline=deadline)
        self.degraded = steps < params.steps
        pipeline.degrader.note(params.steps - steps, first=True)
        self.deadline = deadline
        self._factor = pipeline.degrader.factor  # the step factor its plan took
        self._step_s: float | None = None  # this run's own pace, once it has one
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
        elapsed = (now - self._last) / self._moved
        self.pipeline.note_step(self.priority, elapsed)
        self._step_s = elapsed if self._step_s is None else 0.7 * self._step_s + 0.3 * elapsed
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
            calls = self._cut(now)
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
        self._end_if_late(now, calls)
        return self.inputs(), delivered

    def _end_if_late(self, now: float, calls: int) -> None:
        """At this step boundary, after :meth:`_cut`: end the generation once its
        deadline passed (:meth:`StepDegrader.check_deadline
        <sordino.generation.degrade.StepDegrader.check_deadline>`); the scheduler's
        failure path releases its state."""
        left = calls - self.index
        self.pipeline.degrader.check_deadline(
            done=self.run_steps - left + self.reused_steps,
            remaining=left,
            now=now,
            deadline=self.deadline,
        )

    def _cut(self, now: float) -> int:
        """Degrade at this step boundary: the remaining calls re-spaced to fewer steps when
        the deadline (at this run's pace, or the queue's wait when longer) or a step factor
        set since the run was planned asks for it; returns the run's calls now.

        Floors and protected priorities hold (:meth:`StepDegrader.remaining`); a
        scheduler that cannot be re-spaced part way (LCM; PNDM inside its warm-up)
        keeps its plan (diffusers_replan.py).
        """
        pipeline, sampler = self.pipeline, self.sampler
        calls = len(sampler.timesteps)
        if not pipeline.config.degrade.enabled or not can_replan(sampler, self.index):
            return calls
        degrader = pipeline.degrader
        factor = degrader.factor
        new_factor = factor is not None and factor != self._factor
        if self.deadline is None and not new_factor:
            return calls
        queued = pipeline.scheduler.expected_wait(self.priority)
        step_s = (
            self._step_s if queued is None or self._step_s is None else max(self._step_s, queued)
        )
        left = calls - self.index
        done = self.run_steps - left
        keep = degrader.remaining(
            pipeline.config.degrade,
            priority=self.priority,
            done=done + self.reused_steps,
            remaining=left,
            now=now,
            deadline=self.deadline,
            step_s=step_s,
            factor=new_factor,
        )
        self._factor = factor
        if keep >= left:
            return calls
        replan(sampler, self.index, keep)
        degrader.note(left - keep, first=not self.degraded)
        self.degraded = True
        self.run_steps = done + keep
        if self._store_at is not None and self._store_at >= self.index:
            self._store_at = None  # approximate reuse keeps only uncut runs' estimates
        return len(sampler.timesteps)

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
