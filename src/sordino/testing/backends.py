"""A scripted executor: batches run by a Python function, recorded, failing on demand.

It stands in for the chain executor, and with it the backends and worker processes,
in scheduler tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from sordino.clock import Clock
from sordino.execution.batch import NO_CONTEXT, BatchContext
from sordino.execution.decoupled import ResponseChannel
from sordino.execution.executor import MemoryFit
from sordino.inference import ModelKey, Tensor
from sordino.memory.arena import Arena
from sordino.memory.refs import Tensors, TensorsBuilder

__all__ = ["ScriptedExecutor"]


@dataclass
class ScriptedExecutor:
    """An :class:`sordino.execution.executor.Executor` whose model is a Python function.

    Each batch takes ``latency(rows)`` seconds of ``clock`` time; ``fn`` maps the
    batch inputs to outputs (identity by default). ``count`` is the number of
    instances, so how many batches the scheduler may run at once. Every batch is
    recorded as it starts: its row count in ``batches`` (to assert how requests were
    grouped), its inputs in ``contents`` and its context in ``contexts``. While ``fail``
    holds an exception, every
    batch raises it once its latency has passed (and is still recorded). With an
    ``arena``, outputs are placed in it as a worker's are, so tests can check that
    every block comes back.

    A decoupled model's batch (:meth:`run_decoupled`) is recorded the same way and its
    :class:`~sordino.execution.decoupled.ResponseChannel` kept in ``channels``: the test
    answers its requests through it, as a worker would, and finds each cancellation the
    channel passes on in ``cancellations`` as ``(batch, index)``.
    """

    clock: Clock
    latency: Callable[[int], float] = lambda rows: 0.0
    fn: Callable[[dict[str, Tensor]], dict[str, Tensor]] = lambda batch: dict(batch)
    count: int = 1
    fail: Exception | None = None
    batches: list[int] = field(default_factory=list)
    contents: list[dict[str, Tensor]] = field(default_factory=list)
    contexts: list[BatchContext] = field(default_factory=list)
    arena: Arena | None = None
    channels: list[ResponseChannel] = field(default_factory=list)
    cancellations: list[tuple[int, int]] = field(default_factory=list)

    def instances(self, model: ModelKey) -> int:
        return self.count

    def memory_fit(self, model: ModelKey, part: Mapping[str, Tensor]) -> MemoryFit | None:
        """Scripted models have no overflow protection."""
        return None

    async def run_decoupled(
        self,
        model: ModelKey,
        parts: Sequence[Mapping[str, Tensor]],
        channel: ResponseChannel,
        context: BatchContext = NO_CONTEXT,
    ) -> None:
        """Record a decoupled batch and keep its channel; return after its latency."""
        self.contexts.append(context)
        batch = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
        rows = int(next(iter(batch.values())).shape[0]) if batch else 0
        self.batches.append(rows)
        self.contents.append(batch)
        number = len(self.channels)
        channel.bind(lambda index: self.cancellations.append((number, index)))
        self.channels.append(channel)
        delay = self.latency(rows)
        if delay > 0:
            await self.clock.sleep(delay)
        if self.fail is not None:
            raise self.fail

    async def run(
        self,
        model: ModelKey,
        parts: Sequence[Mapping[str, Tensor]],
        context: BatchContext = NO_CONTEXT,
    ) -> Tensors:
        self.contexts.append(context)
        batch = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
        rows = int(next(iter(batch.values())).shape[0]) if batch else 0
        self.batches.append(rows)
        self.contents.append(batch)
        delay = self.latency(rows)
        if delay > 0:
            await self.clock.sleep(delay)
        if self.fail is not None:
            raise self.fail
        if self.arena is None:
            return Tensors.of(self.fn(batch))
        builder = TensorsBuilder(self.arena)
        for name, array in self.fn(batch).items():
            builder.put(name, array)
        return builder.finish()
