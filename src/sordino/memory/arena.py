"""The shared-memory arena: one segment, an allocator over it, and waiting for space.

The server owns the arena; worker processes :func:`attach_segment` to the same
segment by name and read and write tensors in place. ``acquire`` waits (first come,
first served) until a block fits; ``acquire_nowait`` never blocks and raises
:class:`OutOfMemory` instead. A request larger than the whole arena fails at once.
All calls come from the event loop's thread.

A segment outlives a server killed with SIGKILL (nothing runs to remove it). So that
the next server on the same data dir can remove it, an arena given a ``registry``
folder records its segment there as a file of the same name, locked (``flock``) for
as long as the arena is open; :func:`remove_stale_segments` removes every recorded
segment whose file nobody holds locked any more: its server is gone, however it ended.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import secrets
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from typing import IO, Any

from sordino.errors import OutOfMemory
from sordino.memory.allocator import ALIGNMENT, Allocator, Block
from sordino.records import ArenaStatistics

__all__ = ["SEGMENTS_DIR", "Arena", "StaleSegment", "attach_segment", "remove_stale_segments"]

SEGMENTS_DIR = "shm"
"""The folder of ``server.data_dir`` where the arena records its segment."""

log = logging.getLogger("sordino.memory")


class Arena:
    """A shared-memory segment of ``capacity`` bytes handed out in aligned blocks."""

    def __init__(self, capacity: int, *, registry: Path | None = None) -> None:
        """Create the segment; with ``registry``, record it there (see the module's doc)."""
        capacity = max(ALIGNMENT, capacity // ALIGNMENT * ALIGNMENT)
        self._record: IO[str] | None = None
        if registry is not None:
            self._shm, self._record = _create_recorded(registry, capacity)
        else:
            self._shm = shared_memory.SharedMemory(create=True, size=capacity)
        self._allocator = Allocator(capacity)
        self._waiters: deque[tuple[int, asyncio.Future[Block]]] = deque()
        self._closed = False

    @property
    def name(self) -> str:
        """The segment's name; workers attach to it with :func:`attach_segment`."""
        return self._shm.name

    @property
    def buffer(self) -> memoryview:
        """The whole segment as bytes."""
        buf = self._shm.buf
        assert buf is not None
        return buf

    @property
    def capacity(self) -> int:
        return self._allocator.capacity

    def acquire_nowait(self, nbytes: int) -> Block:
        """Reserve a block of at least ``nbytes``; raise :class:`OutOfMemory` if none fits now."""
        if self._waiters:  # never overtake someone already waiting
            raise OutOfMemory(f"shared memory is short: {len(self._waiters)} requests wait")
        return self._allocator.acquire_nowait(nbytes)

    async def acquire(self, nbytes: int) -> Block:
        """Reserve a block of at least ``nbytes``, waiting until one is released if needed."""
        if nbytes > self.capacity:
            raise OutOfMemory(
                f"{nbytes} bytes cannot fit in the shared-memory arena of {self.capacity} "
                "bytes; raise workers.shared_memory or lower the batch size"
            )
        if not self._waiters and self._allocator.fits(nbytes):
            return self._allocator.acquire_nowait(nbytes)
        future: asyncio.Future[Block] = asyncio.get_running_loop().create_future()
        self._waiters.append((nbytes, future))
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(future.result())
            else:
                self._waiters = deque(w for w in self._waiters if w[1] is not future)
            raise

    def release(self, block: Block) -> None:
        """Return ``block`` to the arena and hand space to waiters in arrival order."""
        self._allocator.release(block)
        while self._waiters:
            nbytes, future = self._waiters[0]
            if future.done():
                self._waiters.popleft()
                continue
            if not self._allocator.fits(nbytes):
                break
            self._waiters.popleft()
            future.set_result(self._allocator.acquire_nowait(nbytes))

    def statistics(self) -> ArenaStatistics:
        stats = self._allocator.statistics()
        return ArenaStatistics(
            name=self.name,
            reserved_bytes=stats.reserved_bytes,
            in_use_bytes=stats.in_use_bytes,
            peak_bytes=stats.peak_bytes,
            free_bytes=stats.free_bytes,
            largest_free=stats.largest_free,
            fragmentation=stats.fragmentation,
            used_blocks=stats.used_blocks,
            acquired=stats.acquired,
            failed=stats.failed,
            waiting=len(self._waiters),
        )

    def close(self) -> None:
        """Unmap and remove the segment. Views into it must be gone by now."""
        if self._closed:
            return
        self._closed = True
        for _, future in self._waiters:
            if not future.done():
                future.set_exception(OutOfMemory("the shared-memory arena was closed"))
        self._waiters.clear()
        try:
            self._shm.close()
        except BufferError:  # a numpy view still exists; the unlink below still frees it
            log.debug("arena %s closed with live views", self.name)
        self._shm.unlink()
        if self._record is not None:
            # Remove the record while still holding its lock: a server cleaning up
            # meanwhile finds nothing to do, or a segment already gone.
            Path(self._record.name).unlink(missing_ok=True)
            self._record.close()
            self._record = None


def attach_segment(name: str) -> shared_memory.SharedMemory:
    """Map the arena segment ``name`` in a worker process, without taking ownership.

    Python < 3.13 registers every attached segment with the resource tracker, which
    would unlink the server's segment when the worker exits; registration is skipped.
    """
    with _untracked("register"):
        return shared_memory.SharedMemory(name=name)


@contextmanager
def _untracked(call: str) -> Iterator[None]:
    """Keep the resource tracker out of one segment (its ``register`` or ``unregister``)."""
    original: Callable[..., Any] = getattr(resource_tracker, call)
    setattr(resource_tracker, call, lambda *args, **kwargs: None)
    try:
        yield
    finally:
        setattr(resource_tracker, call, original)


@dataclass(frozen=True, slots=True)
class StaleSegment:
    """A segment left by a server that is gone, as :func:`remove_stale_segments` found it."""

    name: str
    pid: int | None
    """The process that created it, as its record says."""
    size_bytes: int | None
    """Its size as recorded; None if the record did not say."""
    removed: bool
    """False when the segment itself was already gone (only its record was left)."""


def _create_recorded(
    registry: Path, capacity: int
) -> tuple[shared_memory.SharedMemory, IO[str] | None]:
    """Create a segment recorded in ``registry``; unrecorded if the folder is unusable."""
    name = f"sordino-{os.getpid()}-{secrets.token_hex(4)}"  # <= 31 bytes with "/" (macOS)
    record: IO[str] | None = None
    try:
        registry.mkdir(parents=True, exist_ok=True)
        record = open(registry / name, "x", encoding="utf-8")  # noqa: SIM115 - held until close()
        fcntl.flock(record, fcntl.LOCK_EX | fcntl.LOCK_NB)
        record.write(f"{os.getpid()} {capacity}\n")
        record.flush()
    except OSError as exc:
        if record is not None:
            Path(record.name).unlink(missing_ok=True)
            record.close()
        log.warning(
            "cannot record the shared-memory segment in %s (%s): a hard crash would leave it "
            "in /dev/shm",
            registry,
            exc,
        )
        return shared_memory.SharedMemory(create=True, size=capacity), None
    try:
        return shared_memory.SharedMemory(name=name, create=True, size=capacity), record
    except BaseException:
        Path(record.name).unlink(missing_ok=True)
        record.close()
        raise


def remove_stale_segments(registry: Path) -> list[StaleSegment]:
    """Remove the segments recorded in ``registry`` whose server is gone; return them.

    A record whose lock nobody holds belongs to a server that ended without closing
    its arena (SIGKILL, a crash): its segment and the record are removed. Records of
    running servers (this process's included) are locked and left alone.
    """
    found: list[StaleSegment] = []
    try:
        records = sorted(registry.glob("sordino-*"))
    except OSError:
        return found
    for path in records:
        try:
            handle = open(path, "r+", encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError:  # removed meanwhile, or unreadable: not ours to judge
            continue
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # its server holds the lock: alive
                continue
            if not path.exists():  # closed cleanly while we waited for the lock
                continue
            pid, size = _parse_record(handle.read())
            removed = _unlink_segment(path.name)
            path.unlink(missing_ok=True)
        found.append(StaleSegment(path.name, pid, size, removed))
    return found


def _parse_record(text: str) -> tuple[int | None, int | None]:
    fields = text.split()
    numbers = [int(f) if f.isdigit() else None for f in fields[:2]]
    numbers += [None] * (2 - len(numbers))
    return numbers[0], numbers[1]


def _unlink_segment(name: str) -> bool:
    """Remove the segment ``name``; False if there was none."""
    try:
        segment = attach_segment(name)
    except FileNotFoundError:
        return False
    segment.close()
    with _untracked("unregister"):  # this process never registered it
        segment.unlink()
    return True


def shm_free_bytes() -> int | None:
    """Free bytes of /dev/shm, or None where it cannot be read."""
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize
