"""An iterative model served as a generator: prompt -> condition -> sampler loop -> image.

:class:`Pipeline` is made once per loaded iterative model. :meth:`Pipeline.parse`
checks a request (prompt, seed, steps, guidance; each mistake a 400 saying what to
fix); :meth:`Pipeline.run` answers it: from the exact-result cache, by joining an
identical generation in flight, or by submitting a :class:`Generation`
(``sampler_loop.py``) to the model's scheduler (with ``batching: request``, a cohort
at a time: ``cohort.py``). A generation is the scheduler's
:class:`~sordino.scheduling.work.Stepper`: every step is one work item in the engine
(requests at different timesteps share a batch, the timestep is a per-row input), and
between steps the generation moves its sample with the sampler (numpy,
``samplers.py``); with ``iterative.step_cache`` a step whose input barely moved reuses
the previous prediction instead of queueing a model call (``step_cache.py``). Its
state between steps — the sample, timestep and condition rows of its next step — is a
``Tensors`` in the shared-memory arena; a cancelled request lets go of it at the next
boundary.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sordino.config.iterative import IterativeConfig
from sordino.errors import InvalidRequest, ModelLoadError, QueueTimeout, Shed, TensorError
from sordino.generation.cohort import Cohort
from sordino.generation.degrade import StepDegrader
from sordino.generation.image import png_bytes, to_image
from sordino.generation.inputs import one_float, one_int, one_text
from sordino.generation.prompts import parse_digit_prompt
from sordino.generation.reuse import Generated, InFlight, ResultCache, ReusePolicy, StateCache
from sordino.generation.sampler_loop import Generation
from sordino.generation.samplers import Schedule
from sordino.generation.step_cache import StepCacheCounter
from sordino.inference import InferRequest, ModelKey, ModelMetadata, Tensor, TensorSpec
from sordino.memory.arena import Arena
from sordino.memory.refs import Tensors
from sordino.scheduling.scheduler import ModelScheduler

__all__ = ["GenerateParams", "Generation", "Pipeline", "Progress", "check_denoiser"]

RunModel = Callable[[str, Mapping[str, Tensor]], Awaitable[Tensors]]
"""Runs a loaded model (text encoder, decoder) once: name, inputs -> outputs."""


@dataclass(frozen=True, slots=True)
class GenerateParams:
    """A checked generation request."""

    prompt: str
    seed: int
    steps: int
    guidance: float
    tenant: str
    seeded: bool


@dataclass(frozen=True, slots=True)
class Progress:
    """One step done: a preview of the image so far."""

    step: int
    steps: int
    preview: npt.NDArray[np.uint8]


def check_denoiser(key: ModelKey, config: IterativeConfig, denoiser: ModelMetadata) -> None:
    """Raise :class:`ModelLoadError` unless ``denoiser`` has the inputs and the output its
    ``iterative`` configuration names."""
    for name in (config.sample_input, config.timestep_input, config.condition_input):
        if denoiser.input(name) is None:
            known = ", ".join(spec.name for spec in denoiser.inputs)
            raise ModelLoadError(
                f"model {key}: iterative needs the denoiser input {name!r}; the "
                f"model's inputs are {known} (set iterative.sample_input, timestep_input "
                "and condition_input)"
            )
    if denoiser.output(config.noise_output) is None:
        known = ", ".join(spec.name for spec in denoiser.outputs)
        raise ModelLoadError(
            f"model {key}: iterative.noise_output {config.noise_output!r} is not an "
            f"output of the model; its outputs are {known}"
        )


class Pipeline:
    """The generator of one loaded iterative model version."""

    def __init__(
        self,
        key: ModelKey,
        config: IterativeConfig,
        *,
        scheduler: ModelScheduler,
        arena: Callable[[], Arena | None],
        degrader: StepDegrader,
        run_model: RunModel,
        description: str = "",
        reuse_policy: ReusePolicy = "lru",
    ) -> None:
        """``reuse_policy`` (``memory.reuse_strategy``) orders what the result and state
        caches give back when full."""
        self.key = key
        self.config = config
        self.scheduler = scheduler
        self.arena = arena
        self.degrader = degrader
        self._run_model = run_model
        self.schedule = Schedule(train_timesteps=config.train_timesteps)
        self.results = ResultCache(config.reuse.cache_entries, reuse_policy)
        self.in_flight = InFlight()
        self.states = StateCache(config.reuse.approximate_entries, reuse_policy)
        self.step_cache = StepCacheCounter()
        self._cohort = Cohort(enabled=config.batching == "request")
        self._step_s: dict[int, float] = {}
        size = math.prod(config.sample_shape)
        side = math.isqrt(size)
        self.image_side = side * 4 if side * side == size else 0
        self.metadata = ModelMetadata(
            name=key.name,
            version=key.version,
            platform="sordino_iterative",
            inputs=(
                TensorSpec("prompt", "BYTES", (1,)),
                TensorSpec("seed", "INT64", (1,)),
                TensorSpec("steps", "INT32", (1,)),
                TensorSpec("guidance", "FP32", (1,)),
            ),
            outputs=(
                TensorSpec("image", "UINT8", (self.image_side, self.image_side)),
                TensorSpec("png", "BYTES", (1,)),
            ),
            batched=False,
            extra={
                "iterative": "true",
                "sampler": config.sampler,
                "steps_default": str(config.steps.default),
                "steps_max": str(config.steps.max),
                "guidance_default": str(config.guidance),
                "description": description,
            },
        )

    # -- the request ---------------------------------------------------------------

    def parse(self, request: InferRequest) -> GenerateParams:
        """Check a generation request; raise a 400 that says what to fix."""
        name = self.key.name
        unknown = sorted(set(request.inputs) - {"prompt", "seed", "steps", "guidance"})
        if unknown:
            raise TensorError(
                f"model {name!r} takes inputs prompt (BYTES), seed (INT64), steps (INT32) and "
                f"guidance (FP32); it has no input {unknown[0]!r}"
            )
        if "prompt" not in request.inputs:
            raise TensorError(
                f"model {name!r} needs the input 'prompt' (BYTES), e.g. 'a handwritten 7'"
            )
        prompt = one_text(request.inputs["prompt"])
        limit = self.config.max_prompt_length
        if len(prompt) > limit:
            raise InvalidRequest(
                f"the prompt is {len(prompt)} characters long, more than model {name!r} "
                f"accepts ({limit}, iterative.max_prompt_length); send a shorter prompt"
            )
        types = request.input_datatypes
        seed, seeded = secrets.randbits(31), False
        if "seed" in request.inputs:
            seed = one_int(request.inputs["seed"], "seed", types.get("seed"), 0, 2**63 - 1)
            seeded = True
        steps = self.config.steps.default
        if "steps" in request.inputs:
            steps = one_int(
                request.inputs["steps"], "steps", types.get("steps"), 1, self.config.steps.max
            )
        guidance = self.config.guidance
        if "guidance" in request.inputs:
            guidance = one_float(request.inputs["guidance"], "guidance", 0.0, 20.0)
        tenant = request.parameters.get("tenant") or request.headers.get("x-sordino-tenant")
        tenant = tenant if isinstance(tenant, str) and tenant else "default"
        if self.config.prompt == "digits":
            parse_digit_prompt(prompt)  # refuse an unreadable prompt before queueing
        return GenerateParams(prompt, seed, steps, guidance, tenant, seeded)

    async def prepare(self, params: GenerateParams) -> GenerateParams:
        """``params`` ready for :meth:`condition`, once per request before anything else
        (a subclass's own work, such as encoding an input image); here unchanged."""
        return params

    async def condition(self, params: GenerateParams) -> npt.NDArray[np.float32]:
        """The condition row for the prompt: the digit's one-hot, or the text encoder's output."""
        if self.config.prompt == "digits":
            onehot: npt.NDArray[np.float32] = np.zeros(10, dtype=np.float32)
            onehot[parse_digit_prompt(params.prompt)] = 1.0
            return onehot
        assert self.config.text_encoder is not None
        prompt = np.array([[params.prompt.encode("utf-8")]], dtype=object)
        with await self._run_model(self.config.text_encoder, {"prompt": prompt}) as encoded:
            return np.array(next(iter(encoded.values())), dtype=np.float32).reshape(-1)

    async def run(
        self,
        params: GenerateParams,
        *,
        priority: int,
        timeout_s: float | None,
        request_id: str | None,
        progress: bool,
    ) -> AsyncGenerator[Progress | tuple[Generated, str], None]:
        """Answer one request: progress (when asked) and then ``(result, how)``.

        ``how`` is ``cache`` (an exact earlier result), ``coalesced`` (an identical
        request in flight) or ``generated``.
        """
        params = await self.prepare(params)
        condition = await self.condition(params)
        key = self.result_key(params, condition)
        # Like the result cache, coalescing stays within a tenant: another tenant's
        # identical request neither waits on nor learns of this one.
        flight = (params.tenant, *key)
        if params.seeded:
            cached = self.results.get(params.tenant, key)
            if cached is not None:
                yield cached, "cache"
                return
            if self.config.reuse.coalesce:
                running = self.in_flight.join(flight)
                if running is not None:
                    shared = await asyncio.shield(running)
                    if not shared.degraded:
                        yield shared, "coalesced"
                        return
                    # The first one was degraded (its deadline, its priority): this
                    # request has its own and gets its own generation.
        lead = self.in_flight.lead(flight) if params.seeded and self.config.reuse.coalesce else None
        outcome: Any = asyncio.CancelledError()
        generating = self._generate(params, condition, priority, timeout_s, request_id, progress)
        try:
            async with aclosing(generating):
                async for item in generating:
                    if isinstance(item, Generated):
                        outcome = item
                        if params.seeded and not item.degraded and not item.reused_steps:
                            self.results.put(params.tenant, key, item)
                        yield item, "generated"
                        return
                    yield item
        except BaseException as exc:
            if not isinstance(outcome, Generated):
                outcome = exc if isinstance(exc, Exception) else asyncio.CancelledError()
            raise
        finally:
            if lead is not None:
                self.in_flight.settle(flight, lead, outcome)

    def result_key(
        self, params: GenerateParams, condition: npt.NDArray[np.float32]
    ) -> tuple[Any, ...]:
        """What two requests share when they get the same image (the reuse key)."""
        return (
            self.key.version,
            condition.tobytes(),
            params.seed,
            params.steps,
            params.guidance,
            self.config.sampler,
        )

    def generation(
        self,
        params: GenerateParams,
        condition: npt.NDArray[np.float32],
        *,
        priority: int,
        deadline: float | None,
        now: float,
        progress: bool,
    ) -> Generation:
        """The stepper of one request (a subclass may run another sampler loop)."""
        return Generation(
            self,
            params,
            condition,
            priority=priority,
            deadline=deadline,
            now=now,
            progress=progress,
        )

    async def _generate(
        self,
        params: GenerateParams,
        condition: npt.NDArray[np.float32],
        priority: int,
        timeout_s: float | None,
        request_id: str | None,
        progress: bool,
    ) -> AsyncGenerator[Progress | Generated, None]:
        arrival = self.scheduler.clock.now()
        await self._cohort.enter()
        try:
            now = self.scheduler.clock.now()
            if timeout_s:
                # Time spent waiting for the running cohort (request-level batching) counts.
                waited = now - arrival
                if waited >= timeout_s:
                    raise QueueTimeout(
                        f"request timed out after {waited * 1000:.0f} ms waiting for the "
                        f"generations of model {self.key} ahead of it; raise its timeout or "
                        "reduce load"
                    )
                timeout_s -= waited
            self._shed_if_hopeless(params, priority, timeout_s)
            generation = self.generation(
                params,
                condition,
                priority=priority,
                deadline=now + timeout_s if timeout_s else None,
                now=now,
                progress=progress,
            )
            first = generation.inputs()
            try:
                request = self.scheduler.submit(
                    first,
                    priority=priority,
                    timeout_s=timeout_s,
                    request_id=request_id,
                    stepper=generation,
                )
            except BaseException:
                first.release()
                raise
            final: npt.NDArray[np.float32] | None = None
            async for step in self.scheduler.responses(request):
                with step.outputs as outputs:
                    if step.final:
                        final = np.array(outputs["sample"], dtype=np.float32)
                    else:
                        yield Progress(
                            int(outputs["step"][0]),
                            int(outputs["steps"][0]),
                            np.array(outputs["image"], dtype=np.uint8),
                        )
            assert final is not None
        finally:
            self._cohort.leave()
        image = await self._decode(final)
        yield Generated(
            image=image,
            png=png_bytes(image[0] if image.ndim == 4 else image),
            pngs=tuple(png_bytes(one) for one in image) if image.ndim == 4 else (),
            steps_used=generation.steps_used,
            steps_requested=params.steps,
            seed=params.seed,
            degraded=generation.degraded,
            reused_steps=generation.reused_steps,
            cached_steps=generation.cache.skipped,
            sample=final,
        )

    async def _decode(self, sample: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
        values = sample
        if self.config.decoder is not None:
            with await self._run_model(self.config.decoder, {"sample": sample}) as decoded:
                values = np.array(next(iter(decoded.values())), dtype=np.float32)
        if values.size != math.prod(self.config.sample_shape) or not self.image_side:
            raise InvalidRequest(
                f"model {self.key.name!r}: the decoded sample has {values.size} values; "
                "an image needs a square number of them"
            )
        return to_image(values.reshape(-1), side=self.image_side // 4)

    def step_period(self, priority: int) -> float | None:
        """About how long one step of a generation at ``priority`` takes now (None: unknown).

        The larger of the recent time between two steps at that priority and the wait
        the queue predicts for a step queued now: the queue sees a backlog before any
        step of it completes.
        """
        recent = self._step_s.get(priority)
        queued = self.scheduler.expected_wait(priority)
        if recent is None:
            return queued
        return recent if queued is None else max(recent, queued)

    def note_step(self, priority: int, seconds: float) -> None:
        """Keep the recent time between two steps of a generation, per priority."""
        last = self._step_s.get(priority)
        self._step_s[priority] = seconds if last is None else 0.9 * last + 0.1 * seconds

    def _shed_if_hopeless(
        self, params: GenerateParams, priority: int, timeout: float | None
    ) -> None:
        """Refuse (503) a request that cannot finish in time even with the fewest steps.

        Its fewest steps are the degrade floor of its priority (all its steps without
        degradation, or for a protected priority, which is never refused here). At the
        pace recent steps of its priority took, a request that would miss its deadline
        anyway is answered now instead of occupying the queue for nothing; so under
        overload the queue keeps room for the requests that can still make it.
        """
        degrade = self.config.degrade
        if degrade.protect_priority and priority <= degrade.protect_priority:
            return
        # Every generation in flight holds one queued step: unprotected requests may fill
        # half the queue, so a full queue never refuses a protected (premium) one.
        limit = self.scheduler.settings.max_queue_size // 2
        if self.scheduler.queued >= limit:
            raise Shed(
                f"model {self.key} is overloaded: {self.scheduler.queued} generations are "
                f"in flight; the rest of the queue is kept for priority "
                f"{degrade.protect_priority} and higher. Retry later or raise the priority",
                retry_after_s=self.step_period(priority) or 1.0,
            )
        if not timeout:
            return
        step_s = self.step_period(priority)
        if step_s is None:
            return
        fewest = params.steps
        if degrade.enabled:
            fewest = min(params.steps, degrade.floors.get(priority, degrade.min_steps))
        expected = fewest * step_s
        if expected > timeout:
            raise Shed(
                f"model {self.key} is overloaded: even {fewest} steps take about "
                f"{expected * 1000:.0f} ms now, more than the request's {timeout * 1000:.0f} "
                "ms deadline; retry later, raise the deadline or the priority",
                retry_after_s=expected,
            )
