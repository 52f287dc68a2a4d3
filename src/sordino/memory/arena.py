"""The shared-memory arena: one segment, an allocator over it, and waiting for space.

The server owns the arena; worker processes :func:`attach_segment` to the same
segment by name and read and write tensors in place. ``acquire`` waits (first come,
first served) until a block fits; ``acquire_nowait`` never blocks and raises
:class:`OutOfMemory` instead. A request larger than the whole arena fails at once.
All calls come from the event loop's thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from multiprocessing import resource_tracker, shared_memory

from sordino.errors import OutOfMemory
from sordino.memory.allocator import ALIGNMENT, Allocator, Block
from sordino.records import ArenaStatistics

__all__ = ["Arena", "attach_segment"]

log = logging.getLogger("sordino.memory")


class Arena:
    """A shared-memory segment of ``capacity`` bytes handed out in aligned blocks."""

    def __init__(self, capacity: int) -> None:
        capacity = max(ALIGNMENT, capacity // ALIGNMENT * ALIGNMENT)
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


def attach_segment(name: str) -> shared_memory.SharedMemory:
    """Map the arena segment ``name`` in a worker process, without taking ownership.

    Python < 3.13 registers every attached segment with the resource tracker, which
    would unlink the server's segment when the worker exits; registration is skipped.
    """
    register = resource_tracker.register
    resource_tracker.register = lambda *args, **kwargs: None
    try:
        return shared_memory.SharedMemory(name=name)
    finally:
        resource_tracker.register = register


def shm_free_bytes() -> int | None:
    """Free bytes of /dev/shm, or None where it cannot be read."""
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize
