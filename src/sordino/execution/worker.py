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

A model that checks its own readiness (:attr:`WorkerProcess.checks_ready`) is asked at
any time too (:meth:`WorkerProcess.check_ready`, a :class:`ReadyCheck` frame): its worker
reads the pipe on a thread of its own and answers from another, so a running batch
neither delays the answer nor sees the frame.

Here: the process's life (start, a batch or command exchange, kill, stop, its exit); the
pipe's reading and writing are :class:`~sordino.execution.worker_pipe.WorkerPipe`'s, the
spawn apart from the embedding program ``worker_spawn.py``'s.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import logging
import os
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from sordino.clock import Clock, TimerHandle
from sordino.errors import ModelLoadError
from sordino.execution.batch import Cancels
from sordino.execution.decoupled import ResponseChannel
from sordino.execution.faults import FaultAction
from sordino.execution.messages import (
    STOP,
    Call,
    Cancel,
    Command,
    FrameReader,
    ProfileStopped,
    ReadyCheck,
    Run,
)
from sordino.execution.model_calls import CallServer
from sordino.execution.worker_main import WorkerSpec, worker_main
from sordino.execution.worker_pipe import Allocate, WorkerError, WorkerLost, WorkerPipe
from sordino.execution.worker_spawn import (
    LIVE_PIDS,
    WORKER_CONTEXT,
    Inherited,
    SpawnClock,
    describe_exit,
    end_group,
    end_stuck_forkserver,
    join_exit_code,
    kill_tree,
    start_apart_from_main,
)
from sordino.inference import ModelMetadata, RequestFacts
from sordino.memory.tensors import TensorHandle
from sordino.telemetry.log_settings import process_log_settings

__all__ = ["WorkerError", "WorkerLost", "WorkerProcess"]

SPAWN_S = 10.0
"""The longest a running forkserver may take to fork a worker (milliseconds when it
answers): one that takes longer does not answer. Not counted: the start's wait for a
thread and for the start before it, and a forkserver's own launch."""


async def _within(future: asyncio.Future[None], seconds: float) -> bool:
    """Whether ``future`` is done within ``seconds`` (its exception raised if it failed)."""
    try:
        await asyncio.wait_for(asyncio.shield(future), seconds)
    except TimeoutError:
        return False
    return True


log = logging.getLogger("sordino.workers")


class WorkerProcess(WorkerPipe):
    """One worker process and its pipe."""

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
        self._conn, child = WORKER_CONTEXT.Pipe(duplex=True)
        self._fd = self._conn.fileno()
        # Writes never block the loop: a frame the socket cannot take at once (a large
        # BLS answer the worker has not read yet) waits in _outgoing for a writer callback.
        os.set_blocking(self._fd, False)
        self._outgoing: collections.deque[memoryview] = collections.deque()
        self._closed = False
        self._frames = FrameReader()
        self._child_conn: Connection | None = child
        self._process = WORKER_CONTEXT.Process(
            target=worker_main,
            # The server's logging, environment and streams as they are now: a model's
            # log lines follow it, and a forked worker does not keep the forkserver's.
            args=(spec, child, process_log_settings().current(), Inherited.now()),
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
        self._checks: dict[int, asyncio.Future[str | None]] = {}  # readiness, by check id
        self._channels: dict[int, ResponseChannel] = {}  # decoupled batches still answering
        self._turn = asyncio.Lock()  # one exchange on the pipe at a time (see above)
        self._call_server = calls
        self._serving: dict[int, asyncio.Task[None]] = {}  # model calls, by the worker's id
        self._batch_ends: float | None = None  # when the running batch is killed (clock)
        self._batch_timeout = 0.0
        # One timer for the execution timeout, not one a batch: armed at the running
        # batch's end, it kills the worker if that batch still runs then, and moves on
        # to a later batch's end if the batch it was armed for is over.
        self._watchdog: TimerHandle | None = None
        self._watchdog_at: float | None = None
        self._kill_cause: str | None = None
        self._broken = False
        self.on_gone: Callable[[], None] | None = None
        """Called once, as soon as the worker is known not to serve any more (killed, its
        pipe broken, exited): its instance stops routing to it before the exit is reaped."""
        self.pid: int | None = None
        self.last_beat = clock.now()
        self.load_s = 0.0
        self.per_request = False
        """Whether its backend takes each request's facts (its :class:`Ready` says)."""
        self.checks_ready = False
        """Whether its model checks its own readiness (its :class:`Ready` says)."""

    @property
    def alive(self) -> bool:
        return not self.dead.done() and self._kill_cause is None and not self._broken

    async def start(self, timeout_s: float) -> ModelMetadata:
        """Spawn the process; return the model's metadata once it has warmed up.

        If the caller is cancelled, a process already spawning is still watched, so
        that :meth:`stop` can end it.
        """
        clock = SpawnClock()
        spawning = self._loop.run_in_executor(None, start_apart_from_main, self._process, clock)
        try:
            while not await _within(spawning, 1.0):
                since = clock.forking_since
                if since is not None and time.monotonic() - since > SPAWN_S:
                    await self._spawn_stuck(spawning)
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

    async def _spawn_stuck(self, spawning: asyncio.Future[None]) -> None:
        """The forkserver did not fork this worker within ``SPAWN_S``: it does not
        answer. It is ended (the next start makes a new one) — waiting on, this start
        and every one after it would wait for ever."""
        pid = end_stuck_forkserver()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(spawning, 10.0)  # its socket closed: it ends now
        self._watch()  # a process that started after all is watched, and ended
        self.kill(f"not started within {SPAWN_S:g} s")
        raise ModelLoadError(
            f"worker for {self.spec.model} was not started within {SPAWN_S:g} s: the "
            f"forkserver{f' (pid {pid})' if pid else ''} that starts workers did not answer "
            "(stopped or hung); it was ended and the next start makes a new one"
        )

    def _watch(self) -> None:
        """Read the pipe of the spawned process from now on (nothing if it did not spawn)."""
        if self._child_conn is None:
            return
        self._child_conn.close()  # our copy; the child's end closing must mean EOF here
        self._child_conn = None
        self.pid = self._process.pid
        if self.pid is None:
            return
        LIVE_PIDS.add(self.pid)
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
            if timeout_s > 0:
                self._batch_ends = ends = self._clock.now() + timeout_s
                self._batch_timeout = timeout_s
                self._watch_until(ends)
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
                self._break()
                raise WorkerLost(f"the worker is gone ({exc.strerror or exc})") from None
            finally:
                if cancels is not None:
                    cancels.bind(None)
                self._batch_ends = None
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
                self._break()
                raise WorkerLost(f"the worker is gone ({exc.strerror or exc})") from None
            except TimeoutError:
                raise WorkerError(
                    "timeout", f"the worker did not answer {command.name} within {timeout_s:g} s"
                ) from None
            finally:
                self._calls.pop(call_id, None)

    async def check_ready(self) -> str | None:
        """Ask the model whether it is ready (its ``is_ready()``), even while a batch runs:
        None when it is, else why not. Waits as long as the model takes (the caller
        bounds it); raises :class:`WorkerLost` if the worker dies first."""
        if not self.alive:
            raise WorkerLost(self._lost_cause())
        check_id = next(self._ids)
        future: asyncio.Future[str | None] = self._loop.create_future()
        self._checks[check_id] = future
        try:
            self._send(ReadyCheck(check_id))
            return await future
        except OSError as exc:
            self._break()  # (as a command's send that fails: the pipe is gone)
            raise WorkerLost(f"the worker is gone ({exc.strerror or exc})") from None
        finally:
            self._checks.pop(check_id, None)

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

    def _watch_until(self, ends: float) -> None:
        """Have the watchdog look at ``ends`` (the running batch's end), unless it
        looks before then already (it moves on from there)."""
        if self._watchdog is not None:
            if self._watchdog_at is not None and self._watchdog_at <= ends:
                return
            self._watchdog.cancel()
        self._watchdog_at = ends
        self._watchdog = self._clock.call_at(ends, self._watchdog_fired)

    def _watchdog_fired(self) -> None:
        armed_at, self._watchdog, self._watchdog_at = self._watchdog_at, None, None
        ends = self._batch_ends
        if ends is None:
            return  # no batch runs: the watchdog sleeps until the next one
        if ends == armed_at:  # the batch it was armed for still runs: its time is up
            self.kill(f"execution timeout: a batch ran over {self._batch_timeout:g} s")
        else:
            self._watch_until(ends)  # a later batch runs: look again at its end

    def kill(self, cause: str) -> None:
        """SIGKILL the process (it may be hung or stopped); fail its batch with ``cause``."""
        if self._kill_cause is not None or self.dead.done():
            return
        self._kill_cause = cause
        if self.pid is not None:
            kill_tree(self.pid)
        self._gone()
        self._fail_pending(cause)

    def _break(self) -> None:
        """The pipe is gone (a send failed): the exit and its cause come when it closes."""
        self._broken = True
        self._gone()

    def _gone(self) -> None:
        on_gone, self.on_gone = self.on_gone, None
        if on_gone is not None:
            on_gone()

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
            log.warning(
                "worker %s/%s did not end within %g s of being told to stop (its model's "
                "finalize, or a process it started that it waits for): killed",
                self.spec.model, self.spec.index, timeout_s,
            )  # fmt: skip
            self.kill("did not stop in time")
            await asyncio.wait_for(asyncio.shield(self.dead), timeout_s)

    async def _reap(self) -> None:
        # The pipe closes as the process exits; wait for it off the loop to read its code.
        code = await self._loop.run_in_executor(None, join_exit_code, self._process, 10)
        self._on_exit(code)

    def _on_exit(self, code: int | None) -> None:
        if self._process.pid is not None:
            LIVE_PIDS.discard(self._process.pid)
            end_group(self._process.pid)
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
        self._gone()
        self._conn.close()
        if code is not None:
            # Its sentinel pipe, held otherwise until the collector finds the object.
            with contextlib.suppress(ValueError):
                self._process.close()

    def _fail_pending(self, cause: str) -> None:
        for task in list(self._serving.values()):
            task.cancel()  # the model calls of a lost worker: nobody waits for them
        futures: list[asyncio.Future[Any]] = [
            *self._pending.values(),
            *self._calls.values(),
            *self._checks.values(),
        ]
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
