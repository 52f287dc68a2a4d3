"""The worker's end of the pipe (:class:`WorkerLink`): frames out from any thread, and
reads shared between the threads that wait for a message (see ``execution/worker_main.py``).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import select
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection

from sordino.backends.calls import CallAnswer, ModelCall, failed_answer
from sordino.execution.messages import (
    HEADER_SIZE,
    MAX_BODY,
    Cancel,
    FrameError,
    FrameReader,
    FromWorker,
    ModelCallAnswer,
    ModelCallCancel,
    ModelCallStart,
    ReadyCheck,
    Stop,
    ToWorker,
    encode,
)

__all__ = ["WorkerLink"]

_Read = tuple[list[ToWorker], BaseException | None]
"""What one read of the pipe gave: the messages it completed, and why the pipe ended."""


class WorkerLink:
    """The worker's end of the pipe; sends may come from any thread, and so may reads.

    ``conn`` only carries the fd (and keeps it open); frames are written and read on the
    fd directly, several frames per read when they have queued up.

    Reading is shared (leader/follower): whichever thread needs a message and finds
    nobody reading reads the fd and hands each message to its reader — answers to model
    calls to their callbacks, everything else to the main thread's inbox. The main
    thread reads for itself between batches (no hand-off on the hot path); while model
    calls are pending, a pump thread reads for them, so answers arrive while
    ``execute`` runs and the main thread does not read.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._fd = conn.fileno()
        self._lock = threading.Lock()
        self._frames = FrameReader()
        self._inbox: collections.deque[ToWorker] = collections.deque()
        self._state = threading.Condition()
        self._reading = False
        self._closed: BaseException | None = None
        self._calls: dict[int, Callable[[CallAnswer], None]] = {}
        self._call_ids = itertools.count(1)
        self._pump: threading.Thread | None = None
        self._on_cancel: Callable[[Cancel], None] | None = None
        self._on_ready_check: Callable[[ReadyCheck], None] | None = None

    def watch_cancels(self, on_cancel: Callable[[Cancel], None]) -> None:
        """Hand each :class:`Cancel` to ``on_cancel`` as it is read (never to :meth:`recv`,
        so none lands in a batch's ``Alloc`` exchange)."""
        self._on_cancel = on_cancel

    def watch_ready_checks(self, on_check: Callable[[ReadyCheck], None]) -> None:
        """Hand each :class:`ReadyCheck` to ``on_check`` as it is read (a model that checks
        its own readiness; with :meth:`start_reader`, so that one is read while a batch
        runs)."""
        self._on_ready_check = on_check

    def start_reader(self) -> None:
        """Read the pipe on a thread from now on (a decoupled model's worker, or one whose
        model checks its readiness): a :class:`Cancel` or :class:`ReadyCheck` goes to its
        watcher at once, even while ``execute`` runs; other messages wait for
        :meth:`recv` as before."""
        threading.Thread(target=self._read_always, daemon=True, name="pipe-reader").start()

    def poll(self) -> None:
        """Hand out what the pipe holds now, without waiting, unless a thread reads it.

        A model that is not decoupled asks ``is_cancelled()`` while its batch runs on the
        thread that would read the pipe: asking reads what came meanwhile (one ``select``
        when nothing did), so a :class:`Cancel` needs no reader thread of its own.
        Another thread reading meanwhile may get to the bytes first; it hands them out.
        """
        if not _readable(self._fd):
            return  # nothing came: no lock taken (a model may ask in a tight loop)
        with self._state:
            if self._reading or self._closed is not None:
                return  # whoever reads hands the Cancel out
            self._reading = True
        read: _Read = ([], None)
        try:
            # Again, as the reader: another may have read the bytes since (never block).
            if _readable(self._fd):
                read = self._read_once()
        finally:
            with self._state:
                self._deliver(read)

    def _read_always(self) -> None:
        with self._state:
            self._read_until(lambda: False)

    def send(self, message: FromWorker) -> None:
        self.send_frame(encode(message))

    def send_frame(self, frame: bytes) -> None:
        """Write one encoded frame (whole, even when several threads send)."""
        data = memoryview(frame)
        with self._lock:
            while data:
                data = data[os.write(self._fd, data) :]

    def recv(self) -> ToWorker:
        """The next message from the server (blocking). Raises :class:`EOFError` when the
        server's end is closed, :class:`FrameError` for bytes that are not a frame."""
        with self._state:
            self._read_until(lambda: bool(self._inbox))
            if self._inbox:
                return self._inbox.popleft()
            assert self._closed is not None
            raise self._closed

    def _read_until(self, ready: Callable[[], bool]) -> None:
        """Read and hand out messages until ``ready()`` or the pipe ends (lock held)."""
        while not ready() and self._closed is None:
            if self._reading:
                self._state.wait()
                continue
            self._reading = True
            self._state.release()
            read: _Read = ([], None)
            try:
                read = self._read_once()
            finally:
                self._state.acquire()
                self._deliver(read)

    def _read_once(self) -> _Read:
        """One read of the fd, as the reader (``_reading`` set, lock not held): the
        messages it completed, and why the pipe ended (None while it has not)."""
        try:
            data = os.read(self._fd, 1 << 16)
            if not data:
                return [], EOFError()
            return self._frames.feed(data), None  # type: ignore[return-value]
        except (OSError, FrameError) as exc:
            return [], exc

    def _deliver(self, read: _Read) -> None:
        """After a read (lock held): stop being the reader, hand each message out, fail
        the pending model calls if the pipe ended, and wake the threads waiting."""
        messages, ended = read
        self._reading = False
        for message in messages:
            self._hand_out(message)
        if ended is not None:
            self._closed = ended
            self._fail_calls("the server closed the worker's pipe")
        self._state.notify_all()

    def _hand_out(self, message: ToWorker) -> None:
        if isinstance(message, ModelCallAnswer):
            on_answer = self._calls.get(message.call_id)
            if message.answer.final:
                self._calls.pop(message.call_id, None)
            if on_answer is not None:
                on_answer(message.answer)
            return
        if isinstance(message, Cancel):
            if self._on_cancel is not None:
                self._on_cancel(message)
            return
        if isinstance(message, ReadyCheck):
            if self._on_ready_check is not None:
                self._on_ready_check(message)
            return
        if isinstance(message, Stop):
            self._fail_calls("the server is stopping")
        self._inbox.append(message)

    def _fail_calls(self, cause: str) -> None:
        calls, self._calls = self._calls, {}
        for on_answer in calls.values():
            on_answer(failed_answer(f"BLS call ended: {cause}", "UNAVAILABLE"))

    # -- model calls (BLS): this link is the worker's ModelCaller -----------------------

    def start(self, call: ModelCall, on_answer: Callable[[CallAnswer], None]) -> Callable[[], None]:
        """Send ``call`` to the server; its answers go to ``on_answer`` (see ModelCaller)."""
        with self._state:
            call_id = next(self._call_ids)
        try:
            frame = encode(ModelCallStart(call_id, call))
        except Exception as exc:
            on_answer(failed_answer(f"BLS call to {call.model}: cannot send it ({exc})"))
            return _nothing
        if len(frame) - HEADER_SIZE > MAX_BODY:
            on_answer(
                failed_answer(
                    f"BLS call to {call.model}: its inputs take {len(frame)} bytes; a call "
                    f"carries at most {MAX_BODY} bytes",
                    "INVALID_ARG",
                )
            )
            return _nothing
        with self._state:
            if self._closed is not None:
                on_answer(failed_answer("BLS call: the server closed the worker's pipe"))
                return _nothing
            self._calls[call_id] = on_answer
            if self._pump is None:
                self._pump = threading.Thread(target=self._pump_calls, name="bls", daemon=True)
                self._pump.start()
            self._state.notify_all()
        try:
            self.send_frame(frame)
        except OSError as exc:
            with self._state:
                self._calls.pop(call_id, None)
            on_answer(failed_answer(f"BLS call: the server is gone ({exc})", "UNAVAILABLE"))
            return _nothing
        return lambda: self._give_up(call_id)

    def _give_up(self, call_id: int) -> None:
        with self._state:
            pending = call_id in self._calls
        if pending:
            with contextlib.suppress(OSError):
                self.send(ModelCallCancel(call_id))

    def _pump_calls(self) -> None:
        """Read the pipe while model calls wait for answers (and nobody else reads)."""
        with self._state:
            while self._closed is None:
                if not self._calls:
                    self._state.wait()
                    continue
                self._read_until(lambda: not self._calls)


def _readable(fd: int) -> bool:
    """Whether ``fd`` has bytes (or its end) to read now. (``select``, not a shared
    ``poll`` object: the model's threads may ask at once, which ``poll`` refuses.)"""
    return bool(select.select([fd], [], [], 0)[0])


def _nothing() -> None:
    """Giving up a call that was never sent."""
