"""Memory: the shared-memory arena that tensors live in between the server and its workers.

Past the protocol layer a tensor travels as a :class:`TensorHandle` (offset, size,
datatype, shape) into one :class:`Arena` segment: batches are assembled there, worker
processes map the same segment, read their inputs in place and write their outputs
there. Only these small handles cross the process boundary; tensor data is never
pickled.
"""

from sordino.memory.allocator import ALIGNMENT, Allocator, AllocatorStatistics, Block
from sordino.memory.arena import Arena, attach_segment
from sordino.memory.tensors import TensorHandle, read_tensor, tensor_nbytes, write_tensor
from sordino.records import ArenaStatistics

__all__ = [
    "ALIGNMENT",
    "Allocator",
    "AllocatorStatistics",
    "Arena",
    "ArenaStatistics",
    "Block",
    "TensorHandle",
    "attach_segment",
    "read_tensor",
    "tensor_nbytes",
    "write_tensor",
]
