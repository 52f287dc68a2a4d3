"""The executor: one async call that runs a batch on some instance of a model.

``await executor.run(model, parts) -> outputs``: ``parts`` are the inputs of the
requests that share the batch, one mapping each, with matching shapes past the batch
dimension; ``outputs`` are the whole batch's, in the same row order. Which instance,
worker process and device, retries and breakers live behind this call; the
scheduler never knows. :class:`sordino.execution.chain.ChainExecutor` is the one the
runtime uses; ``sordino.testing.ScriptedExecutor`` isolates scheduling in tests.

Ownership: the parts stay the caller's; the outputs are the caller's to release
(:meth:`~sordino.memory.refs.Tensors.release`), since they may hold arena blocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from sordino.inference import ModelKey, Tensor
from sordino.memory.refs import Tensors

__all__ = ["Executor"]


class Executor(Protocol):
    """Runs batches for registered models."""

    async def run(self, model: ModelKey, parts: Sequence[Mapping[str, Tensor]]) -> Tensors:
        """Run ``parts`` as one batch on an idle instance of ``model``; return every output."""
        ...

    def instances(self, model: ModelKey) -> int:
        """Return how many batches of ``model`` can run at once."""
        ...
