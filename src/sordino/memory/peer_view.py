"""The arena as a front-end process sees it: mapped read-only, by the segment's name.

A front-end process (``server.frontends`` > 1) encodes a response's outputs straight
from the engine's arena: the engine sends each output's place (offset, length,
datatype, shape) and the segment's name, and keeps the response's blocks held until
the front end says it is done (``server/link_tensors.py``). :class:`ArenaView` maps
that segment here read-only (``PROT_READ``: a front end cannot write the engine's
memory by mistake) and remaps when the name changes (the engine replaced the segment
in a resize; it never does while a block is held, see ``Arena.quiet``).

POSIX shared memory is read through ``/dev/shm`` (Linux, as the front ends' sockets
are); a mapping that fails raises OSError, which the caller answers as an error.
"""

from __future__ import annotations

import mmap
import os

from sordino.memory.segments import segment_path

__all__ = ["ArenaView"]


class ArenaView:
    """A read-only mapping of the engine's arena segment, by name (see the module's doc).

    All calls come from the front end's event-loop thread.
    """

    __slots__ = ("_map", "_name", "_view")

    def __init__(self) -> None:
        self._name: str | None = None
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None

    @property
    def name(self) -> str | None:
        """The segment mapped now (None before the first)."""
        return self._name

    def bytes_at(self, name: str, offset: int, size: int) -> memoryview:
        """``size`` read-only bytes at ``offset`` of segment ``name``, mapped on first use.

        Raises OSError when the segment cannot be mapped and ValueError for a range
        outside it (a broken peer).
        """
        view = self._view
        if view is None or name != self._name:
            view = self._remap(name)
        if offset < 0 or size < 0 or offset + size > len(view):
            raise ValueError(
                f"bytes {offset}..{offset + size} lie outside the arena segment ({len(view)} bytes)"
            )
        return view[offset : offset + size]

    def _remap(self, name: str) -> memoryview:
        self.close()
        fd = os.open(segment_path(name), os.O_RDONLY)
        try:
            mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self._name, self._map, self._view = name, mapped, memoryview(mapped)
        return self._view

    def close(self) -> None:
        """Drop the mapping (views still alive keep it mapped until they go)."""
        self._name, self._map, self._view = None, None, None
