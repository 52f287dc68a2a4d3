"""The executor: one async call that runs a batch on some instance of a model.

``await executor.run(model, batch) -> outputs``. Which instance (and, later, which
worker process and device), retries and breakers live behind this call; the
scheduler never knows. This in-process executor runs each backend instance on its
own thread so the event loop never blocks on a model.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sordino.backends.base import Backend
from sordino.errors import ModelNotReady
from sordino.inference import ModelKey, Tensor

__all__ = ["Executor", "ExecutorStatistics", "InProcessExecutor", "assemble"]


class Executor(Protocol):
    """Runs batches for registered models."""

    async def run(self, model: ModelKey, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Run ``batch`` on an idle instance of ``model`` and return every output."""
        ...

    def instances(self, model: ModelKey) -> int:
        """Return how many batches of ``model`` can run at once."""
        ...


@dataclass(frozen=True, slots=True)
class ExecutorStatistics:
    """Instances registered and busy per model."""

    models: int
    instances: int
    busy: int


class _Instance:
    __slots__ = ("backend", "pool")

    def __init__(self, backend: Backend, name: str) -> None:
        self.backend = backend
        # One thread per instance: a backend runs one batch at a time, and a slow model
        # never starves another model's instances.
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sordino-{name}")


class InProcessExecutor:
    """Runs backends on threads of this process."""

    def __init__(self) -> None:
        self._idle: dict[ModelKey, asyncio.Queue[_Instance]] = {}
        self._all: dict[ModelKey, list[_Instance]] = {}

    def register(self, model: ModelKey, backends: list[Backend]) -> None:
        """Make ``backends`` (loaded instances of ``model``) available to :meth:`run`."""
        if model in self._all:
            raise ValueError(f"model {model} is already registered")
        instances = [_Instance(b, f"{model.name}-{i}") for i, b in enumerate(backends)]
        idle: asyncio.Queue[_Instance] = asyncio.Queue()
        for inst in instances:
            idle.put_nowait(inst)
        self._all[model] = instances
        self._idle[model] = idle

    def unregister(self, model: ModelKey) -> list[Backend]:
        """Forget ``model`` and return its backends for the caller to unload."""
        instances = self._all.pop(model, [])
        self._idle.pop(model, None)
        for inst in instances:
            inst.pool.shutdown(wait=False)
        return [inst.backend for inst in instances]

    def instances(self, model: ModelKey) -> int:
        return len(self._all.get(model, ()))

    async def run(self, model: ModelKey, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        idle = self._idle.get(model)
        if idle is None:
            raise ModelNotReady(f"model {model} has no loaded instance")
        inst = await idle.get()
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(inst.pool, inst.backend.infer, batch)
        finally:
            idle.put_nowait(inst)

    def statistics(self) -> ExecutorStatistics:
        total = sum(len(v) for v in self._all.values())
        idle = sum(q.qsize() for q in self._idle.values())
        return ExecutorStatistics(len(self._all), total, total - idle)


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
