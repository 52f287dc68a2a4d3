"""The worker process: one model instance, fed through the shared-memory arena.

Started with the ``spawn`` method (fork after threads and onnxruntime is unsafe). It
maps the arena, loads its model, runs warm-up batches, says ``ready`` and then
serves ``run`` messages one at a time: inputs are read in place from the arena,
outputs written back into blocks the server reserved (or asks for with ``alloc``
when their size could not be known in advance). Between batches the server may
send commands, ``(name, call_id, *args)``, each answered with ``("reply", call_id,
value)`` or ``("call_failed", call_id, message)``:

- ``profile_start PREFIX``: serve from a profiling session whose trace file name
  starts with PREFIX (see ``OnnxBackend.start_profiling``); replies None;
- ``profile_stop``: put the serving session back; replies ``(trace_path, batches)``.

A heartbeat thread says ``hb`` every ``heartbeat_s``. The server's end closing
(EOF) means: exit.

Messages are small tuples; tensor data never goes through the pipe.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from sordino.backends.base import dummy_inputs
from sordino.execution.faults import FaultAction, perform
from sordino.memory.tensors import TensorHandle, tensor_nbytes, view_tensor, write_tensor

__all__ = ["WorkerSpec", "worker_main"]


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything a worker needs to start (picklable)."""

    model: str
    version: str
    index: int
    path: str
    providers: tuple[str, ...]
    target: str
    intra_op_threads: int | None
    arena: str
    heartbeat_s: float
    warmup_batches: int


class _Link:
    """The worker's end of the pipe; sends may come from two threads."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            self.conn.send(message)


def _heartbeat(link: _Link, interval: float) -> None:
    while True:
        time.sleep(interval)
        try:
            link.send(("hb",))
        except OSError:
            return


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Entry point of the worker process."""
    # Ctrl-C and SIGTERM reach the whole process group; the server decides when its
    # workers stop (a "stop" message, or end of file on the pipe when it is gone).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from sordino.backends.onnx import OnnxBackend
    from sordino.memory.arena import attach_segment

    link = _Link(conn)
    segment = attach_segment(spec.arena)
    buffer = segment.buf
    assert buffer is not None
    backend = OnnxBackend(
        name=spec.model,
        version=spec.version,
        providers=list(spec.providers),
        intra_op_threads=spec.intra_op_threads,
    )
    try:
        started = time.perf_counter()
        backend.load(Path(spec.path), spec.target)
        for _ in range(spec.warmup_batches):
            backend.infer(dummy_inputs(backend.metadata, 1))
    except Exception as exc:
        link.send(("load_failed", f"{type(exc).__name__}: {exc}"))
        return
    threading.Thread(
        target=_heartbeat, args=(link, spec.heartbeat_s), daemon=True, name="heartbeat"
    ).start()
    link.send(("ready", backend.metadata, os.getpid(), time.perf_counter() - started))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "stop":
            return
        if message[0] == "run":
            _, batch_id, inputs, outputs, fault = message
            _run(link, backend, buffer, batch_id, inputs, outputs, fault)
        elif message[0] in _COMMANDS:
            _command(link, backend, message)


_COMMANDS: dict[str, Callable[..., Any]] = {
    "profile_start": lambda backend, prefix: backend.start_profiling(prefix),
    "profile_stop": lambda backend: backend.stop_profiling(),
}


def _command(link: _Link, backend: Any, message: tuple[Any, ...]) -> None:
    name, call_id, *args = message
    try:
        value = _COMMANDS[name](backend, *args)
    except Exception as exc:
        link.send(("call_failed", call_id, f"{name}: {type(exc).__name__}: {exc}"))
        return
    link.send(("reply", call_id, value))


def _run(
    link: _Link,
    backend: Any,
    buffer: memoryview,
    batch_id: int,
    inputs: dict[str, TensorHandle],
    space: dict[str, TensorHandle],
    fault: FaultAction | None,
) -> None:
    started = time.perf_counter()
    try:
        batch = {name: view_tensor(buffer, handle) for name, handle in inputs.items()}
        if fault is not None:
            perform(fault, in_process=False)
        results = backend.infer(batch)
        del batch
    except MemoryError as exc:
        link.send(("error", batch_id, "oom", f"MemoryError: {exc}"))
        return
    except Exception as exc:
        link.send(("error", batch_id, "error", f"{type(exc).__name__}: {exc}"))
        return
    infer_s = time.perf_counter() - started
    sizes = {name: tensor_nbytes(array) for name, array in results.items()}
    short = {
        name: size
        for name, size in sizes.items()
        if name not in space or space[name].capacity < size
    }
    if short:
        link.send(("alloc", batch_id, short))
        reply = link.conn.recv()
        if reply[0] != "alloc_ok":
            return  # "stop": the server is going away
        space = {**space, **reply[2]}
    written = {
        name: write_tensor(buffer, space[name].offset, space[name].capacity, array)
        for name, array in results.items()
    }
    link.send(("done", batch_id, written, infer_s))
