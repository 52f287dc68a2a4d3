"""Overflow protection: the arena bounds what one request and one batch may be.

The executor says what a part costs in shared memory (``memory_fit``: bytes per row,
the largest free block, the arena's size). A request larger than the whole arena can
never run and is refused at once (400); a batch is shrunk to the rows that fit now,
and staging waits a bounded time for space for the rest (docs/memory.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from sordino.errors import InvalidRequest
from sordino.execution.executor import Executor, MemoryFit
from sordino.inference import ModelKey, Tensor
from sordino.scheduling.batcher import Dispatch
from sordino.scheduling.queue import RequestQueue
from sordino.scheduling.work import WorkItem

__all__ = ["Overflow"]


class Overflow:
    """What the arena lets one model version's requests and batches hold."""

    def __init__(self, model: ModelKey, *, executor: Executor, queue: RequestQueue) -> None:
        self.model = model
        self._executor = executor
        self._queue = queue
        # Executors written before overflow protection have no memory_fit: no protection.
        self._memory_fit = getattr(executor, "memory_fit", None)

    def memory_fit(self, inputs: Mapping[str, Tensor]) -> MemoryFit | None:
        """What ``inputs`` cost in the arena now (None: the executor does not say)."""
        memory_fit = self._memory_fit
        return memory_fit(self.model, inputs) if memory_fit is not None else None

    def rows_that_fit(self, decision: Dispatch) -> int:
        """Overflow protection: shrink the batch to the rows the arena can hold now.

        The head item always runs (if even it does not fit now, staging waits a
        bounded time for space, then answers 503).
        """
        head = self._queue.head()
        if head is None or head.signature != decision.signature:
            return decision.rows
        fit = self.memory_fit(head.inputs)
        if fit is None or fit.row_bytes <= 0:
            return decision.rows
        rows = max(head.rows, fit.free // fit.row_bytes)
        if rows < decision.rows:
            fit.counters.shrinks += 1
            return rows
        return decision.rows

    def refuse_oversized(self, item: WorkItem) -> None:
        """A request that alone is larger than the arena can never run: 400 at once."""
        fit = self.memory_fit(item.inputs)
        if fit is None:
            return
        needed = fit.row_bytes * item.rows
        if needed > fit.capacity:
            fit.counters.oversized += 1
            raise InvalidRequest(
                f"the request needs {needed} bytes of shared memory for its inputs and "
                f"outputs, more than the whole arena holds ({fit.capacity} bytes, "
                "memory.pool_size); send fewer rows per request or raise memory.pool_size"
            )
