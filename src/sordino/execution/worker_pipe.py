"""The server's reader and writer of one worker's pipe (:class:`WorkerPipe`).

:class:`~sordino.execution.worker.WorkerProcess` is one: the event loop calls
:meth:`WorkerPipe._readable` when the pipe has bytes, and every message from the worker
is handled where it arrives (a batch's result, its output space, a command's reply, a
model call, a decoupled response). Writes never block the loop: what the socket does
not take at once is queued and written as it drains (see ``execution/worker.py``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import os
import time
from collections.abc import Awaitable, Callable

from sordino.backends.calls import CallAnswer, ModelCall
from sordino.clock import Clock
from sordino.errors import ModelLoadError
from sordino.execution.decoupled import ResponseChannel
from sordino.execution.messages import (
    Alloc,
    Allocated,
    CallFailed,
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
    ReadyAnswer,
    Reply,
    Respond,
    RunFailed,
    ToWorker,
    encode,
)
from sordino.execution.model_calls import CallServer, answer_call
from sordino.execution.worker_main import WorkerSpec
from sordino.inference import ModelMetadata
from sordino.memory.tensors import TensorHandle

__all__ = ["Allocate", "WorkerError", "WorkerLost", "WorkerPipe"]

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


class WorkerPipe:
    """The pipe side of a worker process: frames out, frames in and what each one does.

    The state is :class:`~sordino.execution.worker.WorkerProcess`'s (set up in its
    ``__init__``); the process's life (:meth:`kill`, reaping its exit) is its too.
    """

    spec: WorkerSpec
    _clock: Clock
    _loop: asyncio.AbstractEventLoop
    _fd: int
    _outgoing: collections.deque[memoryview]
    _closed: bool
    _frames: FrameReader
    _ready: asyncio.Future[ModelMetadata]
    _pending: dict[int, asyncio.Future[tuple[dict[str, TensorHandle], float]]]
    _allocate: dict[int, Allocate]
    _allocating: dict[int, asyncio.Task[None]]
    _calls: dict[int, asyncio.Future[ProfileStopped | None]]
    _checks: dict[int, asyncio.Future[str | None]]
    _channels: dict[int, ResponseChannel]
    _call_server: Callable[[], CallServer | None] | None
    _serving: dict[int, asyncio.Task[None]]
    _batch_ends: float | None
    _batch_timeout: float
    pid: int | None
    last_beat: float
    load_s: float
    per_request: bool
    checks_ready: bool

    def kill(self, cause: str) -> None:
        """SIGKILL the process; fail its batch with ``cause`` (the process's own)."""
        raise NotImplementedError

    async def _reap(self) -> None:
        """Wait for the process's exit once its pipe closed (the process's own)."""
        raise NotImplementedError

    def _break(self) -> None:
        """The pipe is gone: stop routing to the worker (the process's own)."""
        raise NotImplementedError

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
            self._break()  # nothing more comes: the worker exits (its reaping says how)
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

    def _on_message(self, message: FromWorker) -> None:
        self.last_beat = self._clock.now()
        match message:
            case Heartbeat():
                pass
            case Ready(metadata=metadata, pid=pid, load_s=load_s, per_request=per_request):
                self.pid, self.load_s, self.per_request = pid, load_s, per_request
                self.checks_ready = message.checks_ready
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
            case ReadyAnswer(check_id=check_id, why=why):
                check = self._checks.get(check_id)
                if check is not None and not check.done():
                    check.set_result(why)
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
                    channel.response(index, outputs, final, message.error, message.code)
                    if channel.finished and batch_id not in self._pending:
                        # (a response that ended its request may have cancelled it,
                        # which forgets a finished channel already)
                        self._channels.pop(batch_id, None)
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
        except Exception as exc:
            # No room (outputs larger than the arena): the worker fails this batch alone
            # (RunFailed) and serves on; killing it made one request cost the model's
            # instance a restart, and its backoff.
            space, refused = {}, str(exc) or type(exc).__name__
        else:
            refused = ""
        try:
            self._send(Allocated(batch_id, space, refused))
        except OSError:  # the worker is gone: its end is handled where its pipe ends
            pass
        finally:
            self._allocating.pop(batch_id, None)
