"""The messages between the server and a worker process, one frozen dataclass each.

Both ends of the pipe (``execution/worker.py`` in the server, ``execution/worker_main.py``
in the worker) send these and ``match`` on their type. They are small: tensor data
never crosses the pipe, only :class:`TensorHandle` objects naming places in the
shared-memory arena.

On the wire (a socket pair) each message is one frame, :func:`encode` writes it and
:class:`FrameReader` reads it back from reads of any size: a 5-byte header (body length,
``uint32`` little-endian; kind, ``uint8``) and the body. The messages of every batch
(:class:`Run`, :class:`Done`, :class:`RunFailed`, :class:`Alloc`, :class:`Allocated`)
and :class:`Heartbeat`/:class:`Stop` have struct layouts of their own, no pickle: ids
``uint64``, ``infer_s`` a ``float64``, strings a ``uint32`` length and UTF-8, a handle
dict a ``uint16`` count then per handle (name length, dtype length, ndim as ``uint8``;
offset, nbytes, capacity as ``uint64``), the name, the dtype and the shape (``int64``
each). A :class:`Run`'s chaos fault (rare) is pickled at the end of its body. The rare
messages (:class:`Ready`, :class:`LoadFailed`, :class:`Call`, :class:`Reply`,
:class:`CallFailed`, the model calls') are pickled whole in a frame of their own kind.
A frame that does
not parse (unknown kind, a declared length over :data:`MAX_BODY`, a body too short or
too long, bad UTF-8, a pickle of anything else) raises :class:`FrameError`: the server
then kills the worker as lost, a worker exits (code 1).

Start-up. The worker maps the arena, loads its model and runs warm-up batches, then
says :class:`Ready` (or :class:`LoadFailed` and exits). From then on a heartbeat
thread sends :class:`Heartbeat` every ``heartbeat_s``.

The pipe carries one exchange at a time, and the server never starts a second one
before the first has ended:

- a batch: the server sends :class:`Run` with the input handles and output space it
  reserved for outputs of known size. If an output does not fit, the worker sends
  :class:`Alloc` with the sizes it needs and reads the pipe for the answer alone; the
  server replies :class:`Allocated` (or :class:`Stop` when it is going away); an
  ``Allocated`` whose ``refused`` says why there is no room fails the batch alone. The
  batch ends with :class:`Done` (the output handles and the model's time) or
  :class:`RunFailed` (the model raised; ``kind`` is ``"oom"`` for a MemoryError).
- a command, between batches: the server sends :class:`Call` with a ``call_id`` and a
  :data:`Command`; the worker answers :class:`Reply` or :class:`CallFailed`. The
  commands are :class:`ProfileStart` (serve from a profiling session whose trace file
  starts with ``prefix``; replies None) and :class:`ProfileStop` (put the serving
  session back; replies :class:`ProfileStopped`).

Model calls (Triton's BLS), at any moment, beside the exchanges above: the worker
sends :class:`ModelCallStart` with a ``call_id`` of its own and a
:class:`~sordino.backends.calls.ModelCall` (the callee, inputs as numpy arrays,
the calling request's priority, deadline and tenant); the server runs it through its
request path and sends one :class:`ModelCallAnswer` per response, the last one final
(always one, whatever happens: an error answer when the call fails, is cancelled or
the server stops). :class:`ModelCallCancel` gives a call up. The tensors of a call
travel pickled in the frame (a copy each way, bounded by :data:`MAX_BODY`), not in
the arena: the server writes answers without blocking its loop, and the worker reads
them whichever of its threads waits (``worker_link.WorkerLink``).

A decoupled model's batch (``ModelMetadata.decoupled``) is the same :class:`Run`,
ended by :class:`Done` (no outputs) once ``execute`` returned; each response the model
sends, during the batch or after it, is a :class:`Respond` frame (the request's index
in the batch, its tensors inline, the final flag, or an error), from any thread of the
worker. The server may send :class:`Cancel` at any time for such a request whose client
went away; the worker of a decoupled model reads its pipe on a thread of its own, so it
sees the cancellation while the model runs, and ``is_cancelled()`` turns true.

A model that checks its own readiness (Triton's ``is_ready()``, :attr:`Ready.checks_ready`)
may be sent :class:`ReadyCheck` at any time, even while a batch runs: its worker reads
the pipe on a thread of its own (as a decoupled model's does), runs the check on
another, and answers :class:`ReadyAnswer` from there.

:class:`Stop` asks the worker to exit. The server's end closing (end of file) means
the same; the worker's end closing tells the server the process is gone.

Where they live: the frames of a batch, a command and the worker's life in
``run_messages.py``, a model's calls in ``call_messages.py``, a decoupled model's in
``decoupled_messages.py``, the wire in ``frames.py``; this module names the two
directions (:data:`ToWorker`, :data:`FromWorker`) and every message, for both ends.
"""

from __future__ import annotations

from sordino.execution.call_messages import ModelCallAnswer, ModelCallCancel, ModelCallStart
from sordino.execution.decoupled_messages import Cancel, Respond
from sordino.execution.frames import HEADER_SIZE, MAX_BODY, FrameError, FrameReader, encode
from sordino.execution.run_messages import (
    HEARTBEAT,
    STOP,
    Alloc,
    Allocated,
    Call,
    CallFailed,
    Command,
    Done,
    Heartbeat,
    LoadFailed,
    LogChange,
    ProfileStart,
    ProfileStop,
    ProfileStopped,
    Ready,
    ReadyAnswer,
    ReadyCheck,
    Reply,
    Run,
    RunFailed,
    Stop,
)

__all__ = [
    "HEADER_SIZE",
    "HEARTBEAT",
    "MAX_BODY",
    "STOP",
    "Alloc",
    "Allocated",
    "Call",
    "CallFailed",
    "Cancel",
    "Command",
    "Done",
    "FrameError",
    "FrameReader",
    "FromWorker",
    "Heartbeat",
    "LoadFailed",
    "LogChange",
    "ModelCallAnswer",
    "ModelCallCancel",
    "ModelCallStart",
    "ProfileStart",
    "ProfileStop",
    "ProfileStopped",
    "Ready",
    "ReadyAnswer",
    "ReadyCheck",
    "Reply",
    "Respond",
    "Run",
    "RunFailed",
    "Stop",
    "ToWorker",
    "encode",
]

ToWorker = Run | Allocated | Call | Stop | Cancel | ModelCallAnswer | ReadyCheck

FromWorker = (
    Ready
    | LoadFailed
    | Heartbeat
    | Alloc
    | Done
    | RunFailed
    | Reply
    | CallFailed
    | ModelCallStart
    | ModelCallCancel
    | Respond
    | ReadyAnswer
)
