"""The executor: one async call that runs a batch on some instance of a model.

``await executor.run(model, batch) -> outputs``. Which instance, worker process and
device, retries and breakers live behind this call; the scheduler never knows.
:class:`sordino.execution.chain.ChainExecutor` is the one the runtime uses;
``sordino.testing.ScriptedExecutor`` isolates scheduling in tests.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from sordino.inference import ModelKey, Tensor

__all__ = ["Executor", "assemble"]


class Executor(Protocol):
    """Runs batches for registered models."""

    async def run(self, model: ModelKey, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Run ``batch`` on an idle instance of ``model`` and return every output."""
        ...

    def instances(self, model: ModelKey) -> int:
        """Return how many batches of ``model`` can run at once."""
        ...


async def assemble(
    executor: Executor, model: ModelKey, parts: list[dict[str, Tensor]]
) -> dict[str, Tensor]:
    """Concatenate the inputs of several requests into one batch.

    An executor may provide ``assemble(model, parts)`` to build the batch where it will
    run (the chain executor writes it straight into the shared-memory arena, so the
    batch is copied once); otherwise the arrays are concatenated here.
    """
    hook = getattr(executor, "assemble", None)
    if hook is not None:
        batch: dict[str, Tensor] = await hook(model, parts)
        return batch
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
