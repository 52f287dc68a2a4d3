"""Backends by kind: ``ModelConfig.backend`` names one, :func:`create_backend` builds it.

Each kind maps to a small factory that imports its runtime only when called, so
``import sordino`` never pulls in onnxruntime (or, later, torch). Adding a backend
means adding one factory here and one value to the ``backend`` field of the config.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sordino.backends.base import Backend
from sordino.config.memory import FrameworkMemoryConfig
from sordino.errors import ModelLoadError

__all__ = ["BACKEND_KINDS", "check_backend_kind", "create_backend"]

Factory = Callable[[str, str, list[str], int | None, FrameworkMemoryConfig | None, bool], Backend]


def _onnxruntime(
    name: str,
    version: str,
    providers: list[str],
    intra_op_threads: int | None,
    memory: FrameworkMemoryConfig | None,
    thread_spinning: bool,
) -> Backend:
    from sordino.backends.onnx import OnnxBackend

    return OnnxBackend(
        name=name,
        version=version,
        providers=providers,
        intra_op_threads=intra_op_threads,
        memory=memory,
        thread_spinning=thread_spinning,
    )


_FACTORIES: dict[str, Factory] = {"onnxruntime": _onnxruntime}

BACKEND_KINDS: tuple[str, ...] = tuple(_FACTORIES)
"""The backend kinds this build knows, in the order they were added."""


def check_backend_kind(kind: str, *, model: str) -> Factory:
    """Return the factory of ``kind``; raise :class:`ModelLoadError` naming the known kinds."""
    factory = _FACTORIES.get(kind)
    if factory is None:
        raise ModelLoadError(
            f"model {model}: unknown backend {kind!r}; known backends: {', '.join(BACKEND_KINDS)}"
        )
    return factory


def create_backend(
    kind: str,
    *,
    name: str,
    version: str,
    providers: Sequence[str],
    intra_op_threads: int | None,
    memory: FrameworkMemoryConfig | None = None,
    thread_spinning: bool = False,
) -> Backend:
    """A new, unloaded backend of ``kind`` for model ``name`` (``load`` comes next).

    ``providers`` are the execution providers to try in order (for ONNX Runtime);
    ``memory`` configures its arenas (only in a worker process of the model's own);
    ``thread_spinning`` lets its threads busy-wait for work (``ModelConfig.thread_spinning``).
    Raises :class:`ModelLoadError` for a kind this build does not know.
    """
    factory = check_backend_kind(kind, model=name)
    return factory(name, version, list(providers), intra_op_threads, memory, thread_spinning)
