"""Loading a Python model's backend directly, in the test's own process (no server)."""

from __future__ import annotations

from pathlib import Path

from sordino.backends.base import Backend, ModelRunOptions
from sordino.backends.registry import create_backend


def load_python_backend(folder: Path, *, own_process: bool = True, device: str = "cpu") -> Backend:
    """The Python backend for model folder ``folder`` (version 1), loaded on ``device``."""
    backend = create_backend(
        ModelRunOptions("python"),
        name=folder.name,
        version="1",
        providers=(),
        intra_op_threads=None,
        own_process=own_process,
    )
    backend.load(folder / "1" / "model.py", device)
    return backend
