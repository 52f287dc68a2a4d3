"""The backend contract: what a model runtime must do, and nothing about serving.

A backend never sees HTTP, tenants, queues or priorities. It loads a model, tells
what tensors it takes and gives, runs one batch at a time, and unloads.

Streaming models (several responses per request: progress, partial results, tokens)
use the same contract, run step by step. A step model's :class:`ModelMetadata` carries
a :class:`StreamSpec`; each call to ``infer`` is one step for a batch of requests, and
every step's outputs are one response to each request in the batch. The runtime feeds
the ``carry`` outputs back as the next step's inputs until the ``done`` output is true.
Each step is a separate work item for the scheduler, so requests at different steps
share batches, priorities apply at every step, and a cancelled stream stops between
steps. A backend can declare its own StreamSpec; for ONNX models it comes from the
model's ``streaming:`` configuration.

A backend that can profile its operators also satisfies :class:`ProfilingBackend`;
the runtime checks for it before it starts a profiling window.

A backend *kind* (:class:`BackendKind`) is what ``ModelConfig.backend`` names: the
files a repository version folder must hold for it, the Triton ``platform`` /
``backend`` names it answers to, whether its devices are ONNX Runtime provider lists,
and the factory that builds an unloaded backend from :class:`BackendOptions`. The
built-in kinds and those other packages register (the ``sordino.backends`` entry-point
group) are listed by :mod:`sordino.backends.registry`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from sordino.backends.reshape import Reshapes
from sordino.config.memory import FrameworkMemoryConfig
from sordino.config.onnxruntime import OnnxRuntimeOptions
from sordino.inference import ModelMetadata, RequestFacts, Tensor

__all__ = [
    "WARMUP_SHAPE",
    "Backend",
    "BackendKind",
    "BackendOptions",
    "BackendStatistics",
    "ModelRunOptions",
    "OutputPlacer",
    "ProfilingBackend",
    "ReadinessBackend",
    "RequestBatchBackend",
    "readiness_of",
]

WARMUP_SHAPE = "sordino.warmup_shape."
"""Prefix of the ONNX metadata property naming an input's warm-up shape (dummy_inputs)."""


@dataclass(frozen=True, slots=True)
class BackendStatistics:
    """Counters a backend keeps about its own work."""

    batches: int
    items: int
    failures: int
    busy_seconds: float


class Backend(Protocol):
    """A loaded model that runs batches.

    ``infer`` is called from a worker thread, one batch at a time per backend
    instance; it must not touch the event loop.
    """

    @property
    def metadata(self) -> ModelMetadata: ...

    def load(self, model_path: Path, device: str) -> None:
        """Load the model from ``model_path`` onto ``device`` (``cpu``, ``cuda:0``, ...)."""
        ...

    def infer(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Run one batch; return every output the model declares, keyed by name."""
        ...

    def unload(self) -> None:
        """Release the model's resources. The backend is unusable afterwards."""
        ...

    def statistics(self) -> BackendStatistics:
        """Return a snapshot of this backend's counters."""
        ...


@dataclass(frozen=True, slots=True)
class ModelRunOptions:
    """What a model's configuration tells each of its instances' backends, as one value
    (picklable: it crosses whole to a worker process or a Ray actor), built once from
    the :class:`~sordino.config.ModelConfig` by
    :func:`sordino.backends.registry.run_options`.

    ``backend`` is the kind (``ModelConfig.backend``); the rest are the fields of
    :class:`BackendOptions` of the same names.
    """

    backend: str = "onnxruntime"
    memory: FrameworkMemoryConfig | None = None
    thread_spinning: bool = False
    triton_config: str | None = None
    onnxruntime: OnnxRuntimeOptions | None = None
    reshapes: Reshapes | None = None
    iterative_sequence: bool = False


@dataclass(frozen=True, slots=True)
class BackendOptions:
    """What a backend factory gets to build one model instance (picklable).

    ``providers`` are ONNX Runtime execution providers (a backend whose kind has
    ``execution_providers`` False gets the device's list, which only tells CPU from
    CUDA); ``memory`` configures ONNX Runtime's arenas (only in a worker process of
    the model's own); ``index`` is the instance's number among the model's instances.
    """

    name: str
    version: str
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    intra_op_threads: int | None = None
    memory: FrameworkMemoryConfig | None = None
    thread_spinning: bool = False
    index: int = 0
    triton_config: str | None = None
    """The model's Triton configuration as JSON text, given with a model-control load
    (``ModelConfig.triton_config``): read instead of the folder's ``config.pbtxt``."""
    onnxruntime: OnnxRuntimeOptions | None = None
    """ONNX Runtime's session options (the model's ``onnxruntime``)."""
    reshapes: Reshapes | None = None
    """Inputs and outputs clients see in another shape than the model's (Triton's
    ``reshape``, from the model's declared ``input`` and ``output``)."""
    own_process: bool = False
    """Whether the instance has a worker process of its own (it may change the process:
    a Python model's ``EXECUTION_ENV_PATH`` goes first on its ``sys.path``)."""
    iterative_sequence: bool = False
    """The model may run a request again in a later batch (``sequence_batching {
    iterative_sequence: true }``: Triton's request rescheduling)."""


@dataclass(frozen=True, slots=True)
class BackendKind:
    """One kind of model runtime, as ``ModelConfig.backend`` names it.

    ``model_files`` are the file names a version folder may hold for this kind, the
    first the default (``model.onnx``; ``model.py``); ``suffixes`` let a folder holding
    exactly one file with such a suffix serve it under another name. ``platforms`` are
    the Triton ``platform``/``backend`` values (``config.pbtxt``) meaning this kind.
    ``execution_providers`` tells whether the model's ``execution_providers`` and the
    devices' provider lists are this runtime's (ONNX Runtime) or only say CPU or CUDA.
    ``request_facts`` tells whether its models read each request's facts (a
    :class:`RequestBatchBackend` that hands them to the model): only for such models
    does the server build them per request.
    ``create`` imports the runtime only when called, so listing kinds stays cheap.
    ``warm_up`` False: the runtime runs no warm-up batches (dummy inputs) through the
    model before it serves, for model code that acts on what it gets (a Triton Python
    model may call other models, not loaded yet, with them; Triton runs ``execute``
    only for requests). ``outputs_as_made``: an output the model returns in another
    datatype than it declares is answered in the datatype it has (Triton's Python
    backend reports what ``execute`` returned; sordino's own backends never differ,
    and an answer that does is otherwise refused as the server's failure).
    ``profiling`` False: its models have no operators to trace, and ``sordino profile``
    is refused up front; True asks the instances, whose backend must then be a
    :class:`ProfilingBackend`.
    """

    name: str
    create: Callable[[BackendOptions], Backend]
    model_files: tuple[str, ...]
    suffixes: tuple[str, ...] = ()
    platforms: tuple[str, ...] = ()
    request_facts: bool = field(default=False, kw_only=True)
    outputs_as_made: bool = field(default=False, kw_only=True)
    execution_providers: bool = False
    description: str = ""
    warm_up: bool = True
    profiling: bool = True

    def model_file(self, folder: Path) -> Path | str:
        """The file of ``folder`` this kind serves, or why there is none (a message)."""
        for filename in self.model_files:
            if (folder / filename).is_file():
                return folder / filename
        candidates = sorted(
            p for suffix in self.suffixes for p in folder.glob(f"*{suffix}") if p.is_file()
        )
        if len(candidates) == 1:
            return candidates[0]
        default = self.model_files[0]
        kind = "/".join(self.suffixes) or default
        if candidates:
            return f"several {kind} files in {folder}; name the one to serve {default}"
        return f"no {kind} file in {folder} (expected {default})"


OutputPlacer = Callable[[dict[str, tuple[np.dtype[Any], tuple[int, ...]]]], dict[str, Tensor]]
"""Where a batch's outputs are to lie: given the dtype and shape of each output to
place, a writable array of that dtype and shape for each (a view of the arena) that
the backend fills and returns as that output. Outputs it leaves out (or is not asked
for) the backend returns as usual. Called at most once a batch, on the batch's thread."""


@runtime_checkable
class RequestBatchBackend(Protocol):
    """A backend that runs a batch as the requests it joins (Triton's ``execute``).

    The runtime calls ``infer_requests`` instead of ``infer`` when a batch joins
    several requests, or when it knows the facts of the batch's requests; ``rows`` are
    each request's rows, in order, summing to the batch's (empty: the batch is one
    request). ``facts`` are each request's :class:`~sordino.inference.RequestFacts`
    (id, correlation ID, parameters, ...), in the same order, one per request; empty
    when the runtime knows none (warm-up batches). ``cancelled(index)`` tells, while
    the batch runs and from any thread, whether request ``index``'s client has gone
    (Triton's ``is_cancelled()``); None: never. ``place`` (:data:`OutputPlacer`), when
    given, is where the outputs are to lie (a worker process's arena): the backend may
    ask it once, after the model ran, for an array per output to write that output
    into, so that each response's tensor is copied once, straight into its rows. A
    request the model answered with an error has no rows in the outputs; the output
    :data:`~sordino.inference.REQUEST_ERRORS` then says which and why. An output
    some responses lack has filler rows for their requests, named in
    :data:`~sordino.inference.REQUEST_ABSENT` (one no response has is left out). An
    output whose requests' tensors are not rows of one tensor (other dimensions, another
    datatype or row count) is left out too, each request's own in
    :data:`~sordino.inference.REQUEST_APART`.
    """

    def infer_requests(
        self,
        batch: dict[str, Tensor],
        rows: Sequence[int],
        facts: Sequence[RequestFacts] = (),
        cancelled: Callable[[int], bool] | None = None,
        place: OutputPlacer | None = None,
    ) -> dict[str, Tensor]:
        """Run one batch of ``len(rows)`` requests (one if empty); return every output."""
        ...


@runtime_checkable
class ProfilingBackend(Protocol):
    """The profiling switch of a backend that can trace the operators of its batches.

    ``isinstance(backend, ProfilingBackend)`` tells whether a backend has it (on
    Python 3.11 that reads ``profiling``, which must therefore be a cheap flag).
    """

    @property
    def profiling(self) -> bool:
        """Whether batches are being profiled now."""
        ...

    def start_profiling(self, prefix: str) -> None:
        """Trace later batches into a file whose name starts with ``prefix``."""
        ...

    def stop_profiling(self) -> tuple[str, int]:
        """Stop tracing; return the trace file and the batches traced."""
        ...


@runtime_checkable
class ReadinessBackend(Protocol):
    """A backend whose model may say itself whether it is ready (Triton's ``is_ready()``).

    ``checks_readiness`` (a cheap flag, read once the model loaded) is False when the
    model has no such check: it is then ready while its instance serves, and
    ``readiness`` is never asked. ``readiness()`` runs the model's check on the calling
    thread (never the batch's): None when ready, else why not."""

    @property
    def checks_readiness(self) -> bool: ...

    def readiness(self) -> str | None: ...


def readiness_of(backend: ReadinessBackend) -> str | None:
    """``backend.readiness()``, a failure of the check itself (not the model's: that is
    its answer already) given as the reason — what every kind of instance answers."""
    try:
        return backend.readiness()
    except Exception as exc:
        return f"the readiness check failed: {type(exc).__name__}: {exc}"


def dummy_inputs(metadata: ModelMetadata, rows: int) -> dict[str, Tensor]:
    """Zero-filled inputs (``BYTES``: ``"0"``) of ``rows`` rows, for warm-ups.

    Variable dimensions have size 1, or the size the model file names in its metadata
    property ``sordino.warmup_shape.<input>`` (comma-separated sizes, one per dimension).
    """
    import numpy as np

    from sordino.datatypes import to_numpy_dtype

    batch: dict[str, Tensor] = {}
    for spec in metadata.inputs:
        dims = [max(d, 1) for d in spec.shape]
        hint = metadata.extra.get(WARMUP_SHAPE + spec.name, "").split(",")
        if len(hint) == len(dims) and all(h.strip().isdigit() for h in hint):
            dims = [d if d > 0 else max(int(h), 1) for d, h in zip(spec.shape, hint, strict=True)]
        if metadata.batched:
            dims[0] = rows
        if spec.datatype == "BYTES":
            # "0", not "": a model that parses its strings as numbers warms up too.
            batch[spec.name] = np.full(dims, b"0", dtype=object)
        else:
            batch[spec.name] = np.zeros(dims, dtype=to_numpy_dtype(spec.datatype))
    return batch
