"""Where models come from: the built-ins, ``--model`` files, config entries, repositories.

Everything is turned into :class:`ModelSource` records (one per model version to
load) before anything is loaded, so a bad entry stops start-up with one clear error
instead of a half-started server.

A repository is Triton's layout::

    DIR/
      digits/
        config.yaml          optional: a ModelConfig without name/path
        1/model.onnx         numbered version folders
        2/model.onnx
      text/
        model.onnx           a bare model file means version 1
      add_sub/
        config.pbtxt         Triton's configuration, read when there is no config.yaml
        1/model.py           backend: "python" (a Triton Python-backend model)
      chain/
        config.pbtxt         platform: "ensemble": served as a pipeline of the
        1/                   models above (models/ensembles.py), not loaded here

The file a version folder must hold is its backend kind's
(:class:`~sordino.backends.base.BackendKind`: ``model.onnx``, ``model.py``, ...). A
``config.pbtxt`` (read when there is no ``config.yaml``) gives the batching, version,
warm-up and instance settings (:func:`sordino.backends.pbtxt_settings.sordino_settings`); its
``backend``/``platform`` chooses the kind (ONNX Runtime when it names none), and an ONNX
model's tensors it declares are checked at load (``backends/onnx_pbtxt.py``).

A model's name is its folder's name and must be a model name (``MODEL_NAME_PATTERN``:
no path separators, never ``..``); a folder that is not is skipped with a warning.
Everything a repository model loads lies inside the repository: a symbolic link (the
model folder, a version folder, ``config.yaml``, the ``.onnx`` file) that leads outside
it is refused, so a load request can only ever reach the repository's own files.
"""

from __future__ import annotations

import logging
import re
import shlex
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sordino.backends.pbtxt import read_pbtxt
from sordino.backends.registry import backend_kind, backend_kinds, kind_for_platform
from sordino.config import MODEL_NAME_PATTERN, ModelConfig, load_model_config_file
from sordino.config.loader import shown_value
from sordino.errors import ConfigError, ModelLoadError

__all__ = [
    "ModelSource",
    "builtin_sources",
    "export_builtin",
    "is_model_name",
    "load_repository_model",
    "model_from_spec",
    "repository_names",
    "scan_repository",
    "sources_for",
    "sources_from_spec",
]

log = logging.getLogger("sordino.models")

MODEL_FILENAME = "model.onnx"
MAX_NAME_LENGTH = 255
"""Longest model name: a folder name on common file systems."""

_NAME = re.compile(MODEL_NAME_PATTERN)
NAME_RULE = "ASCII letters, digits, '_', '.', '-', starting with a letter or digit"
""":data:`MODEL_NAME_PATTERN` in words, for messages."""


@dataclass(frozen=True, slots=True)
class ModelSource:
    """One model version to load: its name, version, file and configuration."""

    name: str
    version: str
    path: Path
    config: ModelConfig
    description: str = ""

    @property
    def folder(self) -> Path:
        """The folder the model's other files are read from (warm-up data, initial states,
        the files its checksums name): its repository folder, or the folder its ``path``
        names, else the folder of its model file."""
        path = self.config.path
        if path is not None and path.is_dir():
            return path
        return (path or self.path).parent


def builtin_sources() -> list[ModelSource]:
    """Return the demo models shipped inside the package."""
    return _packaged_sources("sordino.models.builtin")


def triton_example_sources() -> list[ModelSource]:
    """Return Triton's example models (``sordino start --with-triton-examples``)."""
    return _packaged_sources("sordino.models.examples")


def _packaged_sources(package: str) -> list[ModelSource]:
    root = resources.files(package)
    entries = yaml.safe_load(root.joinpath("models.yaml").read_text(encoding="utf-8"))
    sources = []
    for entry in entries:
        path = Path(str(root.joinpath(entry["file"])))
        config = ModelConfig(
            name=entry["name"],
            path=path,
            max_batch_size=entry["max_batch_size"],
            streaming=entry.get("streaming"),
            iterative=entry.get("iterative"),
            scheduler_mode=entry.get("scheduler_mode"),
            label_filename=entry.get("label_filename"),
            sequence_batching=entry.get("sequence_batching"),
        )
        sources.append(ModelSource(entry["name"], "1", path, config, entry.get("description", "")))
    return sources


def export_builtin(root: Path) -> list[Path]:
    """Write the built-in models into ``root`` as a repository; return their model folders.

    Each model gets ``root/NAME/1/model.onnx`` and a ``config.yaml`` with what the
    built-in entry sets, so ``--model-repository root`` serves what the built-ins serve.
    ``root`` is created if needed; a model folder that already exists is never
    overwritten (FileExistsError).
    """
    folders = []
    for source in builtin_sources():
        folder = root / source.name
        (folder / source.version).mkdir(parents=True, exist_ok=False)
        shutil.copyfile(source.path, folder / source.version / MODEL_FILENAME)
        settings = source.config.model_dump(
            mode="json", exclude={"name", "path"}, exclude_unset=True, exclude_none=True
        )
        labels = source.config.label_filename
        if isinstance(labels, Path):
            shutil.copyfile(source.path.parent / labels, folder / labels.name)
            settings["label_filename"] = labels.name
        header = f"# {source.name}: {source.description}\n" if source.description else ""
        (folder / "config.yaml").write_text(
            header + yaml.safe_dump(settings, sort_keys=False), encoding="utf-8"
        )
        folders.append(folder)
    return folders


def model_from_spec(spec: str) -> ModelConfig:
    """Parse a ``--model`` value: ``path/to/model.onnx`` or ``name=path``."""
    name, sep, path = spec.partition("=")
    if not sep:
        name, path = "", spec
    model_path = Path(path).expanduser()
    named = bool(name)
    if not named:
        name = model_path.stem if model_path.suffix else model_path.name
    if not is_model_name(name):
        rule = f"{NAME_RULE}, at most {MAX_NAME_LENGTH} characters"
        if named:
            raise ConfigError(f"--model {spec!r}: {name!r} is not a model name ({rule})")
        raise ConfigError(
            f"--model {spec!r}: its file name would name the model {name!r}, which is not a "
            f"model name ({rule}); name it: --model {shlex.quote('NAME=' + path)}"
        )
    try:
        return ModelConfig(name=name, path=model_path)
    except ValueError as exc:
        raise ConfigError(f"--model {spec!r}: {exc}") from exc


def sources_from_spec(spec: str) -> list[ModelSource]:
    """A ``--model`` value's versions. A model folder with a configuration of its own
    (``config.yaml``, or Triton's ``config.pbtxt``: a Python model's ``backend:
    "python"``) is read as a repository's folder is; any other file or versioned folder
    is served with the defaults."""
    config = model_from_spec(spec)
    folder = config.path
    assert folder is not None and config.name is not None
    own = folder.is_dir() and any((folder / f).is_file() for f in ("config.yaml", "config.pbtxt"))
    if not own or _is_export(folder):
        return sources_for(config)
    if config.name != folder.name:
        raise ConfigError(
            f"--model {spec!r}: {folder} has a configuration of its own, which serves it as "
            f"{folder.name!r}; give --model {folder}, or rename the folder"
        )
    return load_repository_model(folder.parent, folder.name)


def sources_for(config: ModelConfig) -> list[ModelSource]:
    """Resolve one configured model (a file or a versioned folder) into versions to load."""
    if config.name is None or config.path is None:
        raise ConfigError("every entry under models: needs a name and a path")
    path = config.path
    if path.is_file():
        _refuse_foreign(config.name, path)
        return [_hinted(ModelSource(config.name, "1", path, config))]
    if path.is_dir():
        if _is_export(path):
            return _export(config.name, path, config)
        return [_hinted(source) for source in _versions_in(path, config.name, config)]
    raise ModelLoadError(f"model {config.name!r}: {path} does not exist")


def _hinted(source: ModelSource) -> ModelSource:
    """``source`` with the runtime hints embedded in its file applied (models/hints.py)."""
    from sordino.models.hints import apply_hints, log_applied

    if source.path.suffix != ".onnx":
        return source
    result = apply_hints(source.config, source.path)
    if result is None:
        return source
    log_applied(source.name, result)
    return ModelSource(source.name, source.version, source.path, result.config, source.description)


def is_model_name(name: str) -> bool:
    """Whether ``name`` is a model name (and so a plain folder name, never a path)."""
    return len(name) <= MAX_NAME_LENGTH and _NAME.fullmatch(name) is not None


def repository_names(root: Path, *, warn: bool = False) -> list[str]:
    """The model folders of the repository ``root`` (hidden and misnamed ones skipped).

    With ``warn``, each folder skipped for its name is logged (once, at start-up).
    """
    if not root.is_dir():
        return []
    names = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if is_model_name(folder.name):
            names.append(folder.name)
        elif warn:
            log.warning(
                "model repository %s: skipping folder %r, which is not a model name (%s)",
                root,
                folder.name,
                NAME_RULE,
            )
    return names


def scan_repository(root: Path) -> list[ModelSource]:
    """Return every model version a Triton-style repository folder holds."""
    if not root.is_dir():
        raise ModelLoadError(f"model repository {root} is not a folder")
    from sordino.models.ensembles import is_ensemble

    sources: list[ModelSource] = []
    for name in repository_names(root, warn=True):
        if not is_ensemble(root / name):  # served as a pipeline (models/ensembles.py)
            sources.extend(load_repository_model(root, name))
    return sources


def load_repository_model(
    root: Path, name: str, override: dict[str, Any] | None = None
) -> list[ModelSource]:
    """Return the versions of the model folder ``root/name`` (its config.yaml applied).

    ``name`` must be a model name; every file used must lie inside ``root`` once
    symbolic links are followed (:class:`ModelLoadError` otherwise). ``override``: a
    Triton configuration (JSON form) used instead of the folder's own, as a model-control
    load's ``config`` parameter gives one.
    """
    if not is_model_name(name):
        raise ModelLoadError(f"{_shown(name)} is not a model name, so it is not in {root}")
    folder = root / name
    if not folder.is_dir():
        raise ModelLoadError(f"model {name!r} is not in repository {root}")
    inside = root.resolve()
    _contained(inside, folder, name)
    from sordino.models.ensembles import is_ensemble

    if is_ensemble(folder):
        raise ModelLoadError(
            f"model {name!r} in {root} is a Triton ensemble, not a model file to load: it is "
            "served as a pipeline of the models it runs (models/ensembles.py)"
        )
    config_file = folder / "config.yaml"
    if override is not None:
        if override.get("name") not in (None, "", name):
            raise ConfigError(
                f"the load request's config names model {shown_value(override['name'])}, "
                f"but it loads {name!r}: remove name from it, or make it {name!r}"
            )
        config = _from_triton(override, folder, "the load request's config", given=True)
    elif config_file.exists():
        _contained(inside, config_file, name)
        config = load_model_config_file(config_file)
    elif (folder / "config.pbtxt").is_file():
        _contained(inside, folder / "config.pbtxt", name)
        path = folder / "config.pbtxt"
        config = _from_triton(read_pbtxt(path), folder, str(path))
    else:
        config = ModelConfig()
    if config.name not in (None, name):
        raise ConfigError(
            f"{config_file}: name {shown_value(config.name)} differs from its folder {name!r}; "
            "remove name or rename the folder"
        )
    config = config.model_copy(update={"name": name, "path": folder})
    if _is_export(folder):
        for part in ("model_index.json", "tokenizer", "text_encoder", "unet", "vae_decoder"):
            _contained(inside, folder / part, name)
        if (folder / "vae_encoder").exists():
            _contained(inside, folder / "vae_encoder", name)
        return _export(name, folder, config)
    sources = _versions_in(folder, name, config)
    for source in sources:
        _contained(inside, source.path, name)
    return sources


def _from_triton(
    triton: dict[str, Any], folder: Path, source: str, *, given: bool = False
) -> ModelConfig:
    """The ModelConfig a Triton configuration gives (the JSON form of the model folder's
    ``config.pbtxt``, or a load's ``config``; an ONNX model's is read by
    ``backends/onnx_pbtxt.py``). One ``given`` instead of the folder's own is kept whole
    for the backend (``triton_config``): a Python model reads it, not ``config.pbtxt``."""
    from sordino.backends.pbtxt_settings import sordino_settings

    named = str(triton.get("backend") or triton.get("platform") or "")
    kind = kind_for_platform(named)
    if named and kind is None:
        raise ModelLoadError(_unknown_platform(folder.name, source, named))
    if kind is None or kind.name == "onnxruntime":
        from sordino.backends.onnx_pbtxt import onnx_settings

        settings = onnx_settings(triton, source=source)  # sordino_settings and more
        kind = backend_kind("onnxruntime", model=folder.name)
    else:
        settings = sordino_settings(triton, source=source)
    settings["backend"] = kind.name
    if given:
        settings["triton_config"] = triton
    try:
        return ModelConfig(**settings)
    except ValidationError as exc:  # one line a problem, where it is and what is wrong
        problems = [
            f"{'.'.join(str(part) for part in error['loc']) or 'the model'}: "
            f"{error['msg'].removeprefix('Value error, ')}"
            for error in exc.errors()
        ]
        raise ConfigError(f"{source}: " + "; ".join(problems)) from None
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from exc


def _unknown_platform(model: str, source: str, named: str) -> str:
    """Why a ``config.pbtxt`` naming a backend or platform sordino lacks is refused."""
    where = f"model {model!r}: {source}"
    served = sorted({n for kind in backend_kinds().values() for n in (kind.name, *kind.platforms)})
    return (
        f"{where} names the backend or platform {named!r}, which sordino does not serve (not "
        f"supported); it serves {', '.join(served)} (docs/backends.md; a backend of your own "
        "registers through the sordino.backends entry points)"
    )


def _is_export(folder: Path) -> bool:
    from sordino.models.diffusers_export import is_diffusers_export

    return is_diffusers_export(folder)


def _export(name: str, folder: Path, config: ModelConfig) -> list[ModelSource]:
    """A diffusers export's models (models/diffusers_export.py): helpers, then ``name``.

    The generator takes the runtime hints embedded in its denoiser's file (e.g.
    ``step_cache``), as a plain model takes its own.
    """
    from sordino.models.diffusers_export import export_sources

    return [
        _hinted(ModelSource(model, "1", path, model_config, "Stable Diffusion export"))
        if model == name
        else ModelSource(model, "1", path, model_config, "")
        for model, path, model_config in export_sources(name, folder, config)
    ]


def _contained(root: Path, path: Path, name: str) -> None:
    """Refuse ``path`` unless it resolves inside ``root`` (already resolved)."""
    if not path.resolve().is_relative_to(root):
        raise ModelLoadError(
            f"model {name!r}: {path.name} is a symbolic link that leads outside the model "
            "repository; sordino loads only files inside the repository (copy the file "
            "in, or make the repository the folder that holds it)"
        )


def _refuse_foreign(name: str, path: Path) -> None:
    """ModelLoadError naming what ``path`` is when it is a model sordino cannot serve."""
    from sordino.models.formats import foreign_model

    what = foreign_model(path)
    if what is not None:
        raise ModelLoadError(f"model {name!r}: sordino serves ONNX only: {what}")


def _shown(name: str) -> str:
    text = repr(name)
    return text if len(text) <= 80 else text[:79] + "…"


def _versions_in(folder: Path, name: str, config: ModelConfig) -> list[ModelSource]:
    numbered = {int(p.name): p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()}
    if not numbered:
        return [ModelSource(name, "1", _model_file(folder, name, config), config)]
    chosen = config.version_policy.select(numbered)
    if not chosen:
        raise ModelLoadError(
            f"model {name!r}: the version policy selects none of the versions present "
            f"({', '.join(str(v) for v in sorted(numbered))})"
        )
    return [
        ModelSource(name, str(v), _model_file(numbered[v], name, config), config) for v in chosen
    ]


def _model_file(folder: Path, name: str, config: ModelConfig) -> Path:
    """The file of ``folder`` that the model's kind serves (ModelLoadError if none): the
    one ``default_model_filename`` names, where it names one."""
    if config.default_model_filename:
        path = folder / config.default_model_filename
        if not path.is_file():
            raise ModelLoadError(
                f"model {name!r}: no {config.default_model_filename} in {folder} (the file "
                "its default_model_filename names): add it, or name the file there"
            )
        return path
    kind = backend_kind(config.backend, model=repr(name))
    found = kind.model_file(folder)
    if isinstance(found, Path):
        return found
    if kind.name == "onnxruntime" and not any(folder.glob("*.onnx")):
        for other in sorted(p for p in folder.iterdir() if p.is_file()):
            _refuse_foreign(name, other)
    raise ModelLoadError(f"model {name!r}: {found}")
