"""Backends by kind: ``ModelConfig.backend`` names one, :func:`create_backend` builds it.

The built-in kinds are ``onnxruntime`` (an ``.onnx`` file run by ONNX Runtime) and
``python`` (a Triton Python-backend ``model.py``, :mod:`sordino.backends.python`).
Other packages add kinds through the ``sordino.backends`` entry-point group: each entry
point names a :class:`~sordino.backends.base.BackendKind`, or a callable returning one,
and the entry point's name must be the kind's name. Each kind's factory imports its
runtime only when called, so ``import sordino`` never pulls in onnxruntime (or torch).

Entry points are read once per process, on first use (:func:`backend_kinds`); a
broken one is logged and skipped, so one bad plug-in never stops the built-in kinds.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from sordino.backends.base import Backend, BackendKind, BackendOptions, ModelRunOptions
from sordino.backends.reshape import reshapes_of
from sordino.errors import ModelLoadError

if TYPE_CHECKING:
    from sordino.config.models import ModelConfig

__all__ = [
    "ENTRY_POINT_GROUP",
    "backend_kind",
    "backend_kinds",
    "check_backend_kind",
    "create_backend",
    "kind_for_platform",
    "reset_backend_kinds",
    "run_options",
]

log = logging.getLogger("sordino.backends")

ENTRY_POINT_GROUP = "sordino.backends"
"""The entry-point group third-party backend kinds register in."""


def _onnxruntime(options: BackendOptions) -> Backend:
    from sordino.backends.onnx import OnnxBackend

    return OnnxBackend(
        name=options.name,
        version=options.version,
        providers=list(options.providers),
        intra_op_threads=options.intra_op_threads,
        memory=options.memory,
        thread_spinning=options.thread_spinning,
        reshapes=options.reshapes,
        session=options.onnxruntime,
    )


def _python(options: BackendOptions) -> Backend:
    from sordino.backends.python.backend import PythonBackend

    return PythonBackend(options)


BUILTIN: tuple[BackendKind, ...] = (
    BackendKind(
        "onnxruntime",
        _onnxruntime,
        model_files=("model.onnx",),
        suffixes=(".onnx",),
        platforms=("onnxruntime_onnx", "onnxruntime"),
        execution_providers=True,
        description="an ONNX file run by ONNX Runtime",
    ),
    BackendKind(
        "python",
        _python,
        model_files=("model.py",),
        platforms=("python",),
        request_facts=True,
        outputs_as_made=True,
        description="a Triton Python-backend model.py (class TritonPythonModel)",
        warm_up=False,
        profiling=False,
    ),
)

_KINDS: dict[str, BackendKind] | None = None


def backend_kinds() -> dict[str, BackendKind]:
    """Every backend kind this process knows: the built-ins, then the entry points'."""
    global _KINDS
    if _KINDS is None:
        kinds = {kind.name: kind for kind in BUILTIN}
        for point in entry_points(group=ENTRY_POINT_GROUP):
            try:
                loaded = point.load()
                kind = loaded if isinstance(loaded, BackendKind) else loaded()
                if not isinstance(kind, BackendKind):
                    raise TypeError(f"it gave {type(kind).__name__}, not a BackendKind")
                if kind.name != point.name:
                    raise ValueError(f"its kind is named {kind.name!r}; name both alike")
                if kind.name in kinds:
                    raise ValueError(f"backend {kind.name!r} is already defined")
            except Exception as exc:
                log.warning("backend entry point %r (%s) skipped: %s", point.name, point.value, exc)
                continue
            kinds[kind.name] = kind
        _KINDS = kinds
    return _KINDS


def reset_backend_kinds() -> None:
    """Forget the kinds read so far; the next call reads the entry points again (tests)."""
    global _KINDS
    _KINDS = None


def backend_kind(name: str, *, model: str) -> BackendKind:
    """The kind ``name``; :class:`ModelLoadError` naming the known kinds when unknown."""
    kinds = backend_kinds()
    kind = kinds.get(name)
    if kind is None:
        raise ModelLoadError(
            f"model {model}: unknown backend {name!r}; known backends: {', '.join(kinds)}"
        )
    return kind


def check_backend_kind(kind: str, *, model: str) -> BackendKind:
    """Return the kind named ``kind``; raise :class:`ModelLoadError` naming the known kinds."""
    return backend_kind(kind, model=model)


def kind_for_platform(platform: str) -> BackendKind | None:
    """The kind a Triton ``platform`` or ``backend`` value means, or None."""
    for kind in backend_kinds().values():
        if platform == kind.name or platform in kind.platforms:
            return kind
    return None


def run_options(config: ModelConfig) -> ModelRunOptions:
    """What ``config`` tells each of the model's instances' backends, in one value."""
    sequences = config.sequence_batching
    return ModelRunOptions(
        backend=config.backend,
        memory=config.framework_memory,
        thread_spinning=config.thread_spinning,
        triton_config=None if config.triton_config is None else json.dumps(config.triton_config),
        onnxruntime=config.onnxruntime,
        reshapes=reshapes_of(config),
        iterative_sequence=sequences is not None and sequences.iterative_sequence,
    )


def create_backend(
    run: ModelRunOptions,
    *,
    name: str,
    version: str,
    providers: Sequence[str],
    intra_op_threads: int | None,
    index: int = 0,
    own_process: bool = False,
) -> Backend:
    """A new, unloaded backend of ``run.backend``'s kind for one instance (number
    ``index``) of model ``name`` (``load`` comes next).

    ``run`` is what the model's configuration says (:func:`run_options`); ``providers``
    are the execution providers to try in order (for ONNX Runtime), ``intra_op_threads``
    the device's thread count; ``own_process``: the instance runs in a process of its own
    (a worker or a Ray actor). Raises :class:`ModelLoadError` for a kind this build does
    not know.
    """
    options = BackendOptions(
        name=name,
        version=version,
        providers=tuple(providers),
        intra_op_threads=intra_op_threads,
        memory=run.memory,
        thread_spinning=run.thread_spinning,
        index=index,
        triton_config=run.triton_config,
        own_process=own_process,
        reshapes=run.reshapes,
        onnxruntime=run.onnxruntime,
        iterative_sequence=run.iterative_sequence,
    )
    return backend_kind(run.backend, model=name).create(options)
