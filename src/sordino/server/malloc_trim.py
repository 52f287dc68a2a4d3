"""Giving memory back to the system after large request bodies (glibc's ``malloc_trim``).

Request bodies arrive in reads of up to 256 KiB and are joined into one buffer. glibc
serves the first such blocks with ``mmap`` and returns them on ``free``, but then
raises its mmap threshold (up to 32 MiB), so later ones come from the heap, and a heap
that held many large bodies keeps them as free pages: after a churn of 2,000
connections sending 200 KB bodies the server's RSS stayed 40 MB higher, with no
Python object left (``tracemalloc`` and ``gc`` found none), until ``malloc_trim(0)``
gave it back (162 -> 123 MB). So once at least :data:`TRIM_AFTER_BYTES` of bodies
have been read, ``malloc_trim`` runs on a thread (ctypes releases the GIL), at most
every :data:`TRIM_EVERY_S`. Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

__all__ = ["TRIM_AFTER_BYTES", "TRIM_EVERY_S", "Trimmer"]

log = logging.getLogger("sordino.http")

TRIM_AFTER_BYTES = 64 * 1024 * 1024
"""Request body bytes read since the last trim that make the next one worth its cost."""
TRIM_EVERY_S = 5.0
"""Least time between two trims (a trim walks the heap; it takes milliseconds)."""


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)  # glibc only
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    function: Callable[[int], int] = trim
    return function


class Trimmer:
    """Counts request body bytes and, past :data:`TRIM_AFTER_BYTES`, trims the heap."""

    def __init__(self) -> None:
        self._trim = _malloc_trim()
        self._read = 0
        self._scheduled = False
        self.trims = 0
        """Trims done so far."""

    def note(self, loop: asyncio.AbstractEventLoop, size: int) -> None:
        """``size`` more body bytes were read (and will be freed once served)."""
        self._read += size
        if self._read >= TRIM_AFTER_BYTES and not self._scheduled and self._trim is not None:
            self._scheduled = True
            # Later, not now: the bodies are still held while their requests are served.
            loop.call_later(TRIM_EVERY_S, self._start, loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._read = 0
        future = loop.run_in_executor(None, self._run)
        future.add_done_callback(self._done)

    def _run(self) -> None:
        assert self._trim is not None
        self._trim(0)

    def _done(self, future: asyncio.Future[None]) -> None:
        self._scheduled = False
        self.trims += 1
        if future.exception() is not None:
            log.debug("malloc_trim failed: %s", future.exception())
