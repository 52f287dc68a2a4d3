"""Owned tensor references: tensors in the arena, and who lets go of their blocks.

Past the protocol layer a request's tensors travel as :class:`Tensors`: a read-only
mapping of names to numpy arrays, each array a :class:`TensorRef` that knows where it
lies in the shared-memory arena (``offset``; ``None`` for an array on the heap). The
arena blocks under them belong to :class:`Lease` objects, and a ``Tensors`` holds
each of its leases once. Releasing the ``Tensors`` lets go of those holds; a lease
gives its blocks back to the arena when its last holder lets go. So a batch's output
block, sliced into one result per request, returns to the arena only after the last
request's response is encoded, and a streaming step's carried outputs stay in the
arena while they feed the next step.

The rules that make leaks impossible by construction:

- a block goes into a lease the moment it is acquired (:meth:`Lease.acquire`);
- whoever creates or receives a ``Tensors`` releases it exactly once (``release()``
  is idempotent, and ``with tensors:`` releases on exit);
- deriving a ``Tensors`` (:meth:`Tensors.rows`, :meth:`Tensors.compose`) adds holds,
  so the original and the derived one are released independently.

All calls come from the event loop's thread, as for the arena itself.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from sordino.inference import Tensor
from sordino.memory.allocator import Block, Lifetime

if TYPE_CHECKING:
    from sordino.memory.arena import Arena

__all__ = ["BlockSource", "Inner", "Lease", "TensorRef", "Tensors", "TensorsBuilder"]


class BlockSource(Protocol):
    """Where a lease's blocks come from: the arena, or a multi-step request's region
    (``memory/region.py``), which hands out blocks of its own part of the arena."""

    @property
    def buffer(self) -> memoryview: ...

    def acquire_nowait(self, nbytes: int, lifetime: Lifetime = "short") -> Block: ...

    async def acquire(self, nbytes: int) -> Block: ...

    def release(self, block: Block) -> None: ...

    def _track(self, lease: Lease) -> None: ...

    def _untrack(self, lease: Lease) -> None: ...


class Inner(Protocol):
    """Blocks handed out inside a lease's block (a multi-step request's region)."""

    def movable(self) -> bool:
        """True when every lease of the region is movable (parked or empty)."""
        ...

    def moved(self, moves: dict[int, int]) -> set[Lease]:
        """The arena moved blocks (old offset -> new); follow the region's, if it moved,
        and return the region's leases, whose parked tensors are pointed anew."""
        ...


class Lease:
    """Arena blocks owned together; given back when the last holder lets go.

    A new lease has one holder: its creator. :meth:`hold` adds one, :meth:`release`
    removes one. Releasing more often than held is a bug and raises.
    """

    __slots__ = ("__weakref__", "_arena", "_blocks", "_holders", "_inner", "_parked", "owner")

    def __init__(self, arena: Arena | BlockSource, *, owner: str = "default") -> None:
        self._arena = arena
        self._blocks: list[Block] = []
        self._holders = 1
        self._parked: list[Tensors] = []  # holders that are parked (see Tensors.park)
        self._inner: Inner | None = None  # what the block holds when it is a region
        self.owner = owner
        arena._track(self)

    def _movable(self) -> bool:
        """True when every holder is a parked Tensors: defragmentation may move the blocks.

        A lease holding a region (``_inner``) is movable when the region says so.
        """
        if self._inner is not None:
            return bool(self._blocks) and self._inner.movable()
        return bool(self._blocks) and len(self._parked) == self._holders

    @property
    def arena(self) -> Arena | BlockSource:
        return self._arena

    @property
    def nbytes(self) -> int:
        """Bytes of arena the lease holds now."""
        return sum(block.size for block in self._blocks)

    @property
    def released(self) -> bool:
        return self._holders == 0

    def acquire_nowait(self, nbytes: int, lifetime: Lifetime = "short") -> Block:
        """Reserve a block that belongs to this lease; raise OutOfMemory if none fits now."""
        self._check_live()
        block = self._arena.acquire_nowait(nbytes, lifetime)
        self._blocks.append(block)
        return block

    async def acquire(self, nbytes: int) -> Block:
        """Reserve a block that belongs to this lease, waiting for space if needed."""
        self._check_live()
        block = await self._arena.acquire(nbytes)
        if self._holders == 0:  # released while waiting: give the block straight back
            self._arena.release(block)
            raise RuntimeError("the lease was released while it waited for space")
        self._blocks.append(block)
        return block

    def hold(self) -> Lease:
        """Add a holder; return the lease."""
        self._check_live()
        self._holders += 1
        return self

    def release(self) -> None:
        """Remove a holder; the last one gives every block back to the arena."""
        self._check_live()
        self._holders -= 1
        if self._holders == 0:
            blocks, self._blocks = self._blocks, []
            self._arena._untrack(self)
            for block in blocks:
                self._arena.release(block)

    def _check_live(self) -> None:
        if self._holders <= 0:
            raise RuntimeError("this lease was already released by its last holder")


class TensorRef(NamedTuple):
    """One tensor: a numpy array and, when it lies in the arena, its byte offset there.

    Numeric tensors in the arena are C-contiguous views of their block; ``offset`` is
    where ``array``'s first byte is (not necessarily the block's start: a request's
    rows of a batch output start inside the batch's block).
    """

    array: Tensor
    offset: int | None = None

    @property
    def in_arena(self) -> bool:
        return self.offset is not None


class Tensors(Mapping[str, Tensor]):
    """Named tensors and the leases that keep their arena blocks alive.

    Reads like ``dict[str, numpy array]``. ``release()`` lets go of the leases (once;
    later calls do nothing). A ``Tensors`` of heap arrays (:meth:`of`) holds no lease.
    """

    __slots__ = ("_arrays", "_leases", "_offsets", "_parked", "_released", "memo", "parameters")

    def __init__(self, refs: Mapping[str, TensorRef], leases: tuple[Lease, ...] = ()) -> None:
        """Take over one hold of each of ``leases`` (the caller's, not a new one)."""
        self._arrays = {name: ref.array for name, ref in refs.items()}
        offsets = {name: ref.offset for name, ref in refs.items() if ref.offset is not None}
        self._offsets = offsets or None
        self._leases = leases
        self._released = False
        self._parked = False
        self.memo: tuple[object, int] | None = None
        """What a reader worked out from these arrays' shapes and dtypes, which never
        change, with the key it was worked out for (the execution layer's bytes a row)."""
        self.parameters: dict[str, Any] | None = None
        """The parameters a model gave with these outputs as one request's answer
        (Triton's response parameters), carried with them to the answer; not copied to
        tensors derived from these."""

    @classmethod
    def _adopt(
        cls,
        arrays: dict[str, Tensor],
        offsets: dict[str, int] | None,
        leases: tuple[Lease, ...],
    ) -> Tensors:
        # The hot-path constructor: ``arrays`` and ``offsets`` are never mutated, so they
        # are shared, not copied; tensors on the heap carry no per-tensor object at all.
        tensors = cls.__new__(cls)
        tensors._arrays = arrays
        tensors._offsets = offsets
        tensors._leases = leases
        tensors._released = False
        tensors._parked = False
        tensors.memo = None
        tensors.parameters = None
        return tensors

    @classmethod
    def of(cls, arrays: Mapping[str, Any]) -> Tensors:
        """Heap arrays, owned by nobody in particular (nothing to give back)."""
        if isinstance(arrays, Tensors):
            return arrays
        return cls._adopt(
            {name: a if isinstance(a, np.ndarray) else np.asarray(a) for name, a in arrays.items()},
            None,
            (),
        )

    # -- the mapping -----------------------------------------------------------------

    # The arrays are also kept in a plain dict: the Mapping mixins iterate in Python.
    def __getitem__(self, name: str) -> Tensor:
        return self._arrays[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __contains__(self, name: object) -> bool:
        return name in self._arrays

    def keys(self) -> KeysView[str]:
        return self._arrays.keys()

    def items(self) -> ItemsView[str, Tensor]:
        return self._arrays.items()

    def values(self) -> ValuesView[Tensor]:
        return self._arrays.values()

    def __repr__(self) -> str:
        placed = self._offsets or {}
        parts = ", ".join(
            f"{n}: {a.dtype}{list(a.shape)}{'@arena' if n in placed else ''}"
            for n, a in self._arrays.items()
        )
        return f"Tensors({parts}{', released' if self._released else ''})"

    def ref(self, name: str) -> TensorRef:
        """The reference behind ``self[name]``: the array and its offset in the arena."""
        offset = self._offsets.get(name) if self._offsets is not None else None
        return TensorRef(self._arrays[name], offset)

    @property
    def leases(self) -> tuple[Lease, ...]:
        return self._leases

    @property
    def released(self) -> bool:
        return self._released

    # -- deriving --------------------------------------------------------------------

    def rows(self, start: int, stop: int) -> Tensors:
        """Rows ``[start, stop)`` of every tensor, as views sharing this one's blocks."""
        arrays = {name: array[start:stop] for name, array in self._arrays.items()}
        offsets = self._offsets
        if offsets is not None:
            offsets = {
                name: offset + start * self._arrays[name].strides[0]
                if self._arrays[name].ndim
                else offset
                for name, offset in offsets.items()
            }
        return Tensors._adopt(arrays, offsets, self._hold_all())

    def share(self) -> Tensors:
        """Another owner of the same tensors (released independently of this one)."""
        return Tensors._adopt(self._arrays, self._offsets, self._hold_all())

    @staticmethod
    def compose(parts: Mapping[str, tuple[Tensors, str]]) -> Tensors:
        """New tensors: each ``name`` is ``source[source_name]``; holds every source's leases."""
        refs: dict[str, TensorRef] = {}
        leases: dict[int, Lease] = {}
        for name, (source, source_name) in parts.items():
            source._check_live()
            refs[name] = source.ref(source_name)
            for lease in source._leases:
                leases.setdefault(id(lease), lease)
        return Tensors(refs, tuple(lease.hold() for lease in leases.values()))

    def _hold_all(self) -> tuple[Lease, ...]:
        self._check_live()
        if not self._leases:
            return ()
        return tuple(lease.hold() for lease in self._leases)

    def _check_live(self) -> None:
        if self._released:
            raise RuntimeError("these tensors were released; their arena blocks may be reused")

    # -- parking (defragmentation) ----------------------------------------------------

    def park(self) -> None:
        """Declare that nobody reads these tensors until :meth:`unpark` (queued work).

        While every holder of a lease is parked, defragmentation may move its blocks;
        the arrays of a parked ``Tensors`` are then pointed at the new place. Code that
        parks must not keep a raw array taken from it across an ``await``.
        """
        if self._parked or self._released or not self._leases:
            return
        self._parked = True
        for lease in self._leases:
            lease._parked.append(self)

    def unpark(self) -> None:
        """The tensors are about to be read (the work leaves the queue): pin them again."""
        if not self._parked:
            return
        self._parked = False
        for lease in self._leases:
            # By identity: list.remove compares with ==, and a Mapping's == compares
            # the numpy arrays (ambiguous) when another holder is parked before this one.
            parked = lease._parked
            del parked[next(i for i, holder in enumerate(parked) if holder is self)]

    @property
    def parked(self) -> bool:
        return self._parked

    def _relocate(
        self,
        buffer: memoryview,
        starts: list[int],
        moves: dict[int, int],
        sizes: dict[int, int],
        seen: set[int],
    ) -> None:
        """Point arrays lying in moved blocks (old start -> new start) at their new place.

        ``seen`` holds the ids of offset maps already rewritten: derived tensors may
        share one map, and each must shift once.
        """
        offsets = self._offsets
        if offsets is None or id(offsets) in seen:
            return
        seen.add(id(offsets))
        for name, offset in list(offsets.items()):
            at = bisect.bisect_right(starts, offset) - 1
            if at < 0:
                continue
            old = starts[at]
            if offset >= old + sizes[old]:
                continue
            new_offset = moves[old] + (offset - old)
            array = self._arrays[name]
            self._arrays[name] = np.ndarray(
                array.shape, array.dtype, buffer, new_offset, array.strides
            )
            offsets[name] = new_offset

    # -- letting go ------------------------------------------------------------------

    def release(self) -> None:
        """Let go of every lease (once; a second call does nothing).

        Tensors that hold no lease (heap arrays) have nothing to give back: releasing
        them changes nothing, and they stay usable.
        """
        if self._released or not self._leases:
            return
        self.unpark()
        self._released = True
        for lease in self._leases:
            lease.release()

    def __enter__(self) -> Tensors:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class TensorsBuilder:
    """Builds a :class:`Tensors` tensor by tensor, numeric ones straight into the arena.

    Decoding uses it so a request's numeric tensors are written once, from the socket
    buffer (or the parsed JSON) into their arena block, and never copied again on the
    way to the worker. Without an arena (thread isolation), or when the arena has no
    room right now, a tensor stays on the heap; it is copied into the arena later if
    a worker process needs it. ``BYTES`` tensors stay on the heap as object arrays.
    If building fails, :meth:`abandon` gives back what was placed.
    """

    __slots__ = ("_lease", "_lifetime", "_refs")

    def __init__(
        self, arena: Arena | None, *, owner: str = "default", lifetime: Lifetime = "short"
    ) -> None:
        """``lifetime="long"`` marks state that outlives many batches (the
        ``fragmentation_aware`` strategy keeps it apart from batch buffers)."""
        self._lease = Lease(arena, owner=owner) if arena is not None else None
        self._lifetime: Lifetime = lifetime
        self._refs: dict[str, TensorRef] = {}

    def empty(self, name: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Tensor:
        """A writable array for tensor ``name``: an arena view when there is room."""
        nbytes = math.prod(shape) * dtype.itemsize
        if self._lease is not None and dtype != np.object_ and nbytes > 0:
            from sordino.errors import OutOfMemory

            try:
                block = self._lease.acquire_nowait(nbytes, self._lifetime)
            except OutOfMemory:
                pass
            else:
                buffer = self._lease.arena.buffer
                view: Tensor = np.ndarray(shape, dtype, buffer, block.offset)
                self._refs[name] = TensorRef(view, block.offset)
                return view
        array: Tensor = np.empty(shape, dtype)
        self._refs[name] = TensorRef(array)
        return array

    def put(self, name: str, array: Tensor) -> None:
        """Add ``array`` as tensor ``name``, copied into the arena when it is numeric."""
        if array.dtype == np.object_ or array.size == 0 or self._lease is None:
            self._refs[name] = TensorRef(array)
            return
        target = self.empty(name, array.dtype.newbyteorder("="), array.shape)
        target[...] = array

    def finish(self) -> Tensors:
        """The tensors built; the builder's hold passes to them."""
        leases = (self._lease,) if self._lease is not None and self._lease.nbytes else ()
        if self._lease is not None and not leases:
            self._lease.release()  # nothing was placed in the arena
        self._lease = None
        return Tensors(self._refs, leases)

    def abandon(self) -> None:
        """Give back everything placed so far (decoding failed)."""
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        self._refs.clear()
