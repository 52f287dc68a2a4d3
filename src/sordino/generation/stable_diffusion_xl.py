"""An SDXL export served as a generator, equal to diffusers' ``StableDiffusionXLPipeline``.

:class:`StableDiffusionXL` is :class:`~sordino.generation.stable_diffusion.StableDiffusion`
(the loop, the scheduler, the decoder, batching of UNet rows across requests) with
SDXL's conditioning, each part as diffusers computes it:

- two tokenizers (``tokenizer/``, ``tokenizer_2/``; the second pads with its own token)
  and two text encoders run on the same text; the text rows are the **penultimate**
  hidden states of both (``hidden_states.{L-1}`` of an optimum export, before the final
  layer norm), concatenated along the feature axis: [rows, 77, D1 + D2];
- the pooled embedding ``text_embeds`` of ``text_encoder_2`` is the UNet's input
  ``text_embeds`` [rows, P];
- ``prompt_2`` / ``negative_prompt_2`` (diffusers' names): the texts of the second
  tokenizer and encoder (the pooled embedding too), defaulting to ``prompt`` /
  ``negative_prompt``;
- micro-conditioning: the UNet's ``time_ids`` [rows, 6] are
  ``original_size + crops_coords_top_left + target_size`` (each two integers,
  ``(height, width)`` and ``(top, left)`` as diffusers takes them; the request's, else
  diffusers' defaults ``(height, width)``, ``(0, 0)``, ``(height, width)``), the same for
  the negative rows (diffusers' ``negative_*`` sizes default to these; not exposed);
- classifier-free guidance: the negative rows first, then the prompt's, one of each per
  image. Without a negative prompt (none, or ``""``) and with the export's
  ``force_zeros_for_empty_prompt`` (SDXL's default), the negative rows are zeros — text
  and pooled — as diffusers does when ``negative_prompt`` is None (a
  ``negative_prompt_2`` alone is then unused, as in diffusers); otherwise the negative
  prompt (``""`` too) is encoded;
- the image: the VAE decoder on ``latents / scaling_factor`` (SDXL's 0.13025, from the
  export's ``vae_decoder/config.json``; ``latents_mean``/``latents_std`` when the VAE
  has them);
- image to image (``image``, ``strength``), as ``StableDiffusionXLImg2ImgPipeline``
  with ``requires_aesthetics_score`` False (the base model's): SD's (sd_image.py), the
  encoded latents ``(x - latents_mean) * scaling_factor / latents_std`` when the VAE has
  them, the ``time_ids`` as text to image's at the image's size. The refiner's
  ``aesthetic_score`` and ``denoising_start``/``denoising_end`` are not inputs: answered
  "not supported" (generation/inputs.py's ``NOT_SUPPORTED``), as ``clip_skip`` is.

SDXL's VAE upcast note (``force_upcast``) is about fp16 torch: an fp32 ONNX VAE runs as
it is.

The default guidance of an SDXL export is diffusers' 5.0 (models/diffusers_export.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, fields, replace
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from sordino.errors import InferenceFailed, InvalidRequest, ModelLoadError, TensorError
from sordino.generation.clip_tokens import ClipTokenizer
from sordino.generation.pipeline import GenerateParams
from sordino.generation.sd_generation import SDGeneration
from sordino.generation.sd_request import INPUTS, MAX_SIDE, SDParams, export_json
from sordino.generation.stable_diffusion import StableDiffusion
from sordino.inference import InferRequest, TensorSpec

__all__ = ["PooledGeneration", "SDXLGeneration", "StableDiffusionXL", "XLCondition", "XLParams"]

XL_TEXTS = ("prompt_2", "negative_prompt_2")
XL_SIZES = ("original_size", "crops_coords_top_left", "target_size")

# SDXL's latent channels as RGB for the cheap previews (the linear fit ComfyUI uses for
# SDXL's latent space; its small bias is left out).
_PREVIEW_RGB_XL = np.array(
    [
        [0.3651, 0.4232, 0.4341],
        [-0.2533, -0.0042, 0.1068],
        [0.1076, 0.1111, -0.0362],
        [-0.3165, -0.2492, -0.2188],
    ],
    dtype=np.float32,
)


@dataclass(frozen=True, slots=True)
class XLParams(SDParams):
    """A checked SDXL request: SD's, with the second prompts and the micro-conditioning."""

    prompt_2: str = ""
    """The second encoder's text (the request's ``prompt_2``, else ``prompt``)."""
    negative_prompt_2: str = ""
    """The second encoder's negative text (``negative_prompt_2``, else ``negative_prompt``)."""
    time_ids: tuple[int, ...] = ()
    """``original_size + crops_coords_top_left + target_size``: six integers."""


@dataclass(frozen=True, slots=True)
class XLCondition:
    """The text conditioning of one SDXL request, rows as the UNet takes them."""

    hidden: npt.NDArray[np.float32]
    """``encoder_hidden_states`` [rows, 77, D1 + D2]: negative rows first when guided."""
    pooled: npt.NDArray[np.float32]
    """``text_embeds`` [rows, P], the same row order."""


class PooledGeneration(SDGeneration):
    """One request's loop whose UNet (or transformer) also takes pooled text rows
    (SDXL's and SD3's): SD's, on the :class:`XLCondition`'s hidden rows, with
    :attr:`pooled` kept for :meth:`unet_conditioning`."""

    def __init__(
        self,
        pipeline: StableDiffusion,
        params: SDParams,
        condition: XLCondition,
        *,
        priority: int,
        progress: bool,
        now: float,
        deadline: float | None = None,
    ) -> None:
        super().__init__(
            pipeline,
            params,
            condition.hidden,
            priority=priority,
            progress=progress,
            now=now,
            deadline=deadline,
        )
        self.pooled = condition.pooled


class SDXLGeneration(PooledGeneration):
    """One SDXL request's loop: SD's, with ``text_embeds`` and ``time_ids`` in every call."""

    @cached_property
    def time_ids(self) -> npt.NDArray[np.float32]:
        """``original_size + crops_coords_top_left + target_size`` (:attr:`XLParams.time_ids`,
        or the image's size, uncropped), one row per UNet row."""
        params = self.params
        size = (params.height, params.width)
        given = params.time_ids if isinstance(params, XLParams) else ()
        time_ids = np.array(given or (*size, 0, 0, *size), dtype=np.float32)
        return np.tile(time_ids, (len(self.pooled), 1))

    def unet_conditioning(self) -> dict[str, npt.NDArray[np.float32]]:
        return {
            "encoder_hidden_states": self.embeddings,
            "text_embeds": self.pooled,
            "time_ids": self.time_ids,
        }


class StableDiffusionXL(StableDiffusion):
    """The generator of a served SDXL export: two text encoders, micro-conditioning."""

    generation_class: ClassVar[type[SDGeneration]] = SDXLGeneration
    preview_rgb = _PREVIEW_RGB_XL
    inputs_taken: tuple[str, ...] = (*INPUTS, *XL_TEXTS, *XL_SIZES)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        export = self.config.export
        assert export is not None and self.config.text_encoder_2 is not None
        name = self.key.name
        try:
            self.tokenizer_2 = ClipTokenizer(export / "tokenizer_2")
        except (OSError, ValueError, KeyError) as exc:
            raise ModelLoadError(f"model {name!r}: cannot read its tokenizer_2: {exc}") from None
        index = export_json(export / "model_index.json")
        self.force_zeros_for_empty_prompt = bool(index.get("force_zeros_for_empty_prompt", True))
        vae = export_json(export / "vae_decoder" / "config.json")
        mean, std = vae.get("latents_mean"), vae.get("latents_std")
        self.latents_mean = self.latents_std = None
        if mean is not None and std is not None:
            shape = (1, self.latent_channels, 1, 1)
            self.latents_mean = np.asarray(mean, dtype=np.float32).reshape(shape)
            self.latents_std = np.asarray(std, dtype=np.float32).reshape(shape)
        self.metadata.extra["description"] = "SDXL export " + str(export)
        self.metadata = replace(
            self.metadata,
            inputs=(
                *self.metadata.inputs,
                *(TensorSpec(key, "BYTES", (1,)) for key in XL_TEXTS),
                *(TensorSpec(key, "INT32", (2,)) for key in XL_SIZES),
            ),
        )

    def parse(self, request: InferRequest) -> XLParams:
        """SD's checks, then ``prompt_2``, ``negative_prompt_2`` and the three sizes."""
        own = (*XL_TEXTS, *XL_SIZES)
        inputs = request.inputs
        rest = {key: value for key, value in inputs.items() if key not in own}
        base = super().parse(replace(request, inputs=rest))
        texts = {key: self._text(inputs[key], key) if key in inputs else None for key in XL_TEXTS}
        sizes: list[int] = []
        defaults = {
            "original_size": (base.height, base.width),
            "crops_coords_top_left": (0, 0),
            "target_size": (base.height, base.width),
        }
        for key in XL_SIZES:
            sizes.extend(_pair(inputs[key], key) if key in inputs else defaults[key])
        return XLParams(
            **{field.name: getattr(base, field.name) for field in fields(base)},
            prompt_2=texts["prompt_2"] or base.prompt,
            negative_prompt_2=texts["negative_prompt_2"] or base.negative_prompt,
            time_ids=tuple(sizes),
        )

    async def condition(self, params: GenerateParams) -> XLCondition:  # type: ignore[override]
        """Both encoders' rows: [negative x N, prompt x N] (guided) or [prompt x N]."""
        assert isinstance(params, XLParams)
        assert self.config.text_encoder is not None and self.config.text_encoder_2 is not None
        guided = params.guidance > 1.0
        zero_negative = guided and not params.negative_prompt and self.force_zeros_for_empty_prompt
        both = guided and not zero_negative
        texts = [params.negative_prompt, params.prompt] if both else [params.prompt]
        texts_2 = [params.negative_prompt_2, params.prompt_2] if both else [params.prompt_2]
        first, second = await asyncio.gather(
            self._encode(self.config.text_encoder, self.tokenizer(texts), pooled=False),
            self._encode(self.config.text_encoder_2, self.tokenizer_2(texts_2), pooled=True),
        )
        hidden = np.concatenate([first[0], second[0]], axis=-1)
        pooled = second[1]
        if zero_negative:
            hidden = np.concatenate([np.zeros_like(hidden), hidden])
            pooled = np.concatenate([np.zeros_like(pooled), pooled])
        n = params.num_images
        return XLCondition(np.repeat(hidden, n, axis=0), np.repeat(pooled, n, axis=0))

    async def _encode(
        self, model: str, ids: npt.NDArray[np.int64], *, pooled: bool
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """One encoder's penultimate hidden states and (``pooled``) its ``text_embeds``."""
        inputs = {"input_ids": ids.astype(self.input_ids_dtype)}
        with await self._run_model(model, inputs) as encoded:
            layers = [k for k in encoded if k.startswith("hidden_states.")]
            if len(layers) < 2 or (pooled and "text_embeds" not in encoded):
                raise InferenceFailed(
                    f"the text encoder {model!r} of {self.key} gave {', '.join(encoded.keys())}; "
                    "SDXL needs its hidden_states.0..L (and text_embeds from the second)"
                )
            last = max(int(k.rpartition(".")[2]) for k in layers)
            hidden = np.array(encoded[f"hidden_states.{last - 1}"], dtype=np.float32)
            embeds = np.array(encoded["text_embeds"], dtype=np.float32) if pooled else hidden[:0]
        return hidden, embeds

    def result_key(  # type: ignore[override]
        self, params: GenerateParams, condition: XLCondition
    ) -> tuple[Any, ...]:
        time_ids = params.time_ids if isinstance(params, XLParams) else ()
        return (
            *super().result_key(params, condition.hidden),
            condition.pooled.tobytes(),
            time_ids,
        )

    async def _encode_image(self, params: SDParams) -> npt.NDArray[np.float32]:
        """SD's latents of the image; with the VAE's ``latents_mean``/``latents_std``,
        ``(latents - mean) * scaling_factor / std`` as diffusers' SDXL img2img does."""
        scaled = await super()._encode_image(params)
        if self.latents_mean is None or self.latents_std is None:
            return scaled
        factor = np.float32(self.scaling_factor)
        shifted = (scaled / factor - self.latents_mean) * factor / self.latents_std
        return np.asarray(shifted, dtype=np.float32)

    async def _decode(self, sample: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
        if self.latents_mean is None or self.latents_std is None:
            return await super()._decode(sample)
        # diffusers: latents * std / scaling_factor + mean; the base divides by the factor.
        factor = np.float32(self.scaling_factor)
        shifted = (sample * self.latents_std / factor + self.latents_mean) * factor
        return await super()._decode(np.asarray(shifted, dtype=np.float32))


def _pair(array: Any, key: str) -> tuple[int, int]:
    """Two integers (``(height, width)`` or ``(top, left)``), each 0..MAX_SIDE."""
    values = np.asarray(array)
    if values.dtype.kind not in "iu" or values.size != 2:
        what = "top, left" if "crops" in key else "height, width"
        raise TensorError(
            f"input {key!r} takes two integers ({what}), got {values.size} of {values.dtype}"
        )
    pair = tuple(int(v) for v in values.reshape(-1))
    if not all(0 <= v <= 4 * MAX_SIDE for v in pair):
        raise InvalidRequest(f"{key} must be two integers between 0 and {4 * MAX_SIDE}, got {pair}")
    return pair[0], pair[1]
