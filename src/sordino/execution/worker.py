"""The server's handle on one worker process: start, run a batch, watch it, kill it.

The event loop watches each worker's pipe (``add_reader``) and handles every message
as it arrives; end-of-file means the process is gone, and the exit code or signal
becomes the cause. Killing a worker (hang, execution timeout, shutdown) fails its batch at once
with :class:`WorkerLost`, whatever the process does next.

The pipe (a socket pair) carries one exchange at a time, as binary frames (the
messages, their order and their encoding are in ``execution/messages.py``): a batch
(:meth:`WorkerProcess.run`) or a command (:meth:`WorkerProcess.call`, such as
:class:`ProfileStart`). A command waits for the running batch to finish, and a batch
for the running command, so no message lands in the middle of a batch's :class:`Alloc`
exchange, where the worker reads the pipe for the allocation alone. Bytes from the
worker that are not a frame (:class:`FrameError`) make it a lost worker: it is killed.

Beside those exchanges, the model may call other models (BLS) at any moment: each
``ModelCallStart`` is answered by a task of its own (``execution/model_calls.py``),
cancelled when the worker gives the call up or is lost. Writes to the pipe never block
the event loop: what the socket does not take at once (a large answer the worker has
not read yet) is queued and written as it drains.

A decoupled batch (``run(..., channel=...)``) ends its exchange when ``execute`` has
returned; its :class:`Respond` frames go to its
:class:`~sordino.execution.decoupled.ResponseChannel` as they come, during the batch and
after it, until every request of it has ended. A :class:`Cancel` for one of its
requests may be sent at any time (the worker reads it on a thread of its own). A worker
lost after the exchange ended fails the requests still open with the cause. A batch of a
backend that takes each request's facts may get :class:`Cancel` frames too while it
runs (its worker reads them when the model asks ``is_cancelled()``).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import dataclasses
import functools
import itertools
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from typing import Any

from sordino.backends.calls import CallAnswer, ModelCall
from sordino.clock import Clock
from sordino.errors import ModelLoadError
from sordino.execution.batch import Cancels
from sordino.execution.decoupled import ResponseChannel
from sordino.execution.faults import FaultAction
from sordino.execution.messages import (
    STOP,
    Alloc,
    Allocated,
    Call,
    CallFailed,
    Cancel,
    Command,
    Done,
    FrameError,
    FrameReader,
    FromWorker,
    Heartbeat,
    LoadFailed,
    ModelCallAnswer,
    ModelCallCancel,
    ModelCallStart,
    ProfileStopped,
    Ready,
    Reply,
    Respond,
    Run,
    RunFailed,
    ToWorker,
    encode,
)
from sordino.execution.model_calls import CallServer, answer_call
from sordino.execution.worker_main import WorkerSpec, worker_main
from sordino.inference import ModelMetadata, RequestFacts
from sordino.memory.tensors import TensorHandle

__all__ = ["WorkerError", "WorkerLost", "WorkerProcess"]

log = logging.getLogger("sordino.workers")

_SPAWN = multiprocessing.get_context("spawn")

Allocate = Callable[[dict[str, int]], Awaitable[dict[str, TensorHandle]]]


class WorkerLost(Exception):
    """The worker died, hung or timed out with the batch; ``cause`` says which."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class WorkerError(Exception):
    """The model raised inside the worker; the worker itself is fine."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def describe_exit(code: int | None) -> str:
    """``exited with code 3`` / ``killed by SIGKILL``."""
    if code is None:
        return "exited"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


_MAIN_LOCK = threading.Lock()

# Workers ignore SIGINT and SIGTERM (a terminal's Ctrl-C reaches the whole process
# group; the server decides when they stop). Should the server exit without stopping
# them, this kills what is left, before multiprocessing's own exit hook waits for them.
_LIVE_PIDS: set[int] = set()

# Blocked in the thread that spawns a worker, so the child starts with them blocked
# (a blocked mask survives fork and exec): a Ctrl-C during the child's interpreter
# start-up and imports stays pending instead of raising KeyboardInterrupt there, and
# is discarded when worker_main ignores these signals and unblocks them.
WORKER_IGNORED_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


@atexit.register
def _kill_leftover_workers() -> None:
    for pid in list(_LIVE_PIDS):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _start_apart_from_main(process: Any) -> None:
    """Start ``process`` without re-running the embedding program's main script in it.

    ``spawn`` re-imports the parent's ``__main__`` in every child, so a script that
    embeds sordino without an ``if __name__ == "__main__"`` guard would start itself
    again in each worker. A worker needs only sordino, so the main module's path is
    hidden for the moment of the start. SIGINT and SIGTERM are blocked in this thread
    meanwhile, so the child starts with them blocked (see ``WORKER_IGNORED_SIGNALS``).
    """
    main = sys.modules.get("__main__")
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_IGNORED_SIGNALS)
    try:
        _start_without_main(process, main)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _start_without_main(process: Any, main: Any) -> None:
    with _MAIN_LOCK:
        saved = {
            name: main.__dict__.pop(name)
            for name in ("__file__",)
            if main and name in main.__dict__
        }
        spec = getattr(main, "__spec__", None)
        if main is not None and spec is not None and not spec.name.endswith("__main__"):
            main.__spec__ = None
        try:
            process.start()
        finally:
            if main is not None:
                main.__dict__.update(saved)
                if spec is not None:
                    main.__spec__ = spec


class WorkerProcess:
    """One spawned worker process and its pipe."""

    def __init__(
        self,
        spec: WorkerSpec,
        clock: Clock,
        calls: Callable[[], CallServer | None] | None = None,
    ) -> None:
        """``calls`` gives the answerer of the model's calls to other models (BLS)."""
        self.spec = spec
        self._clock = clock
        self._loop = asyncio.get_running_loop()
        # A duplex Pipe is a socket pair; its Connection only carries the fd to the child
        # and closes it. Both ends write and read frames on the fd themselves.
        self._conn, child = _SPAWN.Pipe(duplex=True)
        self._fd = self._conn.fileno()
        # Writes never block the loop: a frame the socket cannot take at once (a large
        # BLS answer the worker has not read yet) waits in _outgoing for a writer callback.
        os.set_blocking(self._fd, False)
        self._outgoing: collections.deque[memoryview] = collections.deque()
        self._closed = False
        self._frames = FrameReader()
        self._child_conn: Connection | None = child
        self._process = _SPAWN.Process(
            target=worker_main,
            args=(spec, child),
            name=f"sordino-{spec.model}-{spec.index}",
            daemon=True,
        )
        self._ids = itertools.count(1)
        self._ready: asyncio.Future[ModelMetadata] = self._loop.create_future()
        self.dead: asyncio.Future[str] = self._loop.create_future()
        self._pending: dict[int, asyncio.Future[tuple[dict[str, TensorHandle], float]]] = {}
        self._allocate: dict[int, Allocate] = {}
        self._allocating: dict[int, asyncio.Task[None]] = {}
        self._calls: dict[int, asyncio.Future[ProfileStopped | None]] = {}
        self._channels: dict[int, ResponseChannel] = {}  # decoupled batches still answering
        self._turn = asyncio.Lock()  # one exchange on the pipe at a time (see above)
        self._call_server = calls
        self._serving: dict[int, asyncio.Task[None]] = {}  # model calls, by the worker's id
        self._batch_ends: float | None = None  # when the running batch is killed (clock)
        self._batch_timeout = 0.0
        self._kill_cause: str | None = None
        self._broken = False
        self.pid: int | None = None
        self.last_beat = clock.now()
        self.load_s = 0.0
        self.per_request = False
        """Whether its backend takes each request's facts (its :class:`Ready` says)."""

    @property
    def alive(self) -> bool:
        return not self.dead.done() and self._kill_cause is None and not self._broken

    async def start(self, timeout_s: float) -> ModelMetadata:
        """Spawn the process; return the model's metadata once it has warmed up.

        If the caller is cancelled, a process already spawning is still watched, so
        that :meth:`stop` can end it.
        """
        spawning = self._loop.run_in_executor(None, _start_apart_from_main, self._process)
        try:
            await asyncio.shield(spawning)
        except asyncio.CancelledError:
            # The spawn goes on in its thread: wait for it (moments), then watch the child.
            with contextlib.suppress(Exception):
                await spawning
            self._watch()
            raise
        self._watch()
        waiting: set[asyncio.Future[Any]] = {self._ready, self.dead}
        done, _ = await asyncio.wait(
            waiting, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if self._ready in done:
            self.last_beat = self._clock.now()
            return self._ready.result()
        if not done:
            self.kill(f"did not start within {timeout_s:g} s")
            raise ModelLoadError(
                f"worker for {self.spec.model} did not load and warm up within {timeout_s:g} s; "
                "raise workers.start_timeout"
            )
        if self._ready.done() and self._ready.exception() is not None:
            raise self._ready.exception()  # type: ignore[misc]
        raise ModelLoadError(f"worker for {self.spec.model} {self.dead.result()} while starting")

    def _watch(self) -> None:
        """Read the pipe of the spawned process from now on (nothing if it did not spawn)."""
        if self._child_conn is None:
            return
        self._child_conn.close()  # our copy; the child's end closing must mean EOF here
        self._child_conn = None
        self.pid = self._process.pid
        if self.pid is None:
            return
        _LIVE_PIDS.add(self.pid)
        # Replies are read on the event loop itself (no reader thread): no GIL hand-off
        # and no cross-thread wake-up per batch.
        self._loop.add_reader(self._fd, self._readable)

    async def run(
        self,
        inputs: dict[str, TensorHandle],
        space: dict[str, TensorHandle],
        fault: FaultAction | None,
        allocate: Allocate,
        timeout_s: float,
        segment: str = "",
        rows: tuple[int, ...] = (),
        channel: ResponseChannel | None = None,
        requests: tuple[RequestFacts, ...] = (),
        cancels: Cancels | None = None,
    ) -> tuple[dict[str, TensorHandle], float]:
        """Run one batch; return its output handles and the time the model took.

        ``requests`` (each request's facts) go to the worker only when its backend
        takes them (:attr:`per_request`); so do the cancellations ``cancels`` hears of
        while the batch runs (a :class:`Cancel` frame each, read in the worker when the
        model asks ``is_cancelled()``).

        Raises :class:`WorkerLost` if the worker dies, is killed or exceeds
        ``timeout_s`` (0: no limit), :class:`WorkerError` if the model raised. The
        batch waits for a command in progress; ``timeout_s`` counts from its start.
        With ``channel`` (a decoupled batch) it returns no outputs once ``execute``
        returned; the responses go to ``channel`` from then on too.
        """
        async with self._turn:
            if not self.alive:
                raise WorkerLost(self._lost_cause())
            batch_id = next(self._ids)
            future: asyncio.Future[tuple[dict[str, TensorHandle], float]] = (
                self._loop.create_future()
            )
            self._pending[batch_id] = future
            self._allocate[batch_id] = allocate
            if channel is not None:
                self._channels[batch_id] = channel
                channel.bind(functools.partial(self._cancel, batch_id))
            if cancels is not None and self.per_request:
                cancels.bind(functools.partial(self._cancel, batch_id))
            else:
                cancels = None
            ran = False
            timer = None
            if timeout_s > 0:
                self._batch_ends = self._clock.now() + timeout_s
                self._batch_timeout = timeout_s
                timer = self._clock.call_at(
                    self._clock.now() + timeout_s,
                    lambda: self.kill(f"execution timeout: a batch ran over {timeout_s:g} s"),
                )
            try:
                facts = requests if self.per_request else ()
                self._send(Run(batch_id, inputs, space, fault, segment, rows, facts))
                result = await future
                ran = True
                return result
            except asyncio.CancelledError:
                # The worker is still inside the batch and may yet ask for output space: the
                # pipe's exchange is half done, so the worker is replaced rather than reused.
                self.kill("its batch was cancelled while it ran")
                raise
            except OSError as exc:
                # The process is gone; its exit and real cause come when the pipe closes.
                self._broken = True
                raise WorkerLost(f"the worker is gone ({exc.strerror or exc})") from None
            finally:
                if cancels is not None:
                    cancels.bind(None)
                self._batch_ends = None
                if timer is not None:
                    timer.cancel()
                self._pending.pop(batch_id, None)
                self._allocate.pop(batch_id, None)
                if channel is not None and (not ran or channel.finished):
                    # A failed batch is answered by its caller; a finished one is done.
                    self._channels.pop(batch_id, None)
                allocating = self._allocating.pop(batch_id, None)
                if allocating is not None:
                    # The batch ended (lost, killed, cancelled) while its outputs still
                    # waited for arena space: stop waiting, so the space goes elsewhere.
                    allocating.cancel()

    async def call(self, command: Command, *, timeout_s: float) -> ProfileStopped | None:
        """Send ``command`` to the worker between batches; return its reply's value.

        Raises :class:`WorkerLost` if the worker dies or is killed first,
        :class:`WorkerError` if the command failed in the worker (``kind`` "error") or
        no reply came within ``timeout_s`` of sending it (``kind`` "timeout"; the worker
        may still carry the command out later).
        """
        async with self._turn:
            if not self.alive:
                raise WorkerLost(self._lost_cause())
            call_id = next(self._ids)
            future: asyncio.Future[ProfileStopped | None] = self._loop.create_future()
            self._calls[call_id] = future
            try:
                self._send(Call(call_id, command))
                return await asyncio.wait_for(future, timeout_s)
            except OSError as exc:
                self._broken = True
                raise WorkerLost(f"the worker is gone ({exc.strerror or exc})") from None
            except TimeoutError:
                raise WorkerError(
                    "timeout", f"the worker did not answer {command.name} within {timeout_s:g} s"
                ) from None
            finally:
                self._calls.pop(call_id, None)

    def _cancel(self, batch_id: int, index: int) -> None:
        """Tell the worker the client of request ``index`` of ``batch_id`` went away."""
        channel = self._channels.get(batch_id)
        if channel is not None and channel.finished:
            del self._channels[batch_id]
        if self.alive:
            with contextlib.suppress(OSError):  # gone: the exit is seen when the pipe closes
                self._send(Cancel(batch_id, index))

    def _lost_cause(self) -> str:
        if self._kill_cause is not None:
            return self._kill_cause
        if self.dead.done():
            return self.dead.result()
        return "the worker is not running"

    def kill(self, cause: str) -> None:
        """SIGKILL the process (it may be hung or stopped); fail its batch with ``cause``."""
        if self._kill_cause is not None or self.dead.done():
            return
        self._kill_cause = cause
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self._fail_pending(cause)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the worker to exit; kill it if it has not within ``timeout_s``.

        A worker still loading reads no message yet: it is killed at once.
        """
        if self.dead.done():
            return
        if self.pid is None:
            self._kill_cause = "stopped"
            self.dead.set_result("stopped")
            return
        if not self._ready.done():
            self.kill("stopped while loading")
        else:
            with contextlib.suppress(OSError):
                self._send(STOP)
        try:
            await asyncio.wait_for(asyncio.shield(self.dead), timeout_s)
        except TimeoutError:
            self.kill("did not stop in time")
            await asyncio.wait_for(asyncio.shield(self.dead), timeout_s)

    # -- reading replies and their callbacks -----------------------------------------

    def _send(self, message: ToWorker) -> None:
        """Write ``message``'s frame now, or queue what the socket does not take yet.

        Raises :class:`OSError` when the worker's end is gone. Frames keep their order.
        """
        if self._closed:  # its fd number may belong to another file by now
            raise OSError("the worker's pipe is closed")
        frame = memoryview(encode(message))
        if self._outgoing:
            self._outgoing.append(frame)
            return
        try:
            written = os.write(self._fd, frame)
        except BlockingIOError:
            written = 0
        if written < len(frame):
            self._outgoing.append(frame[written:])
            self._loop.add_writer(self._fd, self._flush)

    def _flush(self) -> None:
        """Write queued frames as the socket takes them (a writer callback)."""
        outgoing = self._outgoing
        while outgoing:
            try:
                written = os.write(self._fd, outgoing[0])
            except BlockingIOError:
                return
            except OSError:
                outgoing.clear()  # the worker is gone; its exit says why
                break
            if written < len(outgoing[0]):
                outgoing[0] = outgoing[0][written:]
                return
            outgoing.popleft()
        self._loop.remove_writer(self._fd)

    def _readable(self) -> None:
        """Handle the messages the bytes waiting on the pipe complete (one read for all
        of them); on end of file, report the exit. A garbled frame is a lost worker."""
        try:
            data = os.read(self._fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        self._received(data)

    def _received(self, data: bytes) -> None:
        """Handle ``data`` read from the pipe: the messages it completes, or end of file
        (empty), or a garbled frame (the worker is killed as lost)."""
        if not data:
            self._loop.remove_reader(self._fd)
            self._loop.create_task(self._reap())
            return
        try:
            messages = self._frames.feed(data)
        except FrameError as exc:
            self._loop.remove_reader(self._fd)
            self.kill(f"sent a garbled message ({exc})")
            self._loop.create_task(self._reap())
            return
        for message in messages:
            self._on_message(message)  # type: ignore[arg-type]

    async def _reap(self) -> None:
        # The pipe closes as the process exits; wait for it off the loop to read its code.
        await self._loop.run_in_executor(None, self._process.join, 10)
        self._on_exit(self._process.exitcode)

    def _on_message(self, message: FromWorker) -> None:
        self.last_beat = self._clock.now()
        match message:
            case Heartbeat():
                pass
            case Ready(metadata=metadata, pid=pid, load_s=load_s, per_request=per_request):
                self.pid, self.load_s, self.per_request = pid, load_s, per_request
                if not self._ready.done():
                    self._ready.set_result(metadata)
            case LoadFailed(message=text):
                if not self._ready.done():
                    self._ready.set_exception(ModelLoadError(text))
            case Done(batch_id=batch_id, outputs=outputs, infer_s=infer_s):
                future = self._pending.get(batch_id)
                if future is not None and not future.done():
                    future.set_result((outputs, infer_s))
            case RunFailed(batch_id=batch_id, kind=kind, message=text):
                future = self._pending.get(batch_id)
                if future is not None and not future.done():
                    future.set_exception(WorkerError(kind, text))
            case Reply(call_id=call_id, value=value):
                call = self._calls.get(call_id)
                if call is not None and not call.done():
                    call.set_result(value)
            case CallFailed(call_id=call_id, message=text):
                call = self._calls.get(call_id)
                if call is not None and not call.done():
                    call.set_exception(WorkerError("error", text))
            case ModelCallStart(call_id=call_id, call=call):
                self._serving[call_id] = self._loop.create_task(self._answer(call_id, call))
            case ModelCallCancel(call_id=call_id):
                task = self._serving.get(call_id)
                if task is not None:
                    task.cancel()
            case Respond(batch_id=batch_id, index=index, final=final, outputs=outputs):
                channel = self._channels.get(batch_id)
                if channel is not None:
                    channel.response(index, outputs, final, message.error)
                    if channel.finished and batch_id not in self._pending:
                        del self._channels[batch_id]
            case Alloc(batch_id=batch_id, sizes=sizes):
                allocate = self._allocate.get(batch_id)
                if allocate is not None:
                    self._allocating[batch_id] = self._loop.create_task(
                        self._serve_alloc(batch_id, allocate, sizes)
                    )

    async def _answer(self, call_id: int, call: ModelCall) -> None:
        """Answer the model's call ``call_id`` (BLS) over the pipe.

        While a batch runs, the call's deadline is brought before the batch's execution
        timeout (less a tenth of it), so a call that cannot be answered in time (a
        cycle back to a busy model) fails with a message rather than the worker being
        killed for the batch.
        """
        ends = self._batch_ends
        timeout = self._batch_timeout
        if ends is not None and timeout:
            cap = time.time() + (ends - timeout / 10 - self._clock.now())
            if call.deadline is None or cap < call.deadline:
                call = dataclasses.replace(call, deadline=cap)

        def deliver(answer: CallAnswer) -> None:
            with contextlib.suppress(OSError):  # the worker is gone: nobody waits
                self._send(ModelCallAnswer(call_id, answer))

        try:
            await answer_call(self._call_server() if self._call_server else None, call, deliver)
        finally:
            self._serving.pop(call_id, None)

    async def _serve_alloc(self, batch_id: int, allocate: Allocate, sizes: dict[str, int]) -> None:
        try:
            space = await allocate(sizes)
            self._send(Allocated(batch_id, space))
        except Exception as exc:
            future = self._pending.get(batch_id)
            if future is not None and not future.done():
                future.set_exception(WorkerError("error", f"cannot place outputs: {exc}"))
            self.kill(f"output allocation failed: {exc}")
        finally:
            self._allocating.pop(batch_id, None)

    def _on_exit(self, code: int | None) -> None:
        if self._process.pid is not None:
            _LIVE_PIDS.discard(self._process.pid)
        cause = self._kill_cause or describe_exit(code)
        self._fail_pending(cause)
        if self._outgoing:
            self._outgoing.clear()
            self._loop.remove_writer(self._fd)
        self._closed = True
        if not self._ready.done():
            self._ready.set_exception(ModelLoadError(f"worker {cause} while loading"))
            self._ready.exception()
        if not self.dead.done():
            self.dead.set_result(cause)
        self._conn.close()

    def _fail_pending(self, cause: str) -> None:
        for task in list(self._serving.values()):
            task.cancel()  # the model calls of a lost worker: nobody waits for them
        futures: list[asyncio.Future[Any]] = [*self._pending.values(), *self._calls.values()]
        for future in futures:
            if not future.done():
                future.set_exception(WorkerLost(cause))
        # Decoupled batches whose execute had returned: their open requests end here (a
        # batch still running is failed, or retried, by whoever waits on it).
        for batch_id, channel in list(self._channels.items()):
            if batch_id not in self._pending:
                del self._channels[batch_id]
                channel.fail(
                    f"model {channel.model}: the worker {self.spec.model}/{self.spec.index} "
                    f"was lost while the model was still sending responses ({cause})"
                )
