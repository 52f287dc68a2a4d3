"""The records model control keeps and shows, and the checks it makes of a name
(:mod:`sordino.server.model_control`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from sordino.backends.pbtxt import read_pbtxt
from sordino.config import ModelConfig
from sordino.errors import InvalidRequest, SordinoError
from sordino.models.repository import ModelSource, is_model_name

__all__ = [
    "IndexEntry",
    "ModelControlStatistics",
    "PollFailures",
    "Stamp",
    "check_name",
    "stamp",
]


_CONFIG_FILES = frozenset({"config.pbtxt", "config.yaml"})
_FOLDER_ENTRIES = 10_000
"""Files of a model's folder looked at for its newest change (a folder of more, such as
a packed environment unpacked in place, is stamped by its first ones)."""


@dataclass(frozen=True, slots=True)
class Stamp:
    """What identifies a loaded model version cheaply (see :func:`stamp`)."""

    files: tuple[str, int, int, int, int]
    """Its model file's path, modification time and size; the newest change among the
    other files of its model's folder, and a digest of their names."""
    config: ModelConfig
    triton: str
    """Its folder's ``config.pbtxt`` as read now (JSON), ``instance_group`` aside."""

    def instances_only(self, before: Stamp) -> bool:
        """Whether this differs from ``before`` in the instance count alone: Triton then
        updates the model's instances instead of reloading it."""
        count = self.config.instance_count
        return (
            self.files == before.files
            and self.triton == before.triton
            and count != before.config.instance_count
            and before.config.model_copy(update={"instance_count": count}) == self.config
        )


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
    updates: int = 0
    """Versions whose instance count alone changed, updated without a reload."""


def check_name(name: str) -> None:
    """Refuse anything but a model name: a name is looked up, never used as a path."""
    if not is_model_name(name):
        shown = repr(name) if len(name) <= 60 else repr(name[:57]) + "…"
        raise InvalidRequest(
            f"{shown} is not a model name: use ASCII letters, digits, '_', '.' and '-', starting "
            "with a letter or digit (no '/', no '..')"
        )


def stamp(source: ModelSource) -> Stamp | None:
    """What identifies a model version cheaply: its file's path, modification time and
    size, the newest change in its model's folder, and its configuration as read now.

    As on Triton, a file added, removed or edited anywhere in a repository model's
    folder (``config.pbtxt`` — whose ``parameters`` only a Python model reads —, a
    module beside ``model.py``, a labels file) makes a load, or a poll, reload it; one
    whose configuration changed in its instance count alone updates it instead
    (:meth:`Stamp.instances_only`).
    """
    try:
        stat = source.path.stat()
    except OSError:
        return None
    folder = next((p for p in source.path.parents[:2] if p.name == source.name), None)
    newest, names = _newest(folder) if folder is not None else (0, 0)
    files = (str(source.path), stat.st_mtime_ns, stat.st_size, newest, names)
    return Stamp(files, source.config, _triton(folder) if folder is not None else "")


def _newest(folder: Path) -> tuple[int, int]:
    """The newest modification time (ns) of the files in a model's folder (``NAME/``
    above the version folder) and a digest of their names (a file removed changes it).
    Its configuration files are left out (:class:`Stamp` compares what they say), and
    ``__pycache__``: importing ``model.py`` writes it, and a load must not make the
    next one reload."""
    root = folder.as_posix()
    newest, stack = 0, [root]
    names: list[str] = []
    try:
        while stack and len(names) < _FOLDER_ENTRIES:
            where = stack.pop()
            with os.scandir(where) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name != "__pycache__":
                            stack.append(entry.path)
                        continue
                    if where == root and entry.name in _CONFIG_FILES:
                        continue
                    names.append(entry.path)
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime_ns)
    except OSError:  # removed while looked at: what was seen stands
        pass
    return (newest, hash(tuple(sorted(names))))


def _triton(folder: Path) -> str:
    """The folder's ``config.pbtxt`` as Triton's JSON form, ``instance_group`` aside
    ("" without one; its text when it cannot be read, which the load then says)."""
    path = folder / "config.pbtxt"
    if not path.is_file():
        return ""
    try:
        config = read_pbtxt(path)
    except SordinoError as exc:
        return str(exc)
    config.pop("instance_group", None)
    return json.dumps(config, sort_keys=True)


class PollFailures:
    """What a repository poll remembers of the models it could not follow.

    As Triton's poll, a model whose files failed to load is tried again once they
    change, not at every poll (each try starts a worker that fails the same way), and
    a failure is logged once, not at every poll; its state says why meanwhile.
    """

    def __init__(self) -> None:
        self._tried: dict[str, tuple[Stamp | None, ...]] = {}
        self._said: dict[str, str] = {}

    def unchanged(self, name: str, sources: list[ModelSource]) -> bool:
        """Whether ``sources`` are the files that failed the last try (skip them)."""
        tried = self._tried.get(name)
        return tried is not None and tried == tuple(stamp(s) for s in sources)

    def failed(self, name: str, sources: list[ModelSource] | None, message: str) -> bool:
        """Note a failure (``sources`` None: its configuration could not be read);
        return whether to log it: not when the last poll said the same."""
        if sources is not None:
            self._tried[name] = tuple(stamp(s) for s in sources)
        said, self._said[name] = self._said.get(name), message
        return said != message

    def followed(self, name: str) -> None:
        """The model's files loaded: forget its failure."""
        self._tried.pop(name, None)
        self._said.pop(name, None)

    def keep(self, present: list[str]) -> None:
        """Forget the models no longer in the repository (back, they are tried again)."""
        for name in set(self._tried) | set(self._said):
            if name not in present:
                self.followed(name)
