"""A Stable Diffusion 1.x/2.x export served as a generator, equal to diffusers' pipeline.

:class:`StableDiffusion` is the :class:`~sordino.generation.pipeline.Pipeline` of a
model made from a diffusers export (models/diffusers_export.py). It keeps the
generation machinery — every UNet call is one work item in the model's scheduler, so
the rows of requests at different steps share a UNet batch (rows of one latent shape
and prompt length together), the result cache, coalescing, request-level batching,
cancellation between steps and shedding — and replaces the parts that differ from the
built-in digits model, each as diffusers' ``StableDiffusionPipeline`` does it:

- the prompt: CLIP's tokenizer (clip_tokens.py), then the ``text_encoder`` model's
  ``last_hidden_state``; with classifier-free guidance (``guidance`` > 1) the negative
  prompt's (``""`` when none) rows come first, then the prompt's, one of each per image;
- the loop: the export's scheduler (diffusers_schedulers.py): initial latents
  ``N(0, 1) * init_noise_sigma`` (numpy's generator seeded with ``seed``, or the
  request's ``latents``), each call's input scaled by the scheduler, the guided noise
  ``uncond + guidance * (cond - uncond)`` stepped with it;
- the image: ``vae_decoder`` on ``latents / scaling_factor``, ``(x / 2 + 0.5)`` clipped
  to [0, 1], times 255 rounded: RGB [H, W, 3] (or [N, H, W, 3]) and PNGs;
- image to image (``image``, ``strength``; diffusers' ``StableDiffusionImg2ImgPipeline``,
  where the export has a VAE encoder): the image encoded (sd_image.py) before the loop,
  the loop started at the scheduler's ``t_start`` with the encoded latents noised to it.

Degrade-instead-of-drop applies before the first step (:meth:`StableDiffusion.planned_steps`:
the run is planned with the fewer steps, so its image is diffusers' at that count) and
again at every step boundary of a running generation (sd_generation.py: its remaining
calls re-spaced from the current timestep, diffusers_replan.py; not for LCM).
Step caching (``iterative.step_cache``) measures the scaled UNet input of the request
(both guidance rows alike) and steps the scheduler with the last guided noise on a
skipped call. Approximate reuse (``reuse.approximate``) starts a text-to-image
request part way, as image to image does, from the clean estimate an earlier request
of the same prompt reached there, re-noised with its own noise.
The request's checked inputs are sd_request.py's :class:`SDParams`; one request's loop
is sd_generation.py's :class:`SDGeneration`. SDXL and SD3 are subclasses:
generation/stable_diffusion_xl.py, stable_diffusion_3.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from sordino.errors import InvalidRequest, ModelLoadError, TensorError
from sordino.generation.clip_tokens import ClipTokenizer
from sordino.generation.diffusers_schedulers import (
    SchedulerSpec,
    image_steps,
    scheduler_from_config,
)
from sordino.generation.inputs import NOT_SUPPORTED, one_float, one_int, refuse_unknown
from sordino.generation.pipeline import GenerateParams, Pipeline
from sordino.generation.sd_generation import SDGeneration
from sordino.generation.sd_image import pixels_to_sample, read_image, sample_latents
from sordino.generation.sd_request import (
    INPUTS,
    MAX_IMAGES,
    MAX_SIDE,
    SDParams,
    export_json,
    nearest_multiple,
    size_multiple,
)
from sordino.inference import InferRequest, ModelMetadata, Tensor, TensorSpec

# INPUTS, MAX_SIDE, SDParams (sd_request.py) and SDGeneration (sd_generation.py) are
# importable from here too, where SDXL's and SD3's modules and the tests take them.
__all__ = ["INPUTS", "MAX_IMAGES", "MAX_SIDE", "SDGeneration", "SDParams", "StableDiffusion"]

# SD 1.x's latent channels as RGB (a linear fit, the usual cheap preview of a latent).
_PREVIEW_RGB = np.array(
    [
        [0.298, 0.207, 0.208],
        [0.187, 0.286, 0.173],
        [-0.158, 0.189, 0.264],
        [-0.184, -0.271, -0.473],
    ],
    dtype=np.float32,
)


class StableDiffusion(Pipeline):
    """The generator of a served Stable Diffusion export (the UNet is the scheduled model)."""

    generation_class: ClassVar[type[SDGeneration]] = SDGeneration
    """The stepper of one request (SDXL's and SD3's add their UNet conditioning)."""

    preview_rgb = _PREVIEW_RGB
    """The latent channels as RGB for the cheap previews (a subclass's latent space differs)."""

    inputs_taken: tuple[str, ...] = INPUTS
    """The inputs a request may carry (a subclass adds its own)."""

    fractional_strength = False
    """Image to image's step count: ``int(steps x strength)`` (False) or SD3's rounding
    (True; diffusers_sampler.image_steps)."""

    def __init__(
        self,
        *args: Any,
        input_ids_dtype: str = "INT64",
        timestep_dtype: str = "FP32",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        export = self.config.export
        assert export is not None
        name = self.key.name
        try:
            self.tokenizer = ClipTokenizer(export / "tokenizer")
        except (OSError, ValueError, KeyError) as exc:
            raise ModelLoadError(f"model {name!r}: cannot read its tokenizer: {exc}") from None
        scheduler = json.loads(
            (export / "scheduler" / "scheduler_config.json").read_text(encoding="utf-8")
        )
        if self.config.scheduler:
            scheduler["_class_name"] = self.config.scheduler
        scheduler.update(self.config.scheduler_options)
        try:
            self.spec: SchedulerSpec = scheduler_from_config(scheduler)
        except ValueError as exc:
            raise ModelLoadError(f"model {name!r}: {exc}") from None
        self.scaling_factor = float(
            export_json(export / "vae_decoder" / "config.json").get("scaling_factor", 0.18215)
        )
        self.latent_channels, side = self.config.sample_shape[0], self.config.sample_shape[-1]
        self.default_side = side * 8
        self.size_multiple = size_multiple(export)
        self.input_ids_dtype = np.int32 if input_ids_dtype == "INT32" else np.int64
        self.timestep_dtype = {"INT64": np.int64, "INT32": np.int32, "FP16": np.float16}.get(
            timestep_dtype, np.float32
        )
        self.metadata = ModelMetadata(
            name=self.key.name,
            version=self.key.version,
            platform="sordino_stable_diffusion",
            inputs=(
                TensorSpec("prompt", "BYTES", (1,)),
                TensorSpec("negative_prompt", "BYTES", (1,)),
                TensorSpec("seed", "INT64", (1,)),
                TensorSpec("steps", "INT32", (1,)),
                TensorSpec("guidance", "FP32", (1,)),
                TensorSpec("width", "INT32", (1,)),
                TensorSpec("height", "INT32", (1,)),
                TensorSpec("num_images", "INT32", (1,)),
                TensorSpec("latents", "FP32", (-1, self.latent_channels, -1, -1)),
                TensorSpec("image", "BYTES", (1,)),
                TensorSpec("strength", "FP32", (1,)),
            ),
            outputs=(TensorSpec("image", "UINT8", (-1, -1, 3)), TensorSpec("png", "BYTES", (-1,))),
            batched=False,
            extra={
                "iterative": "true",
                "sampler": self.spec.kind,
                "steps_default": str(self.config.steps.default),
                "steps_max": str(self.config.steps.max),
                "guidance_default": str(self.config.guidance),
                "width_default": str(self.default_side),
                "height_default": str(self.default_side),
                "size_multiple": str(self.size_multiple),
                "image_to_image": str(self.config.image_encoder is not None).lower(),
                "description": "Stable Diffusion export " + str(export),
            },
            refused={k: v for k, v in NOT_SUPPORTED.items() if k not in self.inputs_taken},
        )

    # -- the request ---------------------------------------------------------------

    def parse(self, request: InferRequest) -> SDParams:
        """Check a text-to-image request; raise a 400 that says what to fix."""
        name = self.key.name
        inputs = request.inputs
        refuse_unknown(name, set(inputs) - set(self.inputs_taken), self.inputs_taken)
        if "prompt" not in inputs:
            raise TensorError(
                f"model {name!r} needs the input 'prompt' (BYTES), e.g. 'a red house'"
            )
        prompt = self._text(inputs["prompt"], "prompt")
        negative = (
            self._text(inputs["negative_prompt"], "negative_prompt")
            if "negative_prompt" in inputs
            else ""
        )
        types = request.input_datatypes

        def integer(key: str, default: int, low: int, high: int) -> int:
            if key not in inputs:
                return default
            return one_int(inputs[key], key, types.get(key), low, high)

        seeded = "seed" in inputs or "latents" in inputs
        seed = integer("seed", secrets.randbits(31), 0, 2**63 - 1)
        steps = integer("steps", self.config.steps.default, 1, self.config.steps.max)
        guidance = self.config.guidance
        if "guidance" in inputs:
            guidance = one_float(inputs["guidance"], "guidance", 0.0, 20.0)
        given_width = integer("width", 0, 8, MAX_SIDE) if "width" in inputs else None
        given_height = integer("height", 0, 8, MAX_SIDE) if "height" in inputs else None
        image, strength = self._image_input(inputs, given_width, given_height, steps)
        image_height, image_width = image.shape[:2] if image is not None else (0, 0)
        width = given_width or image_width or self.default_side
        height = given_height or image_height or self.default_side
        multiple = self.size_multiple
        if width % multiple or height % multiple:
            raise InvalidRequest(
                f"width and height must be multiples of {multiple} for model {name!r} "
                f"({self.size_reason()}), got {width}x{height}: e.g. "
                f"{nearest_multiple(width, multiple)}x{nearest_multiple(height, multiple)}"
            )
        num_images = integer("num_images", 1, 1, MAX_IMAGES)
        latents = None
        if "latents" in inputs:
            latents = np.asarray(inputs["latents"], dtype=np.float32)
            wanted = (num_images, self.latent_channels, height // 8, width // 8)
            if latents.size == math.prod(wanted):
                # Row-major values of the right count: generate JSON sends them flat.
                latents = latents.reshape(wanted)
            if latents.shape != wanted or not np.isfinite(latents).all():
                raise InvalidRequest(
                    f"latents must be finite FP32 of shape {list(wanted)} (num_images, "
                    f"channels, height/8, width/8), got {list(latents.shape)}"
                )
            latents = latents.copy()
        tenant = request.parameters.get("tenant") or request.headers.get("x-sordino-tenant")
        tenant = tenant if isinstance(tenant, str) and tenant else "default"
        return SDParams(
            prompt,
            seed,
            steps,
            guidance,
            tenant,
            seeded,
            negative,
            width,
            height,
            num_images,
            latents,
            image,
            strength,
        )

    def _image_input(
        self, inputs: Mapping[str, Tensor], width: int | None, height: int | None, steps: int
    ) -> tuple[npt.NDArray[np.uint8] | None, float]:
        """Image to image's ``image`` and ``strength`` (1.0 without an image), checked."""
        name = self.key.name
        try:
            sampler = self.spec.start(steps)
        except ValueError as exc:
            raise InvalidRequest(f"model {name!r}: {exc}") from None
        if "image" not in inputs:
            if "strength" in inputs:
                raise InvalidRequest(
                    "strength applies to image to image: send an image too, or leave strength out"
                )
            return None, 1.0
        if self.config.image_encoder is None:
            raise InvalidRequest(
                f"model {name!r} cannot do image to image: its export has no VAE encoder "
                "(vae_encoder/model.onnx); leave image out, or export the pipeline again with "
                "`optimum-cli export onnx --task text-to-image`, which writes one"
            )
        strength = 0.8  # diffusers' default
        if "strength" in inputs:
            strength = one_float(inputs["strength"], "strength", 0.0, 1.0)
        try:
            sampler.image_start(strength, fractional=self.fractional_strength)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        image = read_image(
            inputs["image"],
            width=width,
            height=height,
            max_side=MAX_SIDE,
            multiple=self.size_multiple,
        )
        return image, strength

    async def prepare(self, params: GenerateParams) -> GenerateParams:
        """Image to image encodes the image first (once per request)."""
        if isinstance(params, SDParams) and params.image is not None and params.encoded is None:
            return replace(params, encoded=await self._encode_image(params))
        return params

    async def _encode_image(self, params: SDParams) -> npt.NDArray[np.float32]:
        """The scaled latents of the request's image: [1, C, H/8, W/8]."""
        assert params.image is not None and self.config.image_encoder is not None
        sample = pixels_to_sample(params.image)
        with await self._run_model(self.config.image_encoder, {"sample": sample}) as encoded:
            values = encoded.get("latent_parameters")
            if values is None:
                values = next(iter(encoded.values()))
            parameters = np.array(values, dtype=np.float32)
        if parameters.shape[1] == self.latent_channels:  # an encoder that gives the latent
            return np.asarray(parameters * np.float32(self.scaling_factor), dtype=np.float32)
        return sample_latents(parameters, params.seed, self.scaling_factor)

    def _text(self, array: Tensor, key: str) -> str:
        values = np.asarray(array).reshape(-1)
        if values.size != 1:
            raise TensorError(f"input {key!r} takes one text, got {values.size}")
        value = values[0]
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                raise TensorError(f"input {key!r} is not valid UTF-8 text") from None
        if not isinstance(value, str):
            raise TensorError(f"input {key!r} must be text (BYTES)")
        if len(value) > self.config.max_prompt_length:
            raise InvalidRequest(
                f"the {key} is {len(value)} characters long, more than model {self.key.name!r} "
                f"accepts ({self.config.max_prompt_length}, iterative.max_prompt_length)"
            )
        return value

    async def condition(self, params: GenerateParams) -> npt.NDArray[np.float32]:
        """The text rows of every UNet call: [negative x N, prompt x N] (guided) or [prompt x N]."""
        assert isinstance(params, SDParams) and self.config.text_encoder is not None
        texts = (
            [params.negative_prompt, params.prompt] if params.guidance > 1.0 else [params.prompt]
        )
        ids = self.tokenizer(texts).astype(self.input_ids_dtype)
        with await self._run_model(self.config.text_encoder, {"input_ids": ids}) as encoded:
            hidden = np.array(encoded["last_hidden_state"], dtype=np.float32)
        return np.repeat(hidden, params.num_images, axis=0)

    def result_key(
        self, params: GenerateParams, condition: npt.NDArray[np.float32]
    ) -> tuple[Any, ...]:
        assert isinstance(params, SDParams)
        latents = b"" if params.latents is None else params.latents.tobytes()
        extra: tuple[Any, ...] = (
            params.width,
            params.height,
            params.num_images,
            latents,
            self.spec.kind,
        )
        if params.image is not None:
            digest = hashlib.sha256(params.image.tobytes()).digest()
            extra = (*extra, digest, params.strength)
        return (*super().result_key(params, condition), *extra)

    def generation(  # type: ignore[override]
        self,
        params: GenerateParams,
        condition: Any,
        *,
        priority: int,
        deadline: float | None,
        now: float,
        progress: bool,
    ) -> SDGeneration:
        """The stepper of one request: :attr:`generation_class` on its checked ``params``
        and the conditioning :meth:`condition` gave (a subclass's own kind)."""
        assert isinstance(params, SDParams)
        return self.generation_class(
            self,
            params,
            condition,
            priority=priority,
            progress=progress,
            now=now,
            deadline=deadline,
        )

    def planned_steps(
        self, params: GenerateParams, *, priority: int, now: float, deadline: float | None
    ) -> int:
        """The steps a request runs: ``params.steps``, fewer when degrade applies now.

        Decided before the first step (``iterative.degrade``: the guardian's step
        factor, the request's deadline at the recent pace of its priority, never below
        its priority's floor, never for a protected priority), so a run cut here is
        diffusers' own run at the fewer steps. A running generation may be cut again at
        a step boundary (:meth:`SDGeneration._cut
        <sordino.generation.sd_generation.SDGeneration._cut>`).
        """
        steps = self.degrader.remaining(
            self.config.degrade,
            priority=priority,
            done=0,
            remaining=params.steps,
            now=now,
            deadline=deadline,
            step_s=self.step_period(priority),
        )
        if isinstance(params, SDParams) and params.image is not None:
            # Image to image runs about steps x strength of them: keep at least one.
            fractional = self.fractional_strength
            while (
                steps < params.steps
                and image_steps(steps, params.strength, fractional=fractional) < 1
            ):
                steps += 1
        return steps

    async def _decode(self, sample: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
        """The images of the final latents: [H, W, 3] for one, [N, H, W, 3] for several."""
        assert self.config.decoder is not None
        latent = np.asarray(sample / np.float32(self.scaling_factor), dtype=np.float32)
        with await self._run_model(self.config.decoder, {"latent_sample": latent}) as decoded:
            values = np.array(decoded["sample"], dtype=np.float32)
        pixels = np.clip(values / 2 + 0.5, 0.0, 1.0).transpose(0, 2, 3, 1)
        images = np.round(pixels * 255.0).astype(np.uint8)
        return images[0] if len(images) == 1 else images

    def size_reason(self) -> str:
        """Why image sides must be multiples of :attr:`size_multiple` (for the 400)."""
        halvings = self.size_multiple.bit_length() - 4
        return f"its UNet halves the latents {halvings} times; other sizes fail inside it"
