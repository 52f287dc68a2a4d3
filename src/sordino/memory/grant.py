"""A front-end process's own part of the arena: its inputs are written there, read in place.

With ``server.frontends`` > 1 a front end decodes a request's body and the engine
serves it. Rather than send the tensors' bytes over the link, the engine grants each
front end one block of the arena when it says hello (:class:`Grant`, on the engine);
the front end maps that block read-write and lays each numeric input it decoded into
a free range of it (:class:`GrantSpace`, its own allocator), and the ``INFER`` frame
names the ranges (``server/link_tensors.py``). The engine wraps them in a
:class:`~sordino.memory.refs.Lease` of the grant, so the request's tensors are arena
tensors like any other: a batch of one request goes to its worker by reference, and
the ranges go back to the front end (``FREED``) when the last holder lets go.

The grant's block is pinned for as long as the link lives: its holder is never parked,
so defragmentation and compaction never move it, and the arena is never quiet enough
to be resized (``memory.pool_size: auto`` therefore grants nothing). When the link
ends the grant goes back to the arena once the last range lent from it is released
(requests still running keep theirs). Ranges are checked against the grant: one
outside it, or one already lent, is refused (a broken front end).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from sordino.errors import OutOfMemory
from sordino.memory.allocator import Allocator, Block, Lifetime
from sordino.memory.refs import Lease
from sordino.memory.segments import segment_path

if TYPE_CHECKING:
    from sordino.memory.arena import Arena

__all__ = ["GRANT_MAX", "Grant", "GrantSpace", "grant_size"]

GRANT_MAX = 32 * 1024 * 1024
"""The most bytes of the arena one front end is granted."""


def grant_size(arena: Arena, frontends: int) -> int:
    """The bytes each of ``frontends`` front-end processes is granted in ``arena``: all
    of them together an eighth of it at most, each at most :data:`GRANT_MAX`."""
    return min(arena.capacity // (8 * max(1, frontends)), GRANT_MAX)


class Grant:
    """The engine's side of one front end's grant (see the module's doc).

    To the leases of the ranges it lends it stands where an arena does
    (``refs.BlockSource``); ``freed`` is told each range's offset when it is released
    while the link lives. Raises OutOfMemory when the arena has no ``size`` bytes free.
    """

    def __init__(self, arena: Arena, size: int, freed: Callable[[int], None]) -> None:
        holder = Lease(arena, owner="frontend")
        try:
            self.block = holder.acquire_nowait(size, "long")
        except OutOfMemory:
            holder.release()
            raise
        self._arena = arena
        self._holder: Lease | None = holder  # never parked: the block is pinned
        self._freed = freed
        self._live: dict[int, int] = {}  # lent ranges: offset -> bytes
        self._closed = False

    @property
    def segment(self) -> str:
        return self._arena.name

    @property
    def lent(self) -> int:
        """Ranges lent now (requests whose inputs lie in the grant)."""
        return len(self._live)

    def lease(self, ranges: list[tuple[int, int]]) -> Lease:
        """A lease of ``ranges`` (arena offset, bytes) the front end wrote; one hold.

        Raises ValueError for a range outside the grant or one already lent.
        """
        start, end = self.block.offset, self.block.offset + self.block.size
        seen: set[int] = set()
        for offset, size in ranges:
            if not start <= offset <= offset + size <= end or size <= 0:
                raise ValueError(
                    f"bytes {offset}..{offset + size} are not in this front end's grant"
                )
            if offset in self._live or offset in seen:
                raise ValueError(f"bytes at {offset} are lent twice")
            seen.add(offset)
        lease = Lease(self, owner="frontend")
        for offset, size in ranges:
            lease._blocks.append(Block(offset, size))
            self._live[offset] = size
        return lease

    def close(self) -> None:
        """The link ended: nothing more is freed to it; the block goes back to the arena
        once every range lent is released."""
        self._closed = True
        self._give_back()

    def _give_back(self) -> None:
        if self._closed and not self._live and self._holder is not None:
            holder, self._holder = self._holder, None
            holder.release()

    # -- what a Lease needs of its arena (refs.BlockSource) ----------------------------

    @property
    def buffer(self) -> memoryview:
        return self._arena.buffer

    def acquire_nowait(self, nbytes: int, lifetime: Lifetime = "short") -> Block:
        raise OutOfMemory("a front end's grant is filled by the front end only")

    async def acquire(self, nbytes: int) -> Block:
        raise OutOfMemory("a front end's grant is filled by the front end only")

    def release(self, block: Block) -> None:
        self._live.pop(block.offset, None)
        if not self._closed:
            self._freed(block.offset)
        self._give_back()

    def _track(self, lease: Lease) -> None:
        pass  # the grant's ranges are never moved: nothing to follow

    def _untrack(self, lease: Lease) -> None:
        pass


class GrantSpace:
    """The front end's side of its grant: the block mapped read-write, and its allocator.

    Offsets are the arena's. Raises OSError when the segment cannot be mapped.
    """

    def __init__(self, segment: str, offset: int, size: int) -> None:
        start = offset // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
        fd = os.open(segment_path(segment), os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, offset + size - start, offset=start)
        finally:
            os.close(fd)
        self._view = memoryview(self._map)[offset - start : offset - start + size]
        self.segment, self.offset, self.size = segment, offset, size
        self._allocator = Allocator(size, base=offset)
        self._blocks: dict[int, Block] = {}

    def put(self, array: np.ndarray[Any, Any]) -> int | None:
        """Copy numeric ``array`` into a free range, little-endian; its arena offset, or
        None when the grant has no room for it now (the caller sends the bytes)."""
        try:
            block = self._allocator.acquire_nowait(array.nbytes)
        except OutOfMemory:
            return None
        self._blocks[block.offset] = block
        target: np.ndarray[Any, Any] = np.ndarray(
            array.shape, array.dtype.newbyteorder("<"), self._view, block.offset - self.offset
        )
        target[...] = array
        return block.offset

    def free(self, offset: int) -> None:
        """The engine let go of the range at ``offset`` (or it was never sent)."""
        block = self._blocks.pop(offset, None)
        if block is not None:
            self._allocator.release(block)

    @property
    def used(self) -> int:
        """Ranges in use now."""
        return len(self._blocks)
