"""The records model control keeps and shows, and the checks it makes of a name
(:mod:`sordino.server.model_control`)."""

from __future__ import annotations

from dataclasses import dataclass

from sordino.config import ModelConfig
from sordino.errors import InvalidRequest
from sordino.models.repository import ModelSource, is_model_name

__all__ = ["IndexEntry", "ModelControlStatistics", "Stamp", "check_name", "stamp"]

Stamp = tuple[str, int, int, ModelConfig]


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
    size, and its configuration as read now (``config.yaml`` or ``config.pbtxt``: an
    edited one makes a load, or a poll, reload the model, as on Triton)."""
    try:
        stat = source.path.stat()
    except OSError:
        return None
    return (str(source.path), stat.st_mtime_ns, stat.st_size, source.config)
