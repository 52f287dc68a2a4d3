"""The runtime's own sampler loop for one request: the scheduler's stepper.

A :class:`Generation` is made by :meth:`Pipeline.generation
<sordino.generation.pipeline.Pipeline.generation>` for one request of a built-in
iterative model. The scheduler queues its first step's rows (:meth:`Generation.inputs`),
and after each step calls :meth:`Generation.advance`, which moves the sample with the
sampler (numpy, ``samplers.py``), lets the degrader cut steps, skips steps the step
cache allows (``step_cache.py``), and returns the next step's rows or the final sample;
a generation whose deadline has passed raises
:class:`~sordino.errors.DeadlineExceeded` there instead (``degrade.py``).
Its state between steps — the sample rows of its next step — is a ``Tensors`` in the
shared-memory arena.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from sordino.errors import InferenceFailed
from sordino.generation.image import to_image
from sordino.generation.step_cache import StepCache
from sordino.memory.refs import Tensors, TensorsBuilder

if TYPE_CHECKING:
    from sordino.generation.pipeline import GenerateParams, Pipeline

__all__ = ["Generation"]


class Generation:
    """One request's sampler loop; the scheduler calls :meth:`advance` after each step."""

    def __init__(
        self,
        pipeline: Pipeline,
        params: GenerateParams,
        condition: npt.NDArray[np.float32],
        *,
        priority: int,
        deadline: float | None,
        now: float,
        progress: bool,
    ) -> None:
        self.pipeline = pipeline
        self.params = params
        self.priority = priority
        self.deadline = deadline
        self.progress = progress
        config = pipeline.config
        self.rows = 1 if params.guidance == 1.0 else 2
        self.condition = condition.astype(np.float32).reshape(1, -1)
        rng = np.random.default_rng(params.seed)
        shape = (1, *config.sample_shape)
        noise = rng.standard_normal(shape).astype(np.float32)
        self.plan = pipeline.schedule.plan(params.steps)
        self.reused_steps = 0
        self.state_key = (self.condition.tobytes(), params.guidance, config.sampler, params.steps)
        self._store_at: int | None = None
        sample = noise
        if config.reuse.approximate:
            skip = min(params.steps - 1, round(params.steps * config.reuse.approximate_skip))
            cached = pipeline.states.get(self.state_key) if skip > 0 else None
            if cached is not None:
                # Start from the cached clean estimate, re-noised to step ``skip`` with this
                # request's own noise: its steps before ``skip`` are not run.
                self.plan = self.plan[skip:]
                sample = pipeline.schedule.renoise(cached, noise, self.plan[:1])
                self.reused_steps = skip
                pipeline.states.steps_saved += skip
            elif skip > 0:
                self._store_at = skip - 1  # after this step, its clean estimate is kept
        self.sample = sample
        self.index = 0  # the position in ``plan`` of the step now queued or running
        self.degraded = False
        self.closed = False
        self._last = now
        # The pace of this priority's recent steps, until this request has its own.
        self._step_s: float | None = pipeline.step_period(priority)
        self.final_sample: npt.NDArray[np.float32] | None = None
        self.cache = StepCache(config.step_cache, pipeline.step_cache)
        self._moved = 1  # steps the last advance moved the sample

    @property
    def steps_used(self) -> int:
        """Steps this request's image took: those run plus those reused."""
        return self.index + self.reused_steps

    def inputs(self) -> Tensors:
        """The next step's rows (conditional, then unconditional).

        The sample rows — the generation's state — are placed in the shared-memory arena
        with :class:`TensorsBuilder` (one block a step; without an arena, or with no room
        now, on the heap); the timestep and condition rows are small per-step inputs on
        the heap. :meth:`Tensors.compose` joins them, so whoever holds the result holds
        the arena block, and the memory manager sees an ordinary ``Tensors``.
        """
        config = self.pipeline.config
        rows = self.rows
        state = TensorsBuilder(self.pipeline.arena())
        try:
            sample = state.empty(
                config.sample_input, np.dtype(np.float32), (rows, *self.sample.shape[1:])
            )
            sample[...] = self.sample
        except BaseException:
            state.abandon()
            raise
        timestep = np.full((rows, 1), self.plan[self.index], dtype=np.float32)
        condition = np.zeros((rows, self.condition.shape[1]), dtype=np.float32)
        condition[0] = self.condition[0]
        small = Tensors.of({config.timestep_input: timestep, config.condition_input: condition})
        with state.finish() as placed:
            return Tensors.compose(
                {
                    config.sample_input: (placed, config.sample_input),
                    config.timestep_input: (small, config.timestep_input),
                    config.condition_input: (small, config.condition_input),
                }
            )

    def advance(self, outputs: Tensors, now: float) -> tuple[Tensors | None, Tensors | None]:
        config = self.pipeline.config
        predicted = np.asarray(outputs[config.noise_output], dtype=np.float32)
        if predicted.shape[0] != self.rows:
            raise InferenceFailed(
                f"the denoiser of {self.pipeline.key} returned {predicted.shape[0]} rows for "
                f"a step of {self.rows}; its output {config.noise_output!r} must keep the batch"
            )
        noise = predicted[:1]
        if self.rows == 2:
            noise = predicted[1:2] + self.params.guidance * (predicted[:1] - predicted[1:2])
        # The time since the last advance moved the sample ``_moved`` steps (more than
        # one when the step cache skipped some): the pace is per step.
        elapsed = (now - self._last) / self._moved
        self._last = now
        self._step_s = elapsed if self._step_s is None else 0.7 * self._step_s + 0.3 * elapsed
        self.pipeline.note_step(self.priority, elapsed)
        queued = self.pipeline.scheduler.expected_wait(self.priority)
        step_s = self._step_s if queued is None else max(self._step_s, queued)
        self.cache.computed(self.sample)
        delivered: Tensors | None = None
        self._moved = 0
        while True:
            left, preview = self._move(noise, now, step_s)
            self._moved += 1
            delivered = preview if preview is not None else delivered
            if left == 0:
                self.final_sample = self.sample
                return None, Tensors.of({"sample": self.sample})
            # The step cache: this step may move the sample with the prediction just
            # used instead of queueing a model call (never the last step).
            if not self.cache.may_skip(self.sample, last=left == 1):
                break
        self._end_if_late(now, delivered)
        return self.inputs(), delivered

    def _end_if_late(self, now: float, delivered: Tensors | None) -> None:
        """At this step boundary, after degrade cut what it could: end the generation
        once its deadline passed (:meth:`StepDegrader.check_deadline
        <sordino.generation.degrade.StepDegrader.check_deadline>`); its state is
        released by the scheduler's failure path."""
        try:
            self.pipeline.degrader.check_deadline(
                done=self.steps_used,
                remaining=len(self.plan) - self.index,
                now=now,
                deadline=self.deadline,
            )
        except BaseException:
            if delivered is not None:
                delivered.release()
            raise

    def _move(
        self, noise: npt.NDArray[np.float32], now: float, step_s: float
    ) -> tuple[int, Tensors | None]:
        """Move the sample one step with ``noise``; return the steps left after it and a preview."""
        config = self.pipeline.config
        schedule = self.pipeline.schedule
        t = float(self.plan[self.index])
        if self._store_at is not None and self.index == self._store_at:
            x0 = schedule.predict_x0(self.sample, noise, np.array([t]))
            self.pipeline.states.put(self.state_key, x0)
        left = len(self.plan) - self.index - 1
        if left > 0:
            keep = self.pipeline.degrader.remaining(
                config.degrade,
                priority=self.priority,
                done=self.steps_used + 1,
                remaining=left,
                now=now,
                deadline=self.deadline,
                step_s=step_s,
            )
            if keep < left:
                tail = schedule.plan(keep, start=float(self.plan[self.index + 1]))
                self.plan = np.concatenate([self.plan[: self.index + 1], tail])
                self.pipeline.degrader.note(left - keep, first=not self.degraded)
                self.degraded = True
                left = keep
        t_next = float(self.plan[self.index + 1]) if left > 0 else -1.0
        delivered: Tensors | None = None
        if self.progress and left > 0:
            x0 = schedule.predict_x0(self.sample, noise, np.array([t]))[0]
            preview = to_image(x0, side=self.pipeline.image_side // 4)
            delivered = Tensors.of(
                {
                    "image": preview,
                    "step": np.array([self.steps_used + 1], dtype=np.int32),
                    "steps": np.array([len(self.plan) + self.reused_steps], dtype=np.int32),
                }
            )
        self.sample = schedule.step_one(config.sampler, self.sample, noise, t, t_next)
        self.index += 1
        return left, delivered

    def close(self) -> None:
        self.closed = True
