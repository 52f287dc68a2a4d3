"""Staging: putting a batch into the shared-memory arena for a worker process.

The executor's client of the memory manager, whose :class:`~sordino.memory.owner.ArenaOwner`
holds the arena staging writes into. A batch arrives as *parts*, one
:class:`~sordino.memory.refs.Tensors` per request (or per stream step). For a model in
worker processes each input must lie in the arena as one tensor. A single part that is
already there (a stream's carried state, in the block the worker wrote it to) is passed
by reference, with no copy. Otherwise the parts are written once into one new block,
straight from where they lie — for a binary request, the socket buffer it arrived in —
so a request's bytes are copied once between the network and the model. Blocks are
reserved for outputs whose size the model's metadata fixes; outputs of unknown size
(strings, variable dimensions) get space when the worker asks, through ``allocate``.

Two leases hold what a staged batch acquired: ``copies`` (the inputs written in;
given back when the batch is released) and ``outputs`` (output space; handed to the
caller with the results by :meth:`Staging.outputs`, or given back on release). A
block goes into its lease the moment it is acquired, and :meth:`Staging.stage` gives
everything back if it fails or is cancelled, so no failure path can leak a block.

No batch waits for space without end, whatever the configuration: one that cannot fit
the arena at all is refused at once, and the wait for space is bounded by
``memory.overflow_wait`` (then :class:`~sordino.errors.OutOfMemory`, 503). A wait that
cannot end would hold the blocks taken so far and, first in the arena's line, every
batch behind it: the server would stop serving (issue 27).

Thread-isolated models run on the parts concatenated in the server process
(:attr:`StagedBatch.arrays`); staging reserves nothing for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from sordino.datatypes import to_numpy_dtype
from sordino.errors import OutOfMemory
from sordino.execution.batch import NO_CONTEXT, BatchContext
from sordino.execution.decoupled import ResponseChannel
from sordino.inference import ModelMetadata, Tensor
from sordino.memory.arena import Arena
from sordino.memory.owner import ArenaOwner
from sordino.memory.refs import Lease, TensorRef, Tensors
from sordino.memory.tensors import BYTES, TensorHandle, tensor_nbytes, view_tensor, write_tensor

__all__ = ["StagedBatch", "Staging"]

Allocate = Callable[[dict[str, int]], Awaitable[dict[str, TensorHandle]]]
Part = Mapping[str, Tensor]


@dataclass(slots=True)
class StagedBatch:
    """A batch ready to run: its parts and, for a worker process, its place in the arena.

    ``handles`` name each input in the arena, ``space`` the blocks reserved for
    outputs; ``allocate`` reserves more output space while the batch runs.
    ``context`` is the batch's, as the executor was handed it; the instance that
    runs the batch reads it (each request's facts, the parts' owners).
    """

    parts: Sequence[Part]
    batched: bool
    context: BatchContext = NO_CONTEXT
    handles: dict[str, TensorHandle] = field(default_factory=dict)
    space: dict[str, TensorHandle] = field(default_factory=dict)
    copies: Lease | None = None
    outputs: Lease | None = None
    allocate: Allocate | None = None
    buffer: memoryview | None = None
    segment: str = ""
    """The arena segment ``handles`` name (it changes when the pool is resized)."""
    released: bool = False
    channel: ResponseChannel | None = None
    """Where a decoupled batch's responses go (``execution/decoupled.py``); None otherwise."""
    _arrays: dict[str, Tensor] | None = None

    @property
    def rows(self) -> int:
        """Rows of the whole batch (1 for a model without a batch dimension)."""
        if not self.batched:
            return 1
        return sum(int(next(iter(part.values())).shape[0]) for part in self.parts)

    @property
    def request_rows(self) -> tuple[int, ...]:
        """Rows of each part, in order, when the batch joins several (else empty)."""
        if not self.batched or len(self.parts) < 2:
            return ()
        return tuple(int(next(iter(part.values())).shape[0]) for part in self.parts)

    @property
    def arrays(self) -> dict[str, Tensor]:
        """The batch as one array per input (concatenated once, on first use)."""
        if self._arrays is None:
            first = self.parts[0]
            if len(self.parts) == 1:
                self._arrays = dict(first)
            else:
                self._arrays = {
                    name: np.concatenate([part[name] for part in self.parts]) for name in first
                }
        return self._arrays


class Staging:
    """Stages batches in the shared-memory arena of ``owner`` (the memory manager's).

    Staging makes no arena: it writes into :attr:`ArenaOwner.arena
    <sordino.memory.owner.ArenaOwner.arena>`, waits at the owner's gate while the arena
    is resized, and counts its overflow waits and refusals in ``owner.overflow``.
    """

    def __init__(self, owner: ArenaOwner) -> None:
        self._owner = owner
        self._memory = owner.memory
        self.arena_inputs: Counter[tuple[str, bool]] = Counter()
        """Per (model, copied): inputs that already lay in the arena when staged, passed
        by reference (``copied`` False) or written again into the batch's new block
        because the batch joined them with other parts (True). Pipelines report them."""
        self.bytes_copied = 0
        """Bytes of batch inputs written into the arena so far (passed by reference: none)."""

    @property
    def owner(self) -> ArenaOwner:
        """Who holds the arena staging writes into."""
        return self._owner

    @property
    def arena(self) -> Arena:
        """The arena batches are staged in (the owner creates it on first use)."""
        return self._owner.arena

    async def stage(
        self,
        parts: Sequence[Part],
        metadata: ModelMetadata,
        *,
        in_arena: bool,
        context: BatchContext = NO_CONTEXT,
    ) -> StagedBatch:
        """Stage ``parts`` as one batch; with ``in_arena``, by reference into the arena.

        ``context`` goes with the staged batch; its step region (a batch of one step
        of a multi-step request) holds the step's output space.

        On any failure or cancellation (an output that can never fit, a wait for
        space that is cancelled) every block acquired here is given back before the
        error propagates. The parts stay the caller's.
        """
        staged = StagedBatch(parts=parts, batched=metadata.batched, context=context)
        if not in_arena:
            return staged
        owner = self._owner
        if owner.gate_closed:
            await owner.gate(parts)
        arena = owner.arena
        staged.buffer = arena.buffer
        staged.segment = arena.name
        staged.copies = Lease(arena)
        staged.outputs = Lease(arena)
        needed = batch_bytes(parts, metadata)
        try:
            if needed > arena.capacity and not _by_reference(parts):
                # It can never fit, however long it waits: waiting would hold what it
                # took and, first in the arena's line, every batch behind it (issue 27).
                owner.overflow.rejections += 1
                raise OutOfMemory(
                    f"a batch of {needed} bytes cannot fit in the shared-memory arena of "
                    f"{arena.capacity} bytes; send fewer rows per request or raise the "
                    "arena's size (memory.pool_size, --pool-size; default "
                    "workers.shared_memory)"
                )
            placed = False
            if not arena.fits(needed):
                owner.overflow.waits += 1
            elif len(parts) == 1 and context.region is None:
                # The usual batch, one request's: placed at once, so no bound to arm.
                placed = self._place_nowait(staged, parts[0], metadata, arena)
                if not placed:
                    # A block did not fit now after all (the estimate is one block, the
                    # batch takes several, aligned): what was taken goes back, and the
                    # bounded way below places the batch.
                    staged.copies.release()
                    staged.outputs.release()
                    staged.handles.clear()
                    staged.space.clear()
                    staged.copies = Lease(arena)
                    staged.outputs = Lease(arena)
            # Every wait for space is bounded, protection or not: space held by batches
            # that wait themselves (each holding a part of what it needs) never comes.
            try:
                if not placed:
                    async with asyncio.timeout(self._memory.overflow_wait) as waiting:
                        await self._place(staged, parts, metadata)
            except TimeoutError:
                if not waiting.expired():
                    raise
                owner.overflow.rejections += 1
                error = OutOfMemory(
                    f"the shared-memory arena ({arena.capacity} bytes) stayed too full for "
                    f"a batch of {needed} bytes for {self._memory.overflow_wait:g} s "
                    "(memory.overflow_wait); retry later, or raise the arena's size "
                    "(memory.pool_size, --pool-size)"
                )
                error.retry_after_s = max(1.0, self._memory.overflow_wait)
                raise error from None
        except BaseException:
            self.release(staged)
            raise
        outputs = staged.outputs

        async def allocate(sizes: dict[str, int]) -> dict[str, TensorHandle]:
            space = {}
            for name, size in sizes.items():
                if not staged.released:
                    with contextlib.suppress(RuntimeError):  # released while it waited
                        space[name] = TensorHandle.space(await outputs.acquire(size))
                if staged.released:
                    # The batch ended while the worker asked (its handle cancels the
                    # wait then; this is the guard should it not have).
                    raise asyncio.CancelledError
            return space

        staged.allocate = allocate
        return staged

    async def _place(
        self, staged: StagedBatch, parts: Sequence[Part], metadata: ModelMetadata
    ) -> None:
        assert staged.copies is not None and staged.outputs is not None
        for name in parts[0]:
            staged.handles[name] = await self._handle(staged.copies, parts, name, metadata.name)
        rows = staged.rows
        sizes = {name: rows * size for name, size in _output_sizes(metadata)}
        region = staged.context.region if len(parts) == 1 else None
        if region is not None and sizes:
            # One multi-step request's step: its outputs go to the request's region.
            lease = region.lease(self._owner.arena, list(sizes.values()))
            if lease is not None:
                staged.outputs.release()
                staged.outputs = lease
        for name, size in sizes.items():
            block = await staged.outputs.acquire(size)
            staged.space[name] = TensorHandle.space(block)

    def _place_nowait(
        self, staged: StagedBatch, part: Part, metadata: ModelMetadata, arena: Arena
    ) -> bool:
        """Place a one-part batch (no step region) if every block fits now; else False.

        What :meth:`_place` does when no acquire has to wait — each block taken only
        where the arena says it fits now, as its ``acquire`` does, so the allocator
        counts no failure — without its coroutines and its wait's timer. On False the
        blocks taken are still in the staged leases (the caller gives them back) and
        no count has moved.
        """
        copies, outputs = staged.copies, staged.outputs
        assert copies is not None and outputs is not None
        handles = staged.handles
        by_reference = copied_again = copied = 0
        for name in part:
            ref = part.ref(name) if isinstance(part, Tensors) else TensorRef(part[name])
            array = ref.array
            if ref.offset is not None and array.flags.c_contiguous:
                by_reference += 1
                nbytes = int(array.nbytes)
                handles[name] = TensorHandle(
                    ref.offset, nbytes, array.dtype.str, tuple(array.shape), nbytes
                )
                continue
            if ref.offset is not None:
                copied_again += 1
            size = tensor_nbytes(array)
            if not arena.fits(size):
                return False
            block = copies.acquire_nowait(size)
            handle = write_tensor(arena.buffer, block.offset, block.size, array)
            copied += handle.nbytes
            handles[name] = handle
        rows = staged.rows
        for name, size in _output_sizes(metadata):
            if not arena.fits(rows * size):
                return False
            staged.space[name] = TensorHandle.space(outputs.acquire_nowait(rows * size))
        model = metadata.name
        if by_reference:
            self.arena_inputs[model, False] += by_reference
        if copied_again:
            self.arena_inputs[model, True] += copied_again
        self.bytes_copied += copied
        return True

    async def _handle(
        self, copies: Lease, parts: Sequence[Part], name: str, model: str
    ) -> TensorHandle:
        """A handle to input ``name`` of the batch in the arena.

        One part already in the arena (a stream's carried state, a batch output fed
        back) is passed as it lies. Otherwise the parts are written once into one new
        block, straight from where they are (for a binary request, the socket buffer).
        """
        if len(parts) == 1:
            part = parts[0]
            ref = part.ref(name) if isinstance(part, Tensors) else TensorRef(part[name])
            array = ref.array
            if ref.offset is not None and array.flags.c_contiguous:
                self.arena_inputs[model, False] += 1
                nbytes = int(array.nbytes)
                return TensorHandle(ref.offset, nbytes, array.dtype.str, tuple(array.shape), nbytes)
            if ref.offset is not None:
                self.arena_inputs[model, True] += 1
            block = await copies.acquire(tensor_nbytes(array))
            handle = write_tensor(copies.arena.buffer, block.offset, block.size, array)
            self.bytes_copied += handle.nbytes
            return handle
        arrays = [part[name] for part in parts]
        placed = sum(1 for p in parts if isinstance(p, Tensors) and p.ref(name).in_arena)
        if placed:
            self.arena_inputs[model, True] += placed
        first = arrays[0]
        if first.dtype == np.object_:  # BYTES: serialized in the KServe layout
            joined = np.concatenate(arrays)
            block = await copies.acquire(tensor_nbytes(joined))
            handle = write_tensor(copies.arena.buffer, block.offset, block.size, joined)
            self.bytes_copied += handle.nbytes
            return handle
        shape = (sum(a.shape[0] for a in arrays), *first.shape[1:])
        dtype = first.dtype.newbyteorder("=")
        nbytes = math.prod(shape) * dtype.itemsize
        block = await copies.acquire(nbytes)
        view: Tensor = np.ndarray(shape, dtype, copies.arena.buffer, block.offset)
        np.concatenate(arrays, out=view)
        self.bytes_copied += nbytes
        return TensorHandle(block.offset, nbytes, dtype.str, shape, block.size)

    def outputs(self, staged: StagedBatch, results: Mapping[str, TensorRef]) -> Tensors:
        """The batch's outputs, holding its output space (the caller releases them)."""
        lease, staged.outputs = staged.outputs, None
        return Tensors(results, (lease,) if lease is not None else ())

    def release(self, staged: StagedBatch) -> None:
        """Give back the copies and (unless handed over) the output space; once."""
        if staged.released:
            return
        staged.released = True
        for lease in (staged.copies, staged.outputs):
            if lease is not None:
                lease.release()
        # ``allocate`` closes over the batch: dropped here, the batch and everything it
        # holds (its parts, their tensors, its context) are freed when the last
        # reference goes, not left as a cycle for the collector to find.
        staged.copies = staged.outputs = staged.allocate = None


def _by_reference(parts: Sequence[Part]) -> bool:
    """Whether some input of the batch is passed as it lies in the arena (no new block)."""
    if len(parts) != 1 or not isinstance(parts[0], Tensors):
        return False
    part = parts[0]
    return any(part.ref(name).in_arena for name in part)


def row_bytes(part: Part, metadata: ModelMetadata) -> int:
    """Arena bytes one row of ``part`` needs staged: its inputs and its fixed-size outputs.

    For a model without a batch dimension the whole part is one row. Outputs of
    unknown size (strings, variable dimensions) are not counted. A :class:`Tensors`
    (whose arrays' shapes never change) keeps the answer for its metadata
    (``Tensors.memo``): a request's inputs are asked about by the overflow check, the
    batcher and staging in turn.
    """
    if isinstance(part, Tensors):
        memo = part.memo
        if memo is not None and memo[0] is metadata:
            return memo[1]
        value = _row_bytes(part, metadata)
        part.memo = (metadata, value)
        return value
    return _row_bytes(part, metadata)


def _row_bytes(part: Part, metadata: ModelMetadata) -> int:
    rows = 1
    if metadata.batched and part:
        rows = max(1, int(next(iter(part.values())).shape[0]))
    if len(part) == 1:  # the common case, without a generator
        for array in part.values():
            return int(array.nbytes) // rows + _output_row_bytes(metadata)
    inputs = sum(int(array.nbytes) for array in part.values()) // rows  # BYTES: estimated
    return inputs + _output_row_bytes(metadata)


_OUTPUT_SIZES: dict[int, tuple[ModelMetadata, tuple[tuple[str, int], ...]]] = {}
"""A model's outputs of fixed size and their bytes a row, by ``id(metadata)`` (held,
and checked by identity, as ``_OUTPUT_BYTES``)."""


def _output_sizes(metadata: ModelMetadata) -> tuple[tuple[str, int], ...]:
    """``(name, bytes a row)`` of each output whose size the metadata fixes, in order.

    For a model without a batch dimension "a row" is the whole output (one row).
    """
    entry = _OUTPUT_SIZES.get(id(metadata))
    if entry is not None and entry[0] is metadata:
        return entry[1]
    sizes = []
    for spec in metadata.outputs:
        dims = spec.item_shape if metadata.batched else spec.shape
        if spec.datatype == "BYTES" or any(d < 0 for d in dims):
            continue
        sizes.append((spec.name, math.prod(dims) * to_numpy_dtype(spec.datatype).itemsize))
    if len(_OUTPUT_SIZES) >= 1024:  # models reloaded many times: start again
        _OUTPUT_SIZES.clear()
    _OUTPUT_SIZES[id(metadata)] = (metadata, tuple(sizes))
    return tuple(sizes)


_OUTPUT_BYTES: dict[int, tuple[ModelMetadata, int]] = {}
"""A model's fixed output bytes a row, by ``id(metadata)``; the metadata is held, so
the id is not reused while its entry stands (checked by identity besides)."""


def _output_row_bytes(metadata: ModelMetadata) -> int:
    """The bytes of one row's outputs of fixed size: worked out once per metadata."""
    entry = _OUTPUT_BYTES.get(id(metadata))
    if entry is not None and entry[0] is metadata:
        return entry[1]
    outputs = 0
    for spec in metadata.outputs:
        dims = spec.item_shape if metadata.batched else spec.shape
        if spec.datatype == "BYTES" or any(d < 0 for d in dims):
            continue
        outputs += math.prod(dims) * to_numpy_dtype(spec.datatype).itemsize
    if len(_OUTPUT_BYTES) >= 1024:  # models reloaded many times: start again
        _OUTPUT_BYTES.clear()
    _OUTPUT_BYTES[id(metadata)] = (metadata, outputs)
    return outputs


def batch_bytes(parts: Sequence[Part], metadata: ModelMetadata) -> int:
    """Arena bytes the batch of ``parts`` needs staged (an estimate from shapes)."""
    total = 0
    for part in parts:
        rows = 1
        if metadata.batched and part:
            rows = max(1, int(next(iter(part.values())).shape[0]))
        total += rows * row_bytes(part, metadata)
    return total


def read_outputs(buffer: memoryview, handles: Mapping[str, TensorHandle]) -> dict[str, TensorRef]:
    """The worker's outputs as references: numeric ones are views of their arena block."""
    return {
        name: TensorRef(
            view_tensor(buffer, handle), None if handle.dtype == BYTES else handle.offset
        )
        for name, handle in handles.items()
    }
