"""A Stable Diffusion 1.x/2.x or SDXL ONNX export (``optimum-cli export onnx``) as model sources.

The folder such an export writes::

    DIR/model_index.json            _class_name: StableDiffusionPipeline
        tokenizer/                  vocab.json, merges.txt (CLIP)
        text_encoder/model.onnx     input_ids -> last_hidden_state, pooler_output
        unet/model.onnx             sample, timestep, encoder_hidden_states -> out_sample
        vae_decoder/model.onnx      latent_sample -> sample
        vae_encoder/model.onnx      sample -> latent_parameters (optional: image to image)
        scheduler/scheduler_config.json

becomes three models: ``NAME`` (the UNet, served as the generator: prompt in, image
out; ``iterative.export`` points at DIR), ``NAME.text_encoder`` and ``NAME.vae_decoder``
(ordinary models the generator runs), and ``NAME.vae_encoder`` where the export has a
VAE encoder (image to image).

An SDXL export (``_class_name: StableDiffusionXLPipeline``) also has ``tokenizer_2/`` and
``text_encoder_2/model.onnx`` (``input_ids`` -> ``text_embeds``, ``last_hidden_state``,
``hidden_states.0..L``), and its UNet takes ``text_embeds`` and ``time_ids`` too: it
becomes four models, the fourth ``NAME.text_encoder_2`` (``iterative.text_encoder_2``,
which makes the generator run the SDXL loop). Both encoders must give their hidden
states (optimum exports them for SDXL): SDXL conditions on the penultimate layer's.

An SD3 export (``_class_name: StableDiffusion3Pipeline``) has three tokenizers and text
encoders (two CLIPs with their hidden states and ``text_embeds``; T5's ``text_encoder_3``,
``input_ids`` -> ``last_hidden_state``, optional as in diffusers: without it T5's rows
are zeros) and ``transformer/model.onnx`` in place of the UNet (``hidden_states``,
``timestep`` per row, ``encoder_hidden_states``, ``pooled_projections`` ->
``out_hidden_states``): it becomes ``NAME`` (the transformer, ``iterative.text_encoder_3``
set when T5 is there), ``NAME.text_encoder``, ``NAME.text_encoder_2``,
``NAME.text_encoder_3`` and ``NAME.vae_decoder``; the generator runs the SD3 loop
(generation/stable_diffusion_3.py). An SDXL or SD3 export's ``vae_encoder/`` becomes
``NAME.vae_encoder`` as SD's does (image to image). Other pipelines are refused with a
clear error.

optimum exports the UNet's ``timestep`` as a scalar, so one call can only denoise rows at
one timestep. To let requests at different steps share a UNet batch, the graph is
rewritten to take one timestep per row (the scalar's ``Unsqueeze`` removed: what follows
already expands it to the batch) and kept in a cache folder keyed by the file's identity
(``$SORDINO_CACHE_DIR``, else the temp folder's ``sordino-cache``; external weight files
are hard links, copied only when the cache is on another file system: point
``SORDINO_CACHE_DIR`` at the export's file system for a multi-GB UNet);
a UNet whose timestep is already per row is used as it is. The copy also names the
latent size to warm up with (``sordino.warmup_shape.sample``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from sordino.config import ModelConfig
from sordino.errors import ModelLoadError

__all__ = ["export_kind", "export_sources", "is_diffusers_export", "per_row_timestep"]

SUPPORTED = ("StableDiffusionPipeline", "OnnxStableDiffusionPipeline", "ORTStableDiffusionPipeline")
SUPPORTED_XL = ("StableDiffusionXLPipeline", "ORTStableDiffusionXLPipeline")
SUPPORTED_SD3 = ("StableDiffusion3Pipeline", "ORTStableDiffusion3Pipeline")


def is_diffusers_export(folder: Path) -> bool:
    """Whether ``folder`` is a diffusers pipeline export (it has ``model_index.json``)."""
    return (folder / "model_index.json").is_file()


def export_kind(folder: Path) -> str:
    """``"sd3"``, ``"sdxl"`` or ``"sd"``: which loop an export's generator runs."""
    try:
        index = json.loads((folder / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "sd"
    kind = str(index.get("_class_name", "")) if isinstance(index, dict) else ""
    return "sd3" if kind in SUPPORTED_SD3 else "sdxl" if kind in SUPPORTED_XL else "sd"


def export_sources(
    name: str, folder: Path, config: ModelConfig
) -> list[tuple[str, Path, ModelConfig]]:
    """The models an export serves as: (name, .onnx file, config), helpers first.

    ``config`` is the user's (``--model NAME=DIR`` or a repository's ``config.yaml``);
    its ``iterative`` settings (steps, guidance, reuse, degrade) are kept.
    """
    index = _json(folder / "model_index.json", name)
    kind = str(index.get("_class_name", ""))
    xl, sd3 = kind in SUPPORTED_XL, kind in SUPPORTED_SD3
    if kind not in SUPPORTED and not xl and not sd3:
        # An SDXL refiner ships as StableDiffusionXLImg2ImgPipeline (aesthetic-score
        # conditioning, no first text encoder): not supported; say what to serve instead.
        image = (
            " (an image-to-image or SDXL refiner export is not supported: serve the base "
            "text-to-image export, which does image to image with `image` and `strength`)"
            if "Img2Img" in kind
            else ""
        )
        raise ModelLoadError(
            f"model {name!r}: {folder} is a diffusers export of {kind or 'an unnamed pipeline'}; "
            "sordino serves Stable Diffusion 1.x/2.x, SDXL and SD3 text-to-image exports "
            "(StableDiffusionPipeline, StableDiffusionXLPipeline, StableDiffusion3Pipeline), "
            f"not other pipelines{image}"
        )
    denoiser = "transformer" if sd3 else "unet"
    parts = [
        "tokenizer",
        "text_encoder/model.onnx",
        f"{denoiser}/model.onnx",
        "vae_decoder/model.onnx",
        "scheduler/scheduler_config.json",
    ]
    if xl or sd3:
        parts[1:1] = ["tokenizer_2", "text_encoder_2/model.onnx"]
    t5 = sd3 and (folder / "text_encoder_3" / "model.onnx").is_file()
    if t5:
        parts[1:1] = ["tokenizer_3/tokenizer.json"]
    for part in parts:
        if not (folder / part).exists():
            raise ModelLoadError(
                f"model {name!r}: the Stable Diffusion export {folder} has no {part}; export it "
                "again with `optimum-cli export onnx --model MODEL --task text-to-image DIR`"
            )
    from sordino.config.iterative import IterativeConfig, IterativeSteps

    unet_config = (
        _json(folder / denoiser / "config.json", name)
        if (folder / denoiser / "config.json").is_file()
        else {}
    )
    side = int(unet_config.get("sample_size", 64))
    channels = int(unet_config.get("in_channels", 4))
    base = config.iterative or IterativeConfig()
    # diffusers' defaults where the user set none: 50 steps (SD3's 28), guidance 7.5
    # (SDXL's 5.0, SD3's 7.0).
    if "steps" not in base.model_fields_set:
        base = base.model_copy(update={"steps": IterativeSteps(default=28 if sd3 else 50, max=150)})
    if "guidance" not in base.model_fields_set:
        base = base.model_copy(update={"guidance": 7.0 if sd3 else 5.0 if xl else 7.5})
    iterative = base.model_copy(
        update={
            "export": folder,
            "prompt": "text_encoder",
            "text_encoder": f"{name}.text_encoder",
            "decoder": f"{name}.vae_decoder",
            "sample_input": "hidden_states" if sd3 else "sample",
            "timestep_input": "timestep",
            "condition_input": "encoder_hidden_states",
            "noise_output": "out_hidden_states" if sd3 else "out_sample",
            "sample_shape": (channels, side, side),
        }
    )
    helper = config.model_copy(update={"iterative": None, "path": None})
    encoders = ["text_encoder"]
    if xl or sd3:
        encoders.append("text_encoder_2")
        for encoder in encoders:
            _needs_hidden_states(folder / encoder / "model.onnx", name)
        iterative = iterative.model_copy(update={"text_encoder_2": f"{name}.text_encoder_2"})
    if t5:
        encoders.append("text_encoder_3")
        iterative = iterative.model_copy(update={"text_encoder_3": f"{name}.text_encoder_3"})
    image_encoder = _image_encoder(name, folder, helper)
    if sd3:
        # The transformer's timestep is per row already; it warms up at its own latent
        # size (a 1x1 latent cannot be cut into patches).
        hint = ("hidden_states", f"1,{channels},{side},{side}")
        denoiser_file = _with_warmup(folder / "transformer" / "model.onnx", *hint, "transformer")
    else:
        denoiser_file = per_row_timestep(folder / "unet" / "model.onnx", name)
    if image_encoder:
        iterative = iterative.model_copy(update={"image_encoder": image_encoder[0][0]})
    return [
        *(
            (
                f"{name}.{encoder}",
                folder / encoder / "model.onnx",
                helper.model_copy(update={"name": f"{name}.{encoder}"}),
            )
            for encoder in encoders
        ),
        (
            f"{name}.vae_decoder",
            folder / "vae_decoder" / "model.onnx",
            helper.model_copy(update={"name": f"{name}.vae_decoder"}),
        ),
        *image_encoder,
        (
            name,
            denoiser_file,
            config.model_copy(update={"iterative": iterative}),
        ),
    ]


def _image_encoder(
    name: str, folder: Path, helper: ModelConfig
) -> list[tuple[str, Path, ModelConfig]]:
    """``NAME.vae_encoder`` where the export has one (image to image), else nothing."""
    path = folder / "vae_encoder" / "model.onnx"
    if not path.is_file():
        return []
    config = path.parent / "config.json"
    settings = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    side, channels = int(settings.get("sample_size", 64)), int(settings.get("in_channels", 3))
    path = _with_warmup(path, "sample", f"1,{channels},{side},{side}", "vae-encoder")
    return [
        (f"{name}.vae_encoder", path, helper.model_copy(update={"name": f"{name}.vae_encoder"}))
    ]


def _with_warmup(encoder: Path, input_name: str, shape: str, kind: str) -> Path:
    """A cached copy of a model that names its warm-up size for ``input_name`` (``shape``,
    comma-separated): an image or latent of 1x1, the default, fails in a VAE encoder or a
    transformer cutting patches.

    The copy holds the graph and the hint; external weights are hard links as for the UNet.
    """
    import onnx

    model = onnx.load(str(encoder), load_external_data=False)
    key = "sordino.warmup_shape." + input_name
    if any(prop.key == key for prop in model.metadata_props):
        return encoder
    target = _cache_path(encoder, kind, f"{kind}-v1")
    if target.is_file():
        return target
    hint = model.metadata_props.add()
    hint.key, hint.value = key, shape
    return _write_cached(model, encoder, target)


def per_row_timestep(unet: Path, name: str) -> Path:
    """``unet`` itself if its timestep is per row; else a rewritten copy (cached) whose is."""
    import onnx

    model = onnx.load(str(unet), load_external_data=False)
    graph = model.graph
    timestep = next((i for i in graph.input if i.name == "timestep"), None)
    if timestep is None:
        raise ModelLoadError(f"model {name!r}: the UNet {unet} has no input 'timestep'")
    dims = timestep.type.tensor_type.shape.dim
    if len(dims) == 1:
        return unet
    users = [n for n in graph.node if "timestep" in n.input]
    if len(dims) != 0 or len(users) != 1 or users[0].op_type != "Unsqueeze":
        raise ModelLoadError(
            f"model {name!r}: the UNet's timestep input has {len(dims)} dimensions and is not "
            "a scalar feeding one Unsqueeze, so sordino cannot batch rows at different "
            "timesteps; export it with optimum (`optimum-cli export onnx`)"
        )
    target = _cache_path(unet, "unet-per-row-timestep", "v3")
    if target.is_file():
        return target
    unsqueeze = next(n for n in graph.node if "timestep" in n.input)
    for node in graph.node:
        for i, used in enumerate(node.input):
            if used == unsqueeze.output[0]:
                node.input[i] = "timestep"
    graph.node.remove(unsqueeze)
    timestep = next(i for i in graph.input if i.name == "timestep")
    timestep.type.tensor_type.shape.dim.add().dim_param = "batch_size"
    # Warm up at the UNet's own latent size (backends/base.py: a 1x1 latent fails).
    config = unet.parent / "config.json"
    settings = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
    side, channels = int(settings.get("sample_size", 64)), int(settings.get("in_channels", 4))
    hint = model.metadata_props.add()
    # backends.base.WARMUP_SHAPE + the input's name (models may not import backends).
    hint.key, hint.value = "sordino.warmup_shape.sample", f"1,{channels},{side},{side}"
    return _write_cached(model, unet, target)


def _cache_path(source: Path, folder: str, tag: str) -> Path:
    """Where the rewritten copy of ``source`` is kept: ``$SORDINO_CACHE_DIR/FOLDER/KEY``,
    the key naming ``tag`` (the rewrite's version) and the file's path, size and time."""
    facts = source.stat()
    identity = f"{tag}:{source.resolve()}:{facts.st_size}:{facts.st_mtime_ns}".encode()
    given = os.environ.get("SORDINO_CACHE_DIR")
    cache = Path(given) if given else _own_cache()
    return cache / folder / hashlib.sha256(identity).hexdigest()[:24] / "model.onnx"


def _own_cache() -> Path:
    """The temporary folder's ``sordino-cache-UID``, made private to this user: the
    temporary folder is every user's, and a model found in the cache is served as the
    export's (another user must not be able to put one there)."""
    cache = Path(tempfile.gettempdir()) / f"sordino-cache-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        cache.mkdir(mode=0o700)
    found = cache.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o022:
        raise ModelLoadError(
            f"the cache folder {cache} is not a folder of this user's that only it may "
            "write in; remove it, or set SORDINO_CACHE_DIR to a folder of yours"
        )
    return cache


def _write_cached(model: Any, source: Path, target: Path) -> Path:
    """Write the rewritten ``model`` (read from ``source``) to the cache path ``target``.

    Weights stored outside the graph (a real UNet's model.onnx_data, GBs) are hard
    links to the export's files (ONNX Runtime refuses external data reached through a
    symbolic link that leaves the model's folder); copied only across file systems. The
    graph is written beside and renamed, so a reader never sees half a file.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    for location in _external_files(model):
        link = target.parent / location
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source.parent / location, link)
            except OSError:
                shutil.copyfile(source.parent / location, link)
    partial = target.with_suffix(".partial")
    partial.write_bytes(model.SerializeToString())
    partial.replace(target)
    return target


def _needs_hidden_states(encoder: Path, name: str) -> None:
    """Refuse an SDXL text encoder exported without its per-layer hidden states."""
    import onnx

    graph = onnx.load(str(encoder), load_external_data=False).graph
    layers = [o.name for o in graph.output if o.name.startswith("hidden_states.")]
    if len(layers) < 2:
        raise ModelLoadError(
            f"model {name!r}: the SDXL text encoder {encoder} has no outputs hidden_states.0, "
            "hidden_states.1, ... (SDXL conditions on the penultimate layer's); export it "
            "with optimum (`optimum-cli export onnx --task text-to-image`), which adds them"
        )


def _external_files(model: Any) -> set[str]:
    """The files (relative to the model) that hold its external tensors."""
    files = set()
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                files.add(entry.value)
    return files


def _json(path: Path, name: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"model {name!r}: cannot read {path}: {exc}") from None
    if not isinstance(value, dict):
        raise ModelLoadError(f"model {name!r}: {path} is not a JSON object")
    return value
