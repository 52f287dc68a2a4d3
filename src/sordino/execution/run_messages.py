"""The frames of a batch, of a command and of the worker's life (see ``execution/messages.py``).

A batch: :class:`Run`, then :class:`Alloc`/:class:`Allocated` when an output needs
space, ended by :class:`Done` or :class:`RunFailed`. A command between batches:
:class:`Call` carrying a :data:`Command`, answered by :class:`Reply` or
:class:`CallFailed`. The worker's life: :class:`Ready` or :class:`LoadFailed`,
:class:`Heartbeat`, and :class:`Stop`. A model's own readiness, at any time (beside a
batch): :class:`ReadyCheck`, answered by :class:`ReadyAnswer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from sordino.execution.faults import FaultAction
from sordino.inference import ModelMetadata, RequestFacts
from sordino.memory.tensors import TensorHandle

__all__ = [
    "HEARTBEAT",
    "STOP",
    "Alloc",
    "Allocated",
    "Call",
    "CallFailed",
    "Command",
    "Done",
    "Heartbeat",
    "LoadFailed",
    "LogChange",
    "ProfileStart",
    "ProfileStop",
    "ProfileStopped",
    "Ready",
    "ReadyAnswer",
    "ReadyCheck",
    "Reply",
    "Run",
    "RunFailed",
    "Stop",
]

# -- server to worker ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Run:
    """Run one batch: inputs in the arena, and space reserved for outputs of known size."""

    batch_id: int
    inputs: dict[str, TensorHandle]
    space: dict[str, TensorHandle]
    fault: FaultAction | None
    segment: str = ""
    """The arena segment the handles name; when it is not the one the worker maps
    (the pool was resized), the worker maps this one first. Empty: unchanged."""
    rows: tuple[int, ...] = ()
    """The rows of each request in the batch, in order, for a backend that runs a batch
    as its requests (Triton's Python backend); empty when the batch is one part."""
    requests: tuple[RequestFacts, ...] = ()
    """Each request's facts (id, correlation ID, parameters, ...), in order, for a
    worker whose backend takes them (:attr:`Ready.per_request`); else empty."""


@dataclass(frozen=True, slots=True)
class Allocated:
    """The answer to :class:`Alloc`: space for each output that asked for it, or why
    there is none (``refused``: the outputs are larger than the arena can hold); the
    worker then fails that batch alone and serves on."""

    batch_id: int
    space: dict[str, TensorHandle]
    refused: str = ""


@dataclass(frozen=True, slots=True)
class ProfileStart:
    """Serve later batches from a profiling session; its trace file starts with ``prefix``."""

    name: ClassVar[str] = "profile_start"
    prefix: str


@dataclass(frozen=True, slots=True)
class ProfileStop:
    """Put the serving session back; the reply is :class:`ProfileStopped`."""

    name: ClassVar[str] = "profile_stop"


@dataclass(frozen=True, slots=True)
class LogChange:
    """Log as the server now does (the logging extension's settings, by name)."""

    name: ClassVar[str] = "log_change"
    settings: tuple[tuple[str, Any], ...]


Command = ProfileStart | ProfileStop | LogChange
"""What :class:`Call` may carry."""


@dataclass(frozen=True, slots=True)
class Call:
    """Carry out ``command`` between batches; answered by :class:`Reply` or :class:`CallFailed`."""

    call_id: int
    command: Command


@dataclass(frozen=True, slots=True)
class Stop:
    """Exit now."""


STOP = Stop()

# -- worker to server ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """The model is loaded and warm: its metadata, the worker's pid and the load time."""

    metadata: ModelMetadata
    pid: int
    load_s: float
    per_request: bool = False
    """Whether the backend runs a batch as its requests and takes their facts
    (:class:`~sordino.backends.base.RequestBatchBackend`): only then do batches carry
    them (:attr:`Run.requests`), so the hop of other models costs nothing more."""
    checks_ready: bool = False
    """Whether the model checks its own readiness (Triton's ``is_ready()``): only then
    does the server send :class:`ReadyCheck`, which a thread of the worker reads."""


@dataclass(frozen=True, slots=True)
class LoadFailed:
    """The model could not be loaded or warmed up; the worker exits after this."""

    message: str


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The worker is alive (sent every ``heartbeat_s`` by a thread of its own)."""


HEARTBEAT = Heartbeat()


@dataclass(frozen=True, slots=True)
class Alloc:
    """Batch ``batch_id`` needs arena space of these sizes (bytes) for these outputs."""

    batch_id: int
    sizes: dict[str, int]


@dataclass(frozen=True, slots=True)
class Done:
    """Batch ``batch_id`` ran: its outputs' handles and the seconds the model took."""

    batch_id: int
    outputs: dict[str, TensorHandle]
    infer_s: float


@dataclass(frozen=True, slots=True)
class RunFailed:
    """Batch ``batch_id`` failed: ``kind`` is ``"oom"`` (a MemoryError), ``"fault"`` (an
    injected chaos fault) or ``"error"`` (the model raised)."""

    batch_id: int
    kind: str
    message: str


@dataclass(frozen=True, slots=True)
class ProfileStopped:
    """The reply to :class:`ProfileStop`: the trace file and the batches it covers."""

    path: str
    batches: int


@dataclass(frozen=True, slots=True)
class Reply:
    """Command ``call_id`` succeeded with ``value`` (None, or a reply record above)."""

    call_id: int
    value: ProfileStopped | None


@dataclass(frozen=True, slots=True)
class CallFailed:
    """Command ``call_id`` raised; ``message`` names the command and the error."""

    call_id: int
    message: str


@dataclass(frozen=True, slots=True)
class ReadyCheck:
    """Is the model ready? (Its ``is_ready()``; sent at any time, even while a batch runs,
    to a worker whose :class:`Ready` said ``checks_ready``.)"""

    check_id: int


@dataclass(frozen=True, slots=True)
class ReadyAnswer:
    """The answer to :class:`ReadyCheck` ``check_id``: ``why`` the model is not ready, or
    None when it is."""

    check_id: int
    why: str | None
