"""Triton ensembles in a model repository, served as pipelines.

A repository folder whose ``config.pbtxt`` says ``platform: "ensemble"`` is not a
model to load but a chain of the repository's (or the configuration's) models: it
becomes a :class:`~sordino.config.pipelines.PipelineConfig` through the
``ensemble_scheduling`` spelling that section takes (steps wired by their ensemble
tensor names, in any order; the ``input`` and ``output`` lists; ``max_batch_size``,
0 for requests that pass whole). The pipelines are built once every model has
loaded (:meth:`sordino.server.runtime.Runtime.start`), so an ensemble may name any
served model, wherever it comes from.

Model control (``explicit``, ``poll``) loads and unloads ensembles as Triton does, with
the models they run (:mod:`sordino.server.ensemble_control`). In explicit model
control ``sordino start`` loads the repository models and ensembles ``--load-model``
names, with what those run, and no other (:func:`only_named`), as Triton does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sordino.backends.pbtxt import read_pbtxt
from sordino.config.base import reject_repeated_names
from sordino.config.pipelines import PipelineConfig
from sordino.errors import ConfigError
from sordino.models.repositories import Repositories

if TYPE_CHECKING:
    from sordino.config import RuntimeConfig
    from sordino.models.repository import ModelSource

__all__ = [
    "ensemble_pipeline",
    "is_ensemble",
    "only_named",
    "repository_ensembles",
    "with_ensembles",
]

_TAKEN = {
    "name",
    "platform",
    "max_batch_size",
    "input",
    "output",
    "ensemble_scheduling",
    "response_cache",
}
"""The ``config.pbtxt`` fields of an ensemble that sordino reads; any other one set to
other than its default is refused by name (a ``version_policy`` but the latest one
version, ``parameters``, ...)."""
_DEFAULTS: dict[str, Any] = {"version_policy": {"latest": {"num_versions": 1}}, "backend": ""}
"""Fields a configuration copied from Triton's ``GET …/config`` carries at their
defaults: taken, as asking nothing."""


def is_ensemble(folder: Path) -> bool:
    """Whether the model folder ``folder`` is a Triton ensemble (``platform: "ensemble"``
    in its ``config.pbtxt``, and no ``config.yaml`` of sordino's)."""
    path = folder / "config.pbtxt"
    if (folder / "config.yaml").exists() or not path.is_file():
        return False
    return str(read_pbtxt(path).get("platform", "")) == "ensemble"


def ensemble_pipeline(folder: Path, given: dict[str, Any] | None = None) -> PipelineConfig:
    """The pipeline the ensemble in ``folder`` describes (:class:`ConfigError` names the
    file and what to fix); ``given``: a Triton configuration (JSON form) used instead
    of its ``config.pbtxt``, as a model-control load's ``config`` gives one."""
    path = folder / "config.pbtxt"
    triton = read_pbtxt(path) if given is None else given
    name = folder.name
    if triton.get("name", name) != name:
        raise ConfigError(
            f"{path}: name {triton['name']!r} differs from its folder {name!r}; remove name "
            "or rename the folder"
        )
    refused = sorted(
        key
        for key, value in triton.items()
        # A message given empty still asks for something (dynamic_batching { }).
        if key not in _TAKEN and value not in (_DEFAULTS.get(key), None, 0, False, "", [])
    )
    if refused:
        raise ConfigError(
            f"{path}: {', '.join(refused)} is not supported on an ensemble by sordino; remove it"
        )
    if not (folder / "1").is_dir() and not any(p.name.isdigit() for p in folder.iterdir()):
        raise ConfigError(
            f"{path}: an ensemble needs a version folder, as in Triton: create "
            f"{folder / '1'} (empty)"
        )
    section: dict[str, Any] = {
        "name": name,
        "ensemble_scheduling": triton.get("ensemble_scheduling"),
        "input": triton.get("input", []),
        "output": triton.get("output", []),
        "max_batch_size": int(triton.get("max_batch_size", 0)),
        "response_cache": bool((triton.get("response_cache") or {}).get("enable", False)),
    }
    if section["ensemble_scheduling"] is None:
        raise ConfigError(f"{path}: an ensemble needs ensemble_scheduling {{ step [ ... ] }}")
    try:
        return PipelineConfig(**section)
    except ValueError as exc:
        raise ConfigError(f"{path}: {_plain(exc)}") from exc


def _plain(exc: ValueError) -> str:
    """A pydantic error's messages without its framing (one line each)."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        return "; ".join(str(e.get("msg", "")).removeprefix("Value error, ") for e in errors())
    return str(exc)


def repository_ensembles(root: Path, broken: dict[str, str] | None = None) -> list[PipelineConfig]:
    """Every ensemble in the repository ``root``, as pipelines (sorted by name).

    With ``broken``, a folder whose configuration cannot be read is left out and its
    error kept there by name (``cli/model_sources.left_out`` decides what becomes of it)."""
    from sordino.models.repository import repository_names

    found = []
    for name in repository_names(root):
        try:
            if is_ensemble(root / name):
                found.append(ensemble_pipeline(root / name))
        except ConfigError as exc:
            if broken is None:
                raise
            broken[name] = str(exc)
    return found


def with_ensembles(
    pipelines: tuple[PipelineConfig, ...],
    roots: Path | Sequence[Path] | None,
    broken: dict[str, str] | None = None,
) -> tuple[PipelineConfig, ...]:
    """``pipelines`` and the ensembles of the repository ``roots`` (one or several; a
    name given twice is a :class:`ConfigError`); ``broken`` as for
    :func:`repository_ensembles`."""
    given = () if roots is None else (roots,) if isinstance(roots, Path) else tuple(roots)
    present = [root for root in given if root.is_dir()]
    if not present:
        return pipelines
    found = (*pipelines, *(e for root in present for e in repository_ensembles(root, broken)))
    try:
        reject_repeated_names(
            (p.name for p in found),
            what="pipeline names",
            hint="a repository ensemble takes its folder's name",
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return found


def only_named(
    config: RuntimeConfig,
    names: tuple[str, ...],
    sources: list[ModelSource],
    pipelines: tuple[PipelineConfig, ...],
) -> tuple[list[ModelSource], tuple[PipelineConfig, ...]]:
    """The start-up models of explicit model control, as Triton's ``--load-model``: the
    repository's models and ensembles named (none when ``names`` is empty; ``*`` alone
    is all of them), with the models those ensembles and the ``pipelines`` section run
    (the rest loads on request); models given otherwise (``--model``, ``models:``, the
    built-ins) are kept."""
    roots = config.repositories
    if names and (config.server.model_control_mode != "explicit" or not roots):
        raise ConfigError(
            "--load-model chooses which repository models load at start-up in explicit "
            "model control: add --model-control-mode explicit and --model-repository DIR, "
            "or drop --load-model"
        )
    if "*" in names and len(names) > 1:
        raise ConfigError(
            "--load-model '*' loads every model of the repository: give it alone, or "
            "name the models instead"
        )
    if not roots or "*" in names:
        return sources, pipelines
    repositories = Repositories(roots)
    inside = repositories.holds
    ensembles = {p.name: p for p in pipelines if any((r / p.name).is_dir() for r in roots)}
    known = {s.name for s in sources if inside(s.path)} | set(ensembles)
    unknown = sorted(set(names) - known)
    if unknown:
        raise ConfigError(
            f"--load-model {', '.join(unknown)}: not in {repositories} "
            f"(its models: {', '.join(sorted(known)) or 'none'})"
        )
    # The pipelines section is the configuration's own: the models it runs load.
    todo = [*names, *(n.model for p in pipelines if p.name not in ensembles for n in p.nodes)]
    wanted: set[str] = set()
    while todo:  # an ensemble brings the models it runs, ensembles among them
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo += [node.model for node in ensembles[name].nodes] if name in ensembles else []
    kept = [s for s in sources if s.name in wanted or not inside(s.path)]
    return kept, tuple(p for p in pipelines if p.name in wanted or p.name not in ensembles)
