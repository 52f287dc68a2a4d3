"""A standard stream whose reader went away, in the server and in its workers.

``sordino start | head``, a ``tee`` that was stopped, a terminal that hung up: every
write to the stream then fails (``EPIPE``, ``EIO``): a line ``sordino start`` printed
ended its start-up or its stop, and its workers, which hold their own copies of the
same streams, failed every request of a Python model that prints (Triton's examples
do) or logs: ``execute raised BrokenPipeError``. The server's and each worker's
``sys.stdout`` and ``sys.stderr`` are therefore :class:`KeptStream`: the first write
that finds the reader gone points that stream at ``/dev/null``, and the write, and
every later one (a printed line, a log record), is dropped there instead of failing.

A reader that is there but does not read (a terminal paused with Ctrl-S, a ``tee``
stuck on a slow disk, a container's log driver that blocks) fills the pipe, and the
next write blocks. In the server that write is on the event loop: a burst of error
lines (a model failing every request logs each) wedged the whole server, health
checks included. ``sordino start`` therefore writes both streams through
:class:`BackgroundOutput`: a write only queues the text, one thread writes it in the
order it came, and past :data:`OUTPUT_BACKLOG` characters waiting the new text is
dropped and counted (a line says how much once the reader reads again). Workers keep
writing themselves: a worker stuck on its stream holds only its own batch, which its
execution timeout ends.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import sys
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any, TextIO

__all__ = [
    "OUTPUT_BACKLOG",
    "BackgroundOutput",
    "KeptStream",
    "keep_standard_streams",
    "point_at_null",
]

OUTPUT_BACKLOG = 4 << 20
"""Characters of output that may wait for a reader that does not read; past it, new
output is dropped (and counted) rather than queued."""

LOST = (errno.EPIPE, errno.EIO)
"""A write's errors that mean the stream's reader (pipe, terminal) is gone."""


def point_at_null(fds: Iterable[int]) -> None:
    """Point the descriptors ``fds`` at ``/dev/null``."""
    fds = tuple(fds)
    if not fds:
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in fds:
            os.dup2(null, fd)
    finally:
        os.close(null)


class KeptStream:
    """A text stream (``sys.stdout``, ``sys.stderr``) whose writes never fail for a
    reader gone: on ``EPIPE`` or ``EIO`` its descriptor is pointed at ``/dev/null`` and
    the text that was under way goes there. Everything else is the stream's own."""

    def __init__(self, stream: TextIO, fd: int) -> None:
        self._stream = stream
        self._fd = fd

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._lost(exc)
            return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._lost(exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def _lost(self, exc: OSError) -> None:
        if exc.errno not in LOST:
            raise exc
        point_at_null((self._fd,))
        with contextlib.suppress(OSError):  # what the failed write left buffered
            self._stream.flush()


class BackgroundOutput:
    """One thread that writes the text of several streams in the order it was written.

    :meth:`put` never blocks: it queues the text, or drops it while ``limit``
    characters already wait (the reader does not read). A run of drops is said by a
    line queued where the dropped text would have been (on the stream of its first
    drop), so that what is kept and what is said about the rest keep their order.
    """

    def __init__(self, limit: int = OUTPUT_BACKLOG) -> None:
        self._limit = limit
        self._items: deque[tuple[TextIO, str | _Dropped]] = deque()
        self._waiting = 0  # characters queued or being written
        self._writing = False
        self._drops: _Dropped | None = None  # the run of drops still going on, if any
        self._closed = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="sordino-output", daemon=True)
        self._thread.start()

    def put(self, stream: TextIO, text: str) -> None:
        with self._changed:
            if self._closed:  # written as before: nothing else writes now
                stream.write(text)
                return
            if self._waiting + len(text) > self._limit:
                if self._drops is not None:  # the same run of drops
                    self._drops.characters += len(text)
                else:
                    self._drops = _Dropped(len(text))
                    self._items.append((stream, self._drops))
                    self._changed.notify_all()
                return
            self._drops = None
            self._items.append((stream, text))
            self._waiting += len(text)
            self._changed.notify_all()

    def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for everything queued to be written; True if it was."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._items and not self._writing, timeout_s)

    def close(self, timeout_s: float) -> None:
        """Give what is queued ``timeout_s`` to be written, then end the thread; later
        writes are made at once, by their writer."""
        self.drain(timeout_s)
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._items) or self._closed)
                if not self._items:
                    return
                items = list(self._items)
                self._items.clear()
                self._writing = True
            written = 0
            streams: dict[int, TextIO] = {}
            for stream, item in items:
                if isinstance(item, _Dropped):
                    with self._changed:  # said now: later drops are another run
                        if self._drops is item:
                            self._drops = None
                        text = str(item)
                else:
                    text = item
                    written += len(text)
                with contextlib.suppress(Exception):  # (a KeptStream drops a lost reader)
                    stream.write(text)
                streams[id(stream)] = stream
            for stream in streams.values():
                with contextlib.suppress(Exception):
                    stream.flush()
            with self._changed:
                self._waiting -= written
                self._writing = False
                self._changed.notify_all()


class _Dropped:
    """Where a run of dropped output was, and how many characters it had (grown while it
    is the last thing queued; taken by the output's thread, it no longer changes)."""

    def __init__(self, characters: int) -> None:
        self.characters = characters

    def __str__(self) -> str:
        return (
            f"[sordino: {self.characters} characters of output were dropped here: this "
            "stream was not read while they came]\n"
        )


class _Queued:
    """A standard stream whose writes go through a :class:`BackgroundOutput`."""

    def __init__(self, stream: KeptStream, output: BackgroundOutput) -> None:
        self._stream = stream
        self._output = output

    def write(self, text: str) -> int:
        if not isinstance(text, str):  # as a text stream: click probes with b"" for binary
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self._output.put(self._stream, text)  # type: ignore[arg-type]
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Nothing to wait for: the output's thread flushes what it writes."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def keep_standard_streams(*, background: bool = False) -> BackgroundOutput | None:
    """Make ``sys.stdout`` and ``sys.stderr`` :class:`KeptStream` (in ``sordino start`` and
    in a worker, before a log handler or a model takes a reference to them); with
    ``background``, written by a :class:`BackgroundOutput` too, which is returned (the
    caller closes it when done; at exit, what is queued is given 2 s to be read)."""
    output = BackgroundOutput() if background else None
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, KeptStream | _Queued):
            kept = KeptStream(stream, fd)
            setattr(sys, name, _Queued(kept, output) if output is not None else kept)
    if output is not None:
        atexit.register(output.close, 2.0)
    return output
