"""Memory: the shared-memory arena that tensors live in between the server and its workers.

:class:`Arena` is one shared-memory segment with an allocator chosen by
``memory.strategy`` (``strategies.py``: best fit in ``allocator.py``, the ``simple``
baseline, ``fragmentation_aware`` tiers in ``tiered.py``); it defragments by moving
blocks held only by parked tensors. ``manager.py`` is the runtime's memory manager
(defrag triggers, compaction steps at batch boundaries, figures), whose ``owner.py``
(:class:`~sordino.memory.owner.ArenaOwner`) is the arena's one owner: it creates the
arena, gates it while it is resized and closes it; staging writes into it. ``quotas.py`` the
per-tenant accounts, ``planner.py`` and ``region.py`` the step plan of a multi-step
request and the one region its steps' outputs run in. Past admission a request's
tensors are :class:`Tensors` (``refs.py``): owned references whose arena blocks
belong to :class:`Lease` objects, given back exactly once, when the last holder lets
go. To a worker process a tensor travels as a :class:`TensorHandle` (offset, size,
datatype, shape; ``tensors.py``); workers map the same segment, read their inputs in
place and write their outputs into blocks the server reserved. Only handles cross
the process boundary; tensor data is never pickled.
"""

from sordino.memory.allocator import ALIGNMENT, Allocator, AllocatorStatistics, Block
from sordino.memory.arena import Arena
from sordino.memory.refs import Lease, TensorRef, Tensors, TensorsBuilder
from sordino.memory.segments import attach_segment
from sordino.memory.tensors import TensorHandle, tensor_nbytes, view_tensor, write_tensor
from sordino.records import ArenaStatistics

__all__ = [
    "ALIGNMENT",
    "Allocator",
    "AllocatorStatistics",
    "Arena",
    "ArenaStatistics",
    "Block",
    "Lease",
    "TensorHandle",
    "TensorRef",
    "Tensors",
    "TensorsBuilder",
    "attach_segment",
    "tensor_nbytes",
    "view_tensor",
    "write_tensor",
]
