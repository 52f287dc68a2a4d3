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
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from sordino.config import ModelConfig, load_model_config_file
from sordino.errors import ConfigError, ModelLoadError

__all__ = [
    "ModelSource",
    "builtin_sources",
    "export_builtin",
    "model_from_spec",
    "scan_repository",
    "sources_for",
]

MODEL_FILENAME = "model.onnx"


@dataclass(frozen=True, slots=True)
class ModelSource:
    """One model version to load: its name, version, file and configuration."""

    name: str
    version: str
    path: Path
    config: ModelConfig
    description: str = ""


def builtin_sources() -> list[ModelSource]:
    """Return the demo models shipped inside the package."""
    root = resources.files("sordino.models.builtin")
    entries = yaml.safe_load(root.joinpath("models.yaml").read_text(encoding="utf-8"))
    sources = []
    for entry in entries:
        path = Path(str(root.joinpath(entry["file"])))
        config = ModelConfig(
            name=entry["name"],
            path=path,
            max_batch_size=entry["max_batch_size"],
            streaming=entry.get("streaming"),
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
    if not name:
        name = model_path.stem if model_path.suffix else model_path.name
    try:
        return ModelConfig(name=name, path=model_path)
    except ValueError as exc:
        raise ConfigError(f"--model {spec!r}: {exc}") from exc


def sources_for(config: ModelConfig) -> list[ModelSource]:
    """Resolve one configured model (a file or a versioned folder) into versions to load."""
    if config.name is None or config.path is None:
        raise ConfigError("every entry under models: needs a name and a path")
    path = config.path
    if path.is_file():
        return [ModelSource(config.name, "1", path, config)]
    if path.is_dir():
        return _versions_in(path, config.name, config)
    raise ModelLoadError(f"model {config.name!r}: {path} does not exist")


def scan_repository(root: Path) -> list[ModelSource]:
    """Return every model version a Triton-style repository folder holds."""
    if not root.is_dir():
        raise ModelLoadError(f"model repository {root} is not a folder")
    sources: list[ModelSource] = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        sources.extend(load_repository_model(root, folder.name))
    return sources


def load_repository_model(root: Path, name: str) -> list[ModelSource]:
    """Return the versions of the model folder ``root/name`` (its config.yaml applied)."""
    folder = root / name
    if not folder.is_dir():
        raise ModelLoadError(f"model {name!r} is not in repository {root}")
    config_file = folder / "config.yaml"
    config = load_model_config_file(config_file) if config_file.exists() else ModelConfig()
    if config.name not in (None, name):
        raise ConfigError(
            f"{config_file}: name {config.name!r} differs from its folder {name!r}; "
            "remove name or rename the folder"
        )
    config = config.model_copy(update={"name": name, "path": folder})
    return _versions_in(folder, name, config)


def _versions_in(folder: Path, name: str, config: ModelConfig) -> list[ModelSource]:
    numbered = {int(p.name): p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()}
    if not numbered:
        return [ModelSource(name, "1", _model_file(folder, name), config)]
    chosen = config.version_policy.select(numbered)
    if not chosen:
        raise ModelLoadError(
            f"model {name!r}: the version policy selects none of the versions present "
            f"({', '.join(str(v) for v in sorted(numbered))})"
        )
    return [ModelSource(name, str(v), _model_file(numbered[v], name), config) for v in chosen]


def _model_file(folder: Path, name: str) -> Path:
    default = folder / MODEL_FILENAME
    if default.is_file():
        return default
    candidates = sorted(folder.glob("*.onnx"))
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise ModelLoadError(
            f"model {name!r}: no .onnx file in {folder} (expected {MODEL_FILENAME})"
        )
    raise ModelLoadError(
        f"model {name!r}: several .onnx files in {folder}; name the one to serve {MODEL_FILENAME}"
    )
