"""Staging: putting a batch into the shared-memory arena for a worker process.

The executor's client of the memory manager. For a model in worker processes, a
batch is staged before it runs: each input is copied once into an arena block (a
batch built by :meth:`Staging.assemble` is there already and is only adopted), and
blocks are reserved for the outputs whose size the model's metadata fixes. Outputs
of unknown size (strings, variable dimensions) get their space later, when the
worker asks, through the batch's ``allocate`` callback. Thread-isolated models run
on the arrays as they are; staging leaves them alone.

Every block a staged batch holds is listed in :attr:`StagedBatch.blocks` the moment
it is acquired, and :meth:`Staging.release` gives all of them back. :meth:`Staging.stage`
gives back what it acquired when it fails or is cancelled; after that the caller
releases the batch once it has run, whatever happened (``try`` / ``finally``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from sordino.datatypes import to_numpy_dtype
from sordino.inference import ModelMetadata, Tensor
from sordino.memory.allocator import Block
from sordino.memory.arena import Arena, shm_free_bytes
from sordino.memory.tensors import TensorHandle, tensor_nbytes, write_tensor
from sordino.records import ArenaStatistics

__all__ = ["StagedBatch", "Staging"]

log = logging.getLogger("sordino.execution")

Allocate = Callable[[dict[str, int]], Awaitable[dict[str, TensorHandle]]]


@dataclass(slots=True)
class StagedBatch:
    """A batch ready to run: its arrays, and (process isolation) its place in the arena.

    ``handles`` name the inputs in the arena, ``space`` the blocks reserved for
    outputs, ``blocks`` every block the batch holds; ``allocate`` reserves more output
    space while the batch runs.
    """

    arrays: dict[str, Tensor]
    handles: dict[str, TensorHandle] = field(default_factory=dict)
    space: dict[str, TensorHandle] = field(default_factory=dict)
    blocks: list[Block] = field(default_factory=list)
    allocate: Allocate | None = None
    buffer: memoryview | None = None
    released: bool = False


class Staging:
    """Stages batches in one shared-memory arena, created when first needed.

    ``capacity`` is the arena's size in bytes (``workers.shared_memory``); when
    ``/dev/shm`` has less free, the arena takes half of what is free.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._arena: Arena | None = None
        self._assembled: dict[int, tuple[Tensor, Block]] = {}

    @property
    def arena(self) -> Arena:
        """The arena, created on first use (the first worker process needs its name)."""
        if self._arena is None:
            size = self._capacity
            free = shm_free_bytes()
            if free is not None and free < size:
                log.warning(
                    "/dev/shm has %d bytes free, less than workers.shared_memory (%d); using %d",
                    free,
                    size,
                    free // 2,
                )
                size = max(4096, free // 2)
            self._arena = Arena(size)
        return self._arena

    def statistics(self) -> ArenaStatistics | None:
        """The arena's figures, or None before anything needed it."""
        return self._arena.statistics() if self._arena is not None else None

    def close(self) -> None:
        """Remove the arena; batches still assembled there are forgotten with it."""
        self._assembled.clear()
        if self._arena is not None:
            self._arena.close()

    async def assemble(
        self, parts: Sequence[dict[str, Tensor]], *, in_arena: bool
    ) -> dict[str, Tensor]:
        """Concatenate request inputs into one batch; with ``in_arena``, straight into the arena.

        An arena-built batch is adopted by the :meth:`stage` that gets it (or given
        back by :meth:`discard`). If building it fails or is cancelled, the blocks it
        took so far are given back.
        """
        batch: dict[str, Tensor] = {}
        taken: list[Tensor] = []
        try:
            for name in parts[0]:
                arrays = [part[name] for part in parts]
                first = arrays[0]
                if not in_arena or first.dtype == np.object_:
                    batch[name] = np.concatenate(arrays)
                    continue
                shape = (sum(a.shape[0] for a in arrays), *first.shape[1:])
                nbytes = math.prod(shape) * first.dtype.itemsize
                arena = self.arena
                block = await arena.acquire(nbytes)
                view: Tensor = np.ndarray(shape, first.dtype, arena.buffer, block.offset)
                self._assembled[view.ctypes.data] = (view, block)
                taken.append(view)
                np.concatenate(arrays, out=view)
                batch[name] = view
        except BaseException:
            for view in taken:
                self._give_back(view)
            raise
        return batch

    def discard(self, batch: dict[str, Tensor]) -> None:
        """Give back the blocks of an assembled ``batch`` that will not be staged."""
        for array in batch.values():
            self._give_back(array)

    async def stage(
        self, batch: dict[str, Tensor], metadata: ModelMetadata, *, in_arena: bool
    ) -> StagedBatch:
        """Stage ``batch``; with ``in_arena``, place it and its known outputs in the arena.

        On any failure or cancellation (an output that can never fit, a wait for
        space that is cancelled) every block acquired here is given back before the
        error propagates; assembled inputs it adopted are given back too.
        """
        staged = StagedBatch(arrays=batch)
        if not in_arena:
            return staged
        arena = self.arena
        staged.buffer = arena.buffer
        try:
            for name, array in batch.items():
                owned = self._adopt(array)
                if owned is not None:
                    staged.blocks.append(owned)
                    staged.handles[name] = TensorHandle(
                        owned.offset,
                        int(array.nbytes),
                        array.dtype.str,
                        tuple(array.shape),
                        owned.size,
                    )
                    continue
                block = await arena.acquire(tensor_nbytes(array))
                staged.blocks.append(block)
                staged.handles[name] = write_tensor(arena.buffer, block.offset, block.size, array)
            rows = int(next(iter(batch.values())).shape[0]) if metadata.batched else 1
            for spec in metadata.outputs:
                dims = spec.item_shape if metadata.batched else spec.shape
                if spec.datatype == "BYTES" or any(d < 0 for d in dims):
                    continue
                size = rows * math.prod(dims) * to_numpy_dtype(spec.datatype).itemsize
                block = await arena.acquire(size)
                staged.blocks.append(block)
                staged.space[spec.name] = TensorHandle.space(block)
        except BaseException:
            self.release(staged)
            # Inputs assembled for this batch but not adopted yet go back as well.
            self.discard(batch)
            raise

        async def allocate(sizes: dict[str, int]) -> dict[str, TensorHandle]:
            space = {}
            for name, size in sizes.items():
                block = await arena.acquire(size)
                if staged.released:
                    # The batch ended while this waited for space (the worker's handle
                    # cancels the wait then; this is the guard should it not have).
                    arena.release(block)
                    raise asyncio.CancelledError
                staged.blocks.append(block)
                space[name] = TensorHandle.space(block)
            return space

        staged.allocate = allocate
        return staged

    def release(self, staged: StagedBatch) -> None:
        """Give back every block ``staged`` holds; later calls do nothing."""
        staged.released = True
        blocks, staged.blocks = staged.blocks, []
        if self._arena is not None:
            for block in blocks:
                self._arena.release(block)

    def _adopt(self, array: Tensor) -> Block | None:
        """The block under ``array`` if :meth:`assemble` built it; it is the caller's now."""
        key = array.ctypes.data
        owned = self._assembled.get(key)
        if owned is None or owned[0] is not array:
            return None
        del self._assembled[key]
        return owned[1]

    def _give_back(self, array: Tensor) -> None:
        block = self._adopt(array)
        if block is not None and self._arena is not None:
            self._arena.release(block)
