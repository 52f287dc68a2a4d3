"""The records model control keeps and shows, and the checks it makes of a name
(:mod:`sordino.server.model_control`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from sordino.config import ModelConfig
from sordino.errors import InvalidRequest
from sordino.models.repository import ModelSource, is_model_name

__all__ = ["IndexEntry", "ModelControlStatistics", "Stamp", "check_name", "stamp"]

Stamp = tuple[str, int, int, tuple[int, int], ModelConfig]

_FOLDER_ENTRIES = 10_000
"""Files of a model's folder looked at for its newest change (a folder of more, such as
a packed environment unpacked in place, is stamped by its first ones)."""


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One row of the repository index: a model version and its state.

    ``state`` is READY, LOADING, UNLOADING or UNAVAILABLE (Triton's names), and
    ``reason`` says why one is UNAVAILABLE; a model never loaded has neither a version
    nor a state, as on Triton.
    """

    name: str
    version: str
    state: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ModelControlStatistics:
    """Counters of the control operations since start-up."""

    mode: str
    loads: int
    reloads: int
    unloads: int
    failures: int
    polls: int


def check_name(name: str) -> None:
    """Refuse anything but a model name: a name is looked up, never used as a path."""
    if not is_model_name(name):
        shown = repr(name) if len(name) <= 60 else repr(name[:57]) + "…"
        raise InvalidRequest(
            f"{shown} is not a model name: use letters, digits, '_', '.' and '-', starting "
            "with a letter or digit (no '/', no '..')"
        )


def stamp(source: ModelSource) -> Stamp | None:
    """What identifies a model version cheaply: its file's path, modification time and
    size, the newest change in its model's folder, and its configuration as read now.

    As on Triton, a file added, removed or edited anywhere in a repository model's
    folder (``config.pbtxt`` — whose ``parameters`` only a Python model reads —, a
    module beside ``model.py``, a labels file) makes a load, or a poll, reload it.
    """
    try:
        stat = source.path.stat()
    except OSError:
        return None
    return (str(source.path), stat.st_mtime_ns, stat.st_size, _newest(source), source.config)


def _newest(source: ModelSource) -> tuple[int, int]:
    """The newest modification time (ns) of the files in the model's folder (``NAME/``
    above the version folder) and a digest of their names (a file removed changes it);
    (0, 0) when the model file is not in a folder of the model's name (a configured
    file, a built-in model). ``__pycache__`` is left out: importing ``model.py`` writes
    it, and a load must not make the next one reload."""
    folder = next((p for p in source.path.parents[:2] if p.name == source.name), None)
    if folder is None:
        return (0, 0)
    newest, stack = 0, [folder.as_posix()]
    names: list[str] = []
    try:
        while stack and len(names) < _FOLDER_ENTRIES:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name != "__pycache__":
                            stack.append(entry.path)
                        continue
                    names.append(entry.path)
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime_ns)
    except OSError:  # removed while looked at: what was seen stands
        pass
    return (newest, hash(tuple(sorted(names))))
