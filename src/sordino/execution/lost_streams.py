"""A standard stream whose reader went away, in the server and in its workers.

``sordino start | head``, a ``tee`` that was stopped, a terminal that hung up: every
write to the stream then fails (``EPIPE``, ``EIO``): a line ``sordino start`` printed
ended its start-up or its stop, and its workers, which hold their own copies of the
same streams, failed every request of a Python model that prints (Triton's examples
do) or logs: ``execute raised BrokenPipeError``. The server's and each worker's
``sys.stdout`` and ``sys.stderr`` are therefore :class:`KeptStream`: the first write
that finds the reader gone points that stream at ``/dev/null``, and the write, and
every later one (a printed line, a log record), is dropped there instead of failing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterable
from typing import Any, TextIO

__all__ = ["KeptStream", "keep_standard_streams", "point_at_null"]

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


def keep_standard_streams() -> None:
    """Make ``sys.stdout`` and ``sys.stderr`` :class:`KeptStream` (in ``sordino start`` and
    in a worker, before a log handler or a model takes a reference to them)."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, KeptStream):
            setattr(sys, name, KeptStream(stream, fd))
