"""Several model repositories served together, as Triton's ``--model-repository`` given
more than once: their models side by side, each name in one repository only.

A name found in two repositories is refused when it is looked up (:meth:`root_of`, at
start-up by :func:`scan_repositories`), naming both, as Triton refuses such a model;
the other models serve. The repositories' order is kept (the index lists names
sorted, as one repository's).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sordino.errors import ConfigError, ModelLoadError
from sordino.models.repository import (
    ModelSource,
    load_repository_model,
    repository_names,
    scan_repository,
)

__all__ = ["Repositories", "scan_repositories"]


class Repositories:
    """The model repositories of a server (none, one or several)."""

    def __init__(self, roots: Sequence[Path]) -> None:
        self.roots = tuple(roots)

    def __bool__(self) -> bool:
        return bool(self.roots)

    def __str__(self) -> str:
        shown = ", ".join(str(root) for root in self.roots)
        return f"the model repositor{'y' if len(self.roots) == 1 else 'ies'} {shown}"

    def names(self) -> list[str]:
        """Every model folder of every repository (sorted; a name in two once)."""
        return sorted({name for root in self.roots for name in repository_names(root)})

    def root_of(self, name: str) -> Path | None:
        """The repository holding model folder ``name`` (None: none does);
        ModelLoadError when two do."""
        holders = [root for root in self.roots if name in repository_names(root)]
        if len(holders) > 1:
            raise ModelLoadError(_twice(name, holders))
        return holders[0] if holders else None

    def folder(self, name: str) -> Path | None:
        """Model ``name``'s folder (None: no repository has it)."""
        root = self.root_of(name)
        return None if root is None else root / name

    def twice(self) -> set[str]:
        """The model names in more than one of the repositories."""
        seen: set[str] = set()
        found: set[str] = set()
        for root in self.roots:
            names = set(repository_names(root))
            found |= seen & names
            seen |= names
        return found

    def holds(self, path: Path) -> bool:
        """Whether ``path`` lies in one of the repositories."""
        return any(path.is_relative_to(root) for root in self.roots)


def scan_repositories(
    roots: Sequence[Path], broken: dict[str, str] | None = None
) -> list[ModelSource]:
    """Every model version the repositories hold (:func:`scan_repository` of each); a
    name in two of them is a ModelLoadError naming both.

    With ``broken``, a model whose folder cannot be read (a configuration that does not
    parse, no model file) is left out and its error kept there by name, instead of
    raised (``cli/model_sources.left_out`` decides what becomes of it).
    """
    seen: dict[str, Path] = {}
    for root in roots:
        for name in repository_names(root):
            if name in seen:
                raise ModelLoadError(_twice(name, [seen[name], root]))
            seen[name] = root
    if broken is None:
        return [source for root in roots for source in scan_repository(root)]
    from sordino.models.ensembles import is_ensemble

    sources: list[ModelSource] = []
    for name, root in seen.items():
        try:
            if not is_ensemble(root / name):
                sources += load_repository_model(root, name)
        except (ModelLoadError, ConfigError) as exc:
            broken[name] = str(exc)
    return sources


def _twice(name: str, roots: Sequence[Path]) -> str:
    return (
        f"model {name!r} is in more than one model repository ({', '.join(map(str, roots))}): "
        "a name may be in one only, as on Triton; rename or remove one of the folders"
    )
