"""The executor: one async call that runs a batch on some instance of a model.

``await executor.run(model, parts, context) -> outputs``: ``parts`` are the inputs of
the requests that share the batch, one mapping each, with matching shapes past the batch
dimension; ``context`` (:class:`~sordino.execution.batch.BatchContext`) is what else
the layers below need to know of the batch (owners, tenants, step region, each
request's facts); ``outputs`` are the whole batch's, in the same row order. Which instance,
worker process and device, retries and breakers live behind this call; the
scheduler never knows. :class:`sordino.execution.chain.ChainExecutor` is the one the
runtime uses; ``sordino.testing.ScriptedExecutor`` isolates scheduling in tests.

Ownership: the parts stay the caller's; the outputs are the caller's to release
(:meth:`~sordino.memory.refs.Tensors.release`), since they may hold arena blocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sordino.execution.batch import NO_CONTEXT, BatchContext
from sordino.inference import ModelKey, Tensor
from sordino.memory.owner import OverflowCounters
from sordino.memory.refs import Tensors

__all__ = ["Executor", "MemoryFit", "OverflowCounters"]


@dataclass(frozen=True, slots=True)
class MemoryFit:
    """How a model's batches fit the shared-memory arena, for overflow protection.

    ``row_bytes`` is what one row like the asked-about request needs staged (inputs
    and fixed-size outputs), ``free`` the largest block free now (the whole arena
    when overflow protection is off), ``capacity`` the arena's size. The scheduler
    shrinks a batch to ``free // row_bytes`` rows and refuses a request larger than
    ``capacity``; it counts what it did in ``counters``.
    """

    row_bytes: int
    free: int
    capacity: int
    counters: OverflowCounters = field(default_factory=OverflowCounters)


class Executor(Protocol):
    """Runs batches for registered models."""

    async def run(
        self,
        model: ModelKey,
        parts: Sequence[Mapping[str, Tensor]],
        context: BatchContext = NO_CONTEXT,
    ) -> Tensors:
        """Run ``parts`` as one batch on an idle instance of ``model``; return every output.

        ``context`` says what else is known of the batch (one entry per part where per
        request); :data:`~sordino.execution.batch.NO_CONTEXT` when nothing is.
        """
        ...

    def instances(self, model: ModelKey) -> int:
        """Return how many batches of ``model`` can run at once."""
        ...

    def memory_fit(self, model: ModelKey, part: Mapping[str, Tensor]) -> MemoryFit | None:
        """How rows like ``part``'s fit the arena; None when no protection applies.

        Optional: the scheduler treats an executor without this method as unprotected.
        """
        ...
