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


ONE_INT32 = """backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""
"""A Python model's ``config.pbtxt``: one INT32 ``X`` in, one INT32 ``Y`` out, no batching."""


def write_python_model(root: Path, name: str, source: str, config: str = ONE_INT32) -> Path:
    """Write the model folder ``root/name``: ``config.pbtxt`` and ``1/model.py``."""
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    (root / name / "1" / "model.py").write_text(source)
    return root / name
