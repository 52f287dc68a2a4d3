"""Driving a runtime's shared-memory arena into fragmentation, for tests.

:func:`fragment_arena` fills the arena with blocks held by parked tensors (as queued
work holds its inputs), then gives back every other block, and more from the top,
until the arena's fragmentation is at least ``target``: scattered holes a large
batch cannot use, but that defragmentation can close, since parked blocks may move.
Call it on the runtime's event loop thread (the arena is not thread-safe), and
``release()`` what it returns when done.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from sordino.errors import OutOfMemory
from sordino.memory.refs import Lease, TensorRef, Tensors
from sordino.server.runtime import Runtime

__all__ = ["Fragmentation", "fragment_arena"]


@dataclass
class Fragmentation:
    """The parked blocks :func:`fragment_arena` holds; ``release()`` gives them back."""

    tensors: list[Tensors] = field(default_factory=list)
    fragmentation: float = 0.0
    """The arena's fragmentation right after fragmenting it."""

    def release(self) -> None:
        for tensors in self.tensors:
            tensors.release()
        self.tensors.clear()


def fragment_arena(
    runtime: Runtime, target: float, *, pieces: int = 64, fill: bool = True
) -> Fragmentation:
    """Fragment ``runtime``'s arena to at least ``target`` (0..1) with ``pieces`` blocks.

    Every block holds a known pattern (its index), so a test can check afterwards
    that moving them kept their contents: ``int(t["block"][0])`` is the index. With
    ``fill`` false only that first word is written: an arena of gigabytes is then
    fragmented without touching each of its pages (which would hold the event loop,
    and so the workers' heartbeats, for seconds).
    """
    if not 0.0 < target < 1.0:
        raise ValueError(f"target must be between 0 and 1, not {target}")
    arena = runtime.memory.owner.arena
    size = max(64, arena.capacity // pieces // 64 * 64)
    held: list[Tensors] = []
    for index in range(pieces):
        lease = Lease(arena)
        try:
            block = lease.acquire_nowait(size)
        except OutOfMemory:
            lease.release()
            break
        view = np.ndarray((size // 8,), np.int64, arena.buffer, block.offset)
        view[: None if fill else 1] = index
        tensors = Tensors({"block": TensorRef(view, block.offset)}, (lease,))
        tensors.park()
        held.append(tensors)
    kept = [t for i, t in enumerate(held) if i % 2 == 0]
    for index, tensors in enumerate(held):
        if index % 2:
            tensors.release()
    # Fewer holes while the target still holds: give back blocks from the top, each
    # tried first on a copy of the allocator.
    while len(kept) > 1:
        trial = copy.deepcopy(arena.allocator)
        for block in kept[-1].leases[0]._blocks:
            trial.release(block)
        if trial.statistics().fragmentation < target:
            break
        kept.pop().release()
    return Fragmentation(kept, arena.statistics().fragmentation)
