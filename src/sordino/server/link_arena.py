"""The engine link's arena frames: tensors that cross as places in the arena, not bytes.

``server/link_tensors.py`` carries a tensor either inline (its bytes in the frame) or
as an *arena descriptor*: its offset in the engine's arena segment, with the
datatype, shape and byte length it always carries. This module holds the frames
that keep those places alive and the rules for which tensors may go so:

``GRANT`` (engine → front end, once, after ``HELLO``)
    ``<QQ>`` the offset and size of the block of the arena the front end may write its
    decoded inputs into (``memory/grant.py``), then the segment's name. No grant (no
    frame) when the engine has no arena (every model on threads), when it is sized
    automatically (``memory.pool_size: auto``: a pinned block would keep it from ever
    being resized), when ``memory.zero_on_free`` is on (a range reused by the same
    front end is not zeroed), or when the arena has no room for it.
``FREED`` (engine → front end)
    ``<Q>`` offsets of granted ranges the engine let go of (their request ended and
    its batch is done with them): the front end may reuse them. One frame per
    event-loop turn.
``RELEASE`` (front end → engine)
    ``<Q>`` ids of ``RESULT`` frames that held outputs, encoded and written: their
    holds go back to the arena. One frame per event-loop turn.

An input goes by descriptor when it is numeric and larger than :data:`INLINE_MAX` and
the front end has a grant with room for it; an output when it lies in the arena,
C-contiguous and little-endian, and is larger than :data:`INLINE_MAX`. Everything else
goes inline (see ``server/link_tensors.py``).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import numpy as np

from sordino.inference import Tensor
from sordino.server.link_frames import FrameError, frame_head

if TYPE_CHECKING:
    from sordino.memory.arena import Arena

__all__ = [
    "FREED",
    "GRANT",
    "INLINE_MAX",
    "RELEASE",
    "Unreadable",
    "arena_base",
    "decode_grant",
    "decode_ids",
    "encode_grant",
    "encode_ids",
    "in_place",
]

RELEASE, GRANT, FREED = 14, 15, 16
INLINE_MAX = 16 * 1024
"""Bytes a tensor has at most to go as bytes even when it could go by descriptor. The
engine's core is the scarce one, and below about this size a descriptor costs it more
than the copy (``python -m bench.bench_link_descriptors``, µs of the engine's CPU a
request, bytes against descriptor: a 1 KiB input 31 against 42, 16 KiB 40 against 40,
48 KiB 60 against 42; a 4 KiB output 11.6 against 15.4, 48 KiB 19.0 against 17.3, the
front end's 72 against 37; busy 2-core machine, indicative)."""
_ID = struct.Struct("<Q")
_GRANT = struct.Struct("<QQ")
_LITTLE = frozenset("<|=" if np.little_endian else "<|")  # "=": native
_BASES: dict[str, int] = {}


class Unreadable(Exception):
    """A ``RESULT`` whose outputs lie in an arena segment this process cannot map: its
    id and why (the request is answered with an error, its hold released)."""

    def __init__(self, ident: int, reason: str) -> None:
        super().__init__(reason)
        self.ident = ident


def encode_ids(kind: int, idents: list[int]) -> bytes:
    """A ``RELEASE`` or ``FREED`` frame of ``idents`` (result ids, range offsets)."""
    body = struct.pack(f"<{len(idents)}Q", *idents)
    return frame_head(len(body), kind) + body


def decode_ids(body: bytes) -> tuple[int, ...]:
    """The ids a ``RELEASE`` or ``FREED`` frame's body holds."""
    if len(body) % _ID.size:
        raise FrameError("a broken release frame")
    return struct.unpack(f"<{len(body) // _ID.size}Q", body)


def encode_grant(segment: str, offset: int, size: int) -> bytes:
    """The ``GRANT`` frame of ``size`` bytes at ``offset`` of arena segment ``segment``."""
    body = _GRANT.pack(offset, size) + segment.encode("utf-8")
    return frame_head(len(body), GRANT) + body


def decode_grant(body: bytes) -> tuple[str, int, int]:
    """The segment, offset and size a ``GRANT`` frame's body holds."""
    try:
        offset, size = _GRANT.unpack_from(body)
        return body[_GRANT.size :].decode("utf-8"), offset, size
    except (struct.error, UnicodeDecodeError) as exc:
        raise FrameError(f"a malformed grant frame: {exc}") from None


def arena_base(arena: Arena) -> int | None:
    """The address the arena's segment is mapped at in this process (outputs are checked
    to lie in it, not in another executor's segment); None once it is closed."""
    if arena.closed:
        return None
    name = arena.name
    base = _BASES.get(name)
    if base is None:
        base = int(np.frombuffer(arena.buffer, np.uint8).__array_interface__["data"][0])
        _BASES.clear()  # one arena per process: the one before was resized away
        _BASES[name] = base
    return base


def in_place(array: Tensor, offset: int | None, base: int | None) -> bool:
    """Whether output ``array``, said to lie at ``offset`` of the arena mapped at
    ``base``, may go as a descriptor (see the module's docstring)."""
    return (
        offset is not None
        and base is not None
        and array.nbytes > INLINE_MAX
        and array.dtype.byteorder in _LITTLE
        and array.dtype != np.object_
        and bool(array.flags.c_contiguous)
        and array.__array_interface__["data"][0] == base + offset
    )
