"""The messages between the server and a worker process, one frozen dataclass each.

Both ends of the pipe (``execution/worker.py`` in the server, ``execution/worker_main.py``
in the worker) send these and ``match`` on their type. They are small and picklable:
tensor data never crosses the pipe, only :class:`TensorHandle` objects naming places
in the shared-memory arena.

Start-up. The worker maps the arena, loads its model and runs warm-up batches, then
says :class:`Ready` (or :class:`LoadFailed` and exits). From then on a heartbeat
thread sends :class:`Heartbeat` every ``heartbeat_s``.

The pipe carries one exchange at a time, and the server never starts a second one
before the first has ended:

- a batch: the server sends :class:`Run` with the input handles and output space it
  reserved for outputs of known size. If an output does not fit, the worker sends
  :class:`Alloc` with the sizes it needs and reads the pipe for the answer alone; the
  server replies :class:`Allocated` (or :class:`Stop` when it is going away). The
  batch ends with :class:`Done` (the output handles and the model's time) or
  :class:`RunFailed` (the model raised; ``kind`` is ``"oom"`` for a MemoryError).
- a command, between batches: the server sends :class:`Call` with a ``call_id`` and a
  :data:`Command`; the worker answers :class:`Reply` or :class:`CallFailed`. The
  commands are :class:`ProfileStart` (serve from a profiling session whose trace file
  starts with ``prefix``; replies None) and :class:`ProfileStop` (put the serving
  session back; replies :class:`ProfileStopped`).

:class:`Stop` asks the worker to exit. The server's end closing (end of file) means
the same; the worker's end closing tells the server the process is gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sordino.execution.faults import FaultAction
from sordino.inference import ModelMetadata
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
    "FromWorker",
    "Heartbeat",
    "LoadFailed",
    "ProfileStart",
    "ProfileStop",
    "ProfileStopped",
    "Ready",
    "Reply",
    "Run",
    "RunFailed",
    "Stop",
    "ToWorker",
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


@dataclass(frozen=True, slots=True)
class Allocated:
    """The answer to :class:`Alloc`: space for each output that asked for it."""

    batch_id: int
    space: dict[str, TensorHandle]


@dataclass(frozen=True, slots=True)
class ProfileStart:
    """Serve later batches from a profiling session; its trace file starts with ``prefix``."""

    name: ClassVar[str] = "profile_start"
    prefix: str


@dataclass(frozen=True, slots=True)
class ProfileStop:
    """Put the serving session back; the reply is :class:`ProfileStopped`."""

    name: ClassVar[str] = "profile_stop"


Command = ProfileStart | ProfileStop
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

ToWorker = Run | Allocated | Call | Stop

# -- worker to server ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """The model is loaded and warm: its metadata, the worker's pid and the load time."""

    metadata: ModelMetadata
    pid: int
    load_s: float


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


FromWorker = Ready | LoadFailed | Heartbeat | Alloc | Done | RunFailed | Reply | CallFailed
