"""Build a tiny random-weight Stable Diffusion 1.x or SDXL pipeline and export it to ONNX.

Run in a side virtual environment (never needed to serve; see docs/generation.md)::

    python -m venv /tmp/sd-side && /tmp/sd-side/bin/pip install torch==2.13.0 \
        diffusers==0.35.2 'transformers==4.57.1' optimum-onnx==0.1.0 onnx onnxruntime
    /tmp/sd-side/bin/python tools/make_tiny_sd_export.py OUT_DIR
    /tmp/sd-side/bin/python tools/make_tiny_sd_export.py --xl OUT_DIR   # SDXL

The pipeline has SD 1.x's architecture (``UNet2DConditionModel`` with cross-attention,
``AutoencoderKL`` with a latent factor of 8, ``CLIPTextModel``, a CLIP BPE tokenizer,
``PNDMScheduler`` configured as SD 1.5's) with tiny widths, seeded random weights, and is
exported the usual way (optimum's ``main_export``, task ``text-to-image``) into
``OUT_DIR`` — the folder ``optimum-cli export onnx`` writes. The torch pipeline is kept in
``OUT_DIR.torch`` (the references are made from it, tools/make_sd_references.py).

With ``--xl`` the pipeline is a ``StableDiffusionXLPipeline`` shaped as SDXL ships: two
text encoders (``CLIPTextModel`` and ``CLIPTextModelWithProjection``, of different widths
so a wrong concatenation cannot pass), two tokenizers (the second pads with ``!`` as
SDXL's does), a UNet with ``addition_embed_type="text_time"`` (micro-conditioning and the
pooled text embedding), SDXL's VAE scaling factor 0.13025 and its ``EulerDiscreteScheduler``
configuration.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from diffusers import (
    AutoencoderKL,
    EulerDiscreteScheduler,
    PNDMScheduler,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
)
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPTokenizer,
)

WORDS = [
    "a",
    "photo",
    "of",
    "an",
    "astronaut",
    "riding",
    "horse",
    "on",
    "the",
    "moon",
    "red",
    "blue",
    "green",
    "cat",
    "dog",
    "house",
    "tree",
    "painting",
    "portrait",
    "city",
    "night",
    "sky",
    "sea",
    "mountain",
    "poster",
    "flower",
]


def write_tokenizer_files(folder: Path) -> None:
    """A small CLIP vocabulary: bytes, their ``</w>`` forms, the words above, the specials."""
    folder.mkdir(parents=True, exist_ok=True)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789.,!?'-")
    vocab: dict[str, int] = {}
    for token in letters + [t + "</w>" for t in letters]:
        vocab.setdefault(token, len(vocab))
    merges: list[str] = []
    for word in WORDS:
        # Merge the word left to right: w o r d</w> -> wo r d</w> -> wor d</w> -> word</w>.
        pieces = [*word[:-1], word[-1] + "</w>"]
        while len(pieces) > 1:
            merge = f"{pieces[0]} {pieces[1]}"
            if merge not in merges:
                merges.append(merge)
            pieces = [pieces[0] + pieces[1], *pieces[2:]]
            vocab.setdefault(pieces[0], len(vocab))
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text(
        "#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8"
    )


def build(out: Path) -> Path:
    torch.manual_seed(0)
    work = out.parent / (out.name + ".torch")
    shutil.rmtree(work, ignore_errors=True)
    write_tokenizer_files(work / "vocab")
    tokenizer = CLIPTokenizer(
        str(work / "vocab" / "vocab.json"),
        str(work / "vocab" / "merges.txt"),
        pad_token="<|endoftext|>",
        model_max_length=77,
    )
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=77,
            projection_dim=32,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=4,
        norm_num_groups=8,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 16, 16),
        latent_channels=4,
        norm_num_groups=4,
        sample_size=64,
    )
    scheduler = PNDMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        num_train_timesteps=1000,
        set_alpha_to_one=False,
        skip_prk_steps=True,
        steps_offset=1,
    )
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(work)
    return work


def text_encoder_config(tokenizer: CLIPTokenizer, hidden: int, projection: int) -> CLIPTextConfig:
    return CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=37,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        projection_dim=projection,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_xl(out: Path) -> Path:
    """A tiny SDXL pipeline: encoders of width 32 and 48 (pooled 24), UNet with text_time."""
    torch.manual_seed(0)
    work = out.parent / (out.name + ".torch")
    shutil.rmtree(work, ignore_errors=True)
    write_tokenizer_files(work / "vocab")
    files = (str(work / "vocab" / "vocab.json"), str(work / "vocab" / "merges.txt"))
    tokenizer = CLIPTokenizer(*files, pad_token="<|endoftext|>", model_max_length=77)
    tokenizer_2 = CLIPTokenizer(*files, pad_token="!", model_max_length=77)  # as SDXL's
    text_encoder = CLIPTextModel(text_encoder_config(tokenizer, 32, 32))
    text_encoder_2 = CLIPTextModelWithProjection(text_encoder_config(tokenizer_2, 48, 24))
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(16, 32),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32 + 48,
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=6 * 8 + 24,
        transformer_layers_per_block=(1, 2),
        norm_num_groups=8,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 16, 16),
        latent_channels=4,
        norm_num_groups=4,
        sample_size=64,
        scaling_factor=0.13025,
        force_upcast=True,
    )
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        num_train_timesteps=1000,
        steps_offset=1,
        timestep_spacing="leading",
        interpolation_type="linear",
        prediction_type="epsilon",
        use_karras_sigmas=False,
    )
    pipe = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        unet=unet,
        scheduler=scheduler,
        force_zeros_for_empty_prompt=True,
        add_watermarker=False,
    )
    pipe.save_pretrained(work)
    return work


def export(work: Path, out: Path) -> None:
    from optimum.exporters.onnx import main_export

    shutil.rmtree(out, ignore_errors=True)
    main_export(str(work), output=str(out), task="text-to-image", opset=17, device="cpu")


def without_local_paths(out: Path) -> None:
    """Name the source pipeline by its folder name only: the export is the same anywhere."""
    for path in sorted(out.rglob("*.json")):
        text = path.read_text(encoding="utf-8")
        settings = json.loads(text)
        if isinstance(settings, dict) and "_name_or_path" in settings:
            settings["_name_or_path"] = Path(settings["_name_or_path"]).name
            path.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main() -> None:
    args = sys.argv[1:]
    xl = "--xl" in args
    args = [a for a in args if a != "--xl"]
    out = Path(args[0] if args else "tiny-sdxl-onnx" if xl else "tiny-sd-onnx").resolve()
    work = build_xl(out) if xl else build(out)
    export(work, out)
    without_local_paths(out)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"exported {out} ({size / 1e6:.2f} MB); the torch pipeline is in {work}")


if __name__ == "__main__":
    main()
