"""Build a tiny random-weight Stable Diffusion 1.x, SDXL or SD3 pipeline and export it to ONNX.

Run in a side virtual environment (never needed to serve; see docs/generation.md)::

    python -m venv /tmp/sd-side && /tmp/sd-side/bin/pip install torch==2.13.0 \
        diffusers==0.35.2 'transformers==4.57.1' optimum-onnx==0.1.0 onnx onnxruntime
    /tmp/sd-side/bin/python tools/make_tiny_sd_export.py OUT_DIR
    /tmp/sd-side/bin/python tools/make_tiny_sd_export.py --xl OUT_DIR   # SDXL
    /tmp/sd-side/bin/python tools/make_tiny_sd_export.py --sd3 OUT_DIR  # SD3
    /tmp/sd-side/bin/python tools/make_tiny_sd_export.py --mid OUT_DIR  # mid-size SD 1.5

The pipeline has SD 1.x's architecture (``UNet2DConditionModel`` with cross-attention,
``AutoencoderKL`` with a latent factor of 8, ``CLIPTextModel``, a CLIP BPE tokenizer,
``PNDMScheduler`` configured as SD 1.5's) with tiny widths, seeded random weights, and is
exported the usual way (optimum's ``main_export``, task ``text-to-image``) into
``OUT_DIR`` — the folder ``optimum-cli export onnx`` writes. The torch pipeline is kept in
``OUT_DIR.torch`` (the references are made from it, tools/make_sd_references.py).

With ``--mid`` the SD 1.x pipeline is mid-size, for bench/bench_sd_export.py (which builds
it into its cache with ``--mid``; about 45 MB, never committed): SD 1.5's block layout —
three cross-attention down blocks and a plain one, two layers per block, a four-block
VAE with two layers per block — at a tenth of SD 1.5's UNet widths (32, 64, 128, 128),
a 128-wide 4-layer text encoder; about 9 M UNet parameters. One UNet call on a 64×64
image (8×8 latents) with classifier-free guidance (batch 2) takes tens of milliseconds on
one core of the project's 2-core machine (58 ms with one ONNX Runtime thread at a load
average of 10). Seeded like the others: a rebuild gives the same weights.

With ``--xl`` the pipeline is a ``StableDiffusionXLPipeline`` shaped as SDXL ships: two
text encoders (``CLIPTextModel`` and ``CLIPTextModelWithProjection``, of different widths
so a wrong concatenation cannot pass), two tokenizers (the second pads with ``!`` as
SDXL's does), a UNet with ``addition_embed_type="text_time"`` (micro-conditioning and the
pooled text embedding), SDXL's VAE scaling factor 0.13025 and its ``EulerDiscreteScheduler``
configuration.

With ``--sd3`` the pipeline is a ``StableDiffusion3Pipeline`` shaped as SD3 ships: two
``CLIPTextModelWithProjection`` encoders (widths 32 and 48, projections 24 and 40: the
pooled projection is their concatenation, 64) and a ``T5EncoderModel`` (width 96, wider
than the two CLIPs together, so the padding of the CLIP rows is exercised), three
tokenizers (the T5 one a ``T5TokenizerFast`` built here as a ``tokenizers`` Unigram
model, saved as ``tokenizer.json`` only: no sentencepiece needed), an
``SD3Transformer2DModel`` (patch size 2, 16 latent channels), SD3's VAE settings (16
latent channels, scaling factor 1.5305, shift factor 0.0609, no quant convs) and its
``FlowMatchEulerDiscreteScheduler`` with ``shift=3.0``. optimum-onnx 0.1.0 exports it as
it ships: ``transformer/model.onnx`` (``hidden_states``, ``timestep`` per row,
``encoder_hidden_states``, ``pooled_projections`` -> ``out_hidden_states``) and
``text_encoder_3/model.onnx`` (``input_ids`` -> ``last_hidden_state``).
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
    FlowMatchEulerDiscreteScheduler,
    PNDMScheduler,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
)
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPTokenizer,
    T5Config,
    T5EncoderModel,
    T5TokenizerFast,
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


def _seeded_work(out: Path) -> tuple[Path, CLIPTokenizer]:
    """Torch seeded, the torch pipeline's folder beside ``out`` emptied, its tokenizer."""
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
    return work, tokenizer


def _save_sd15(
    work: Path,
    vae: AutoencoderKL,
    text_encoder: CLIPTextModel,
    tokenizer: CLIPTokenizer,
    unet: UNet2DConditionModel,
) -> Path:
    """The parts as SD 1.5's pipeline (its PNDM scheduler, no safety checker), saved."""
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


def build(out: Path, *, mid: bool = False) -> Path:
    """SD 1.x's pipeline with tiny widths, or with ``mid`` the mid-size one of ``MID``."""
    if mid:
        return build_mid(out)
    work, tokenizer = _seeded_work(out)
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
    return _save_sd15(work, vae, text_encoder, tokenizer, unet)


def build_mid(out: Path) -> Path:
    """The mid-size SD 1.5-shaped pipeline of bench/bench_sd_export.py (see ``--mid``).

    SD 1.5's block layout (three cross-attention down blocks and a plain one, two layers
    per block, ``attention_head_dim`` 8, 32 norm groups, a four-block VAE with two layers
    per block) at a tenth of its UNet widths and with a 128-wide, 4-layer CLIP text
    encoder: about 9 M UNet parameters, one UNet call on a 64×64 image (8×8 latents) with
    classifier-free guidance (batch 2) takes tens of milliseconds on a 2-core CPU.
    """
    work, tokenizer = _seeded_work(out)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=128,
            intermediate_size=512,
            num_hidden_layers=4,
            num_attention_heads=4,
            max_position_embeddings=77,
            projection_dim=128,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    unet = UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=2,
        block_out_channels=(32, 64, 128, 128),
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        cross_attention_dim=128,
        attention_head_dim=8,
        norm_num_groups=32,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(16, 32, 64, 64),
        layers_per_block=2,
        latent_channels=4,
        norm_num_groups=16,
        sample_size=64,
    )
    return _save_sd15(work, vae, text_encoder, tokenizer, unet)


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


def t5_tokenizer() -> T5TokenizerFast:
    """A small T5 tokenizer as T5's ``tokenizer.json`` is: Unigram over ``▁``-words, ``</s>``."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import Unigram

    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789.,!?'-")
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    pieces += [("▁" + w, -1.0 - i / 100) for i, w in enumerate(WORDS)]
    pieces += [(c, -5.0) for c in letters] + [("▁" + c, -6.0) for c in letters]
    model = Tokenizer(Unigram(pieces, unk_id=2, byte_fallback=False))
    model.normalizer = normalizers.Sequence(
        [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Lowercase()]
    )
    model.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    model.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    model.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    return T5TokenizerFast(
        tokenizer_object=model,
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        extra_ids=0,
        model_max_length=512,
    )


def build_sd3(out: Path) -> Path:
    """A tiny SD3 pipeline: CLIPs of width 32 and 48 (pooled 24 + 40), T5 of width 96."""
    torch.manual_seed(0)
    work = out.parent / (out.name + ".torch")
    shutil.rmtree(work, ignore_errors=True)
    write_tokenizer_files(work / "vocab")
    files = (str(work / "vocab" / "vocab.json"), str(work / "vocab" / "merges.txt"))
    tokenizer = CLIPTokenizer(*files, pad_token="<|endoftext|>", model_max_length=77)
    tokenizer_2 = CLIPTokenizer(*files, pad_token="!", model_max_length=77)  # as SD3's
    tokenizer_3 = t5_tokenizer()
    text_encoder = CLIPTextModelWithProjection(text_encoder_config(tokenizer, 32, 24))
    text_encoder_2 = CLIPTextModelWithProjection(text_encoder_config(tokenizer_2, 48, 40))
    text_encoder_3 = T5EncoderModel(
        T5Config(
            vocab_size=len(tokenizer_3),
            d_model=96,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            pad_token_id=tokenizer_3.pad_token_id,
            eos_token_id=tokenizer_3.eos_token_id,
            decoder_start_token_id=tokenizer_3.pad_token_id,
        )
    )
    transformer = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=16,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        joint_attention_dim=96,
        caption_projection_dim=32,
        pooled_projection_dim=24 + 40,
        out_channels=16,
        pos_embed_max_size=16,
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 16, 16),
        latent_channels=16,
        norm_num_groups=4,
        sample_size=64,
        scaling_factor=1.5305,
        shift_factor=0.0609,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        text_encoder_3=text_encoder_3,
        tokenizer_3=tokenizer_3,
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
    xl, sd3, mid = "--xl" in args, "--sd3" in args, "--mid" in args
    args = [a for a in args if a not in ("--xl", "--sd3", "--mid")]
    default = (
        "tiny-sd3-onnx"
        if sd3
        else "tiny-sdxl-onnx"
        if xl
        else "mid-sd-onnx"
        if mid
        else "tiny-sd-onnx"
    )
    out = Path(args[0] if args else default).resolve()
    work = build_sd3(out) if sd3 else build_xl(out) if xl else build(out, mid=mid)
    export(work, out)
    without_local_paths(out)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"exported {out} ({size / 1e6:.2f} MB); the torch pipeline is in {work}")


if __name__ == "__main__":
    main()
