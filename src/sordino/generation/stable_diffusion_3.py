"""An SD3 export served as a generator, equal to diffusers' ``StableDiffusion3Pipeline``.

:class:`StableDiffusion3` is :class:`~sordino.generation.stable_diffusion_xl.StableDiffusionXL`
(the loop, the scheduler, the decoder, batching of denoiser rows across requests, the
two CLIP encoders' penultimate hidden states and pooled ``text_embeds``) with SD3's
parts, each as diffusers computes it:

- three tokenizers and text encoders on the same text: the two CLIPs (77 tokens; the
  second pads with ``!``) and T5 (``tokenizer_3/tokenizer.json``, t5_tokens.py;
  ``max_sequence_length`` 256 tokens). The transformer's ``encoder_hidden_states`` are
  the CLIPs' penultimate hidden states concatenated on the feature axis, zero-padded
  to T5's width, then T5's ``last_hidden_state`` after them on the sequence axis:
  [rows, 77 + 256, D_T5]. Without a T5 encoder in the export (diffusers allows it),
  T5's rows are zeros of the transformer's ``joint_attention_dim``;
- ``pooled_projections``: both CLIPs' ``text_embeds`` concatenated [rows, P1 + P2];
- classifier-free guidance: the negative rows first, then the prompt's, one of each per
  image; the negative prompt is always encoded (``""`` when none: SD3 has no
  ``force_zeros_for_empty_prompt``);
- the loop: flow-matching Euler (``FlowMatchEulerDiscreteScheduler`` with its
  ``shift``; diffusers_schedulers.py), the initial latents ``N(0, 1)`` (or the request's
  ``latents``) with 16 channels; the transformer's ``timestep`` is ``sigma * 1000``,
  one per row;
- the image: the VAE decoder on ``latents / scaling_factor + shift_factor`` (SD3's 1.5305
  and 0.0609, from ``vae_decoder/config.json``);
- width and height are multiples of 8 x the transformer's ``patch_size`` (16 for SD3),
  as diffusers checks.

- image to image (``image``, ``strength``), as ``StableDiffusion3Img2ImgPipeline``:
  the encoded latents ``(x - shift_factor) * scaling_factor``, noised to the first
  call's sigma with the scheduler's ``scale_noise``; the run keeps
  ``steps - int(steps - steps x strength)`` calls (SD3's rounding, one more than SD's
  when ``steps x strength`` is not whole).

The defaults are diffusers': 28 steps, guidance 7.0 (models/diffusers_export.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from sordino.errors import InferenceFailed, ModelLoadError
from sordino.generation.pipeline import GenerateParams
from sordino.generation.sd_request import INPUTS, SDParams, export_json
from sordino.generation.stable_diffusion import StableDiffusion
from sordino.generation.stable_diffusion_xl import PooledGeneration, StableDiffusionXL, XLCondition
from sordino.generation.t5_tokens import T5Tokenizer
from sordino.inference import InferRequest

__all__ = ["SD3Generation", "StableDiffusion3"]

T5_LENGTH = 256
"""diffusers' ``max_sequence_length`` default for SD3's T5 tokens."""

# SD3's 16 latent channels as RGB for the cheap previews (the linear fit ComfyUI uses for
# SD3's latent space; its small bias is left out).
_PREVIEW_RGB_SD3 = np.array(
    [
        [-0.0922, -0.0175, 0.0749],
        [0.0311, 0.0633, 0.0954],
        [0.1994, 0.0927, 0.0458],
        [0.0856, 0.0339, 0.0902],
        [0.0587, 0.0272, -0.0496],
        [-0.0006, 0.1104, 0.0309],
        [0.0978, 0.0306, 0.0427],
        [-0.0042, 0.1038, 0.1358],
        [-0.0194, 0.0020, 0.0669],
        [-0.0488, 0.0130, -0.0268],
        [0.0922, 0.0988, 0.0951],
        [-0.0278, 0.0524, -0.0542],
        [0.0332, 0.0456, 0.0895],
        [-0.0069, -0.0030, -0.0810],
        [-0.0596, -0.0465, -0.0293],
        [-0.1448, -0.1463, -0.1189],
    ],
    dtype=np.float32,
)


class SD3Generation(PooledGeneration):
    """One SD3 request's loop: SD's, with ``pooled_projections`` in every transformer call."""

    def unet_conditioning(self) -> dict[str, npt.NDArray[np.float32]]:
        return {"encoder_hidden_states": self.embeddings, "pooled_projections": self.pooled}


class StableDiffusion3(StableDiffusionXL):
    """The generator of a served SD3 export: three text encoders, flow matching, a transformer."""

    generation_class = SD3Generation
    preview_rgb = _PREVIEW_RGB_SD3
    # SD3 has no micro-conditioning and its own prompt rules: SD's inputs, not SDXL's.
    inputs_taken = INPUTS
    fractional_strength = True  # StableDiffusion3Img2ImgPipeline.get_timesteps

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.metadata = replace(
            self.metadata,
            inputs=tuple(spec for spec in self.metadata.inputs if spec.name in INPUTS),
        )
        export = self.config.export
        assert export is not None
        name = self.key.name
        self.tokenizer_3: T5Tokenizer | None = None
        if self.config.text_encoder_3 is not None:
            try:
                self.tokenizer_3 = T5Tokenizer(export / "tokenizer_3", T5_LENGTH)
            except (OSError, ValueError, KeyError) as exc:
                raise ModelLoadError(
                    f"model {name!r}: cannot read its tokenizer_3: {exc}"
                ) from None
        transformer = export_json(export / "transformer" / "config.json")
        self.joint_attention_dim = int(transformer.get("joint_attention_dim", 4096))
        self.size_multiple = 8 * int(transformer.get("patch_size", 2))
        self.metadata.extra["size_multiple"] = str(self.size_multiple)
        vae = export_json(export / "vae_decoder" / "config.json")
        self.shift_factor = float(vae.get("shift_factor") or 0.0)
        self.metadata.extra["description"] = "SD3 export " + str(export)

    def parse(self, request: InferRequest) -> SDParams:  # type: ignore[override]
        return StableDiffusion.parse(self, request)  # not SDXL's: no second prompts, sizes

    def size_reason(self) -> str:
        return "8 x the transformer's patch size"

    async def condition(self, params: GenerateParams) -> XLCondition:  # type: ignore[override]
        """The three encoders' rows: [negative x N, prompt x N] (guided) or [prompt x N]."""
        assert isinstance(params, SDParams)
        assert self.config.text_encoder is not None and self.config.text_encoder_2 is not None
        texts = (
            [params.negative_prompt, params.prompt] if params.guidance > 1.0 else [params.prompt]
        )
        first, second, t5 = await asyncio.gather(
            self._encode(self.config.text_encoder, self.tokenizer(texts), pooled=True),
            self._encode(self.config.text_encoder_2, self.tokenizer_2(texts), pooled=True),
            self._encode_t5(texts),
        )
        clip = np.concatenate([first[0], second[0]], axis=-1)
        width = t5.shape[-1]
        if clip.shape[-1] > width:
            raise InferenceFailed(
                f"model {self.key.name!r}: its CLIP hidden states are {clip.shape[-1]} wide, "
                f"wider than T5's {width}; the export is not an SD3 pipeline"
            )
        clip = np.pad(clip, ((0, 0), (0, 0), (0, width - clip.shape[-1])))
        hidden = np.concatenate([clip, t5], axis=1)
        pooled = np.concatenate([first[1], second[1]], axis=-1)
        n = params.num_images
        return XLCondition(np.repeat(hidden, n, axis=0), np.repeat(pooled, n, axis=0))

    async def _encode_t5(self, texts: list[str]) -> npt.NDArray[np.float32]:
        """T5's ``last_hidden_state`` [len(texts), 256, D], or zeros without a T5 encoder."""
        if self.config.text_encoder_3 is None or self.tokenizer_3 is None:
            return np.zeros((len(texts), T5_LENGTH, self.joint_attention_dim), np.float32)
        ids = self.tokenizer_3(texts).astype(self.input_ids_dtype)
        with await self._run_model(self.config.text_encoder_3, {"input_ids": ids}) as encoded:
            return np.array(encoded["last_hidden_state"], dtype=np.float32)

    async def _encode_image(self, params: SDParams) -> npt.NDArray[np.float32]:
        """SD's latents of the image, shifted: ``(x - shift_factor) * scaling_factor``."""
        scaled = await super()._encode_image(params)
        shift = np.float32(self.shift_factor * self.scaling_factor)
        return np.asarray(scaled - shift, dtype=np.float32)

    async def _decode(self, sample: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
        # diffusers: latents / scaling_factor + shift_factor; the base divides by the factor.
        factor = np.float32(self.scaling_factor)
        shifted = (sample / factor + np.float32(self.shift_factor)) * factor
        return await super()._decode(np.asarray(shifted, dtype=np.float32))
