"""Node pools: each Ray node's shared-memory pool, its figures and its tenants' quotas.

With ``executor.kind: ray`` and ``executor.node_pool`` (the default) every Ray node
that runs an actor of this server gets one pool: a shared-memory segment in that
node's ``/dev/shm``, made by a :class:`PoolActor` pinned to the node (one per node and
server), of ``memory.pool_size`` bytes (its initial size for
``auto``). The actors on the node map the segment.

The pool's allocator lives here, in the server — the same strategy classes as the
process path's arena (``memory.strategy``: ``memory/strategies.py``) over the node
segment's offsets — so reserving space for a batch costs no extra Ray call. For each
batch sent to a node the server

1. charges each tenant's bytes (its parts' inputs and fixed-size outputs, as the
   process path estimates them) to that node's :class:`~sordino.memory.quotas.QuotaLedger`
   (the same class; ``memory.quotas`` apply per node): a tenant over its quota on the
   node waits up to ``memory.quota_wait`` for its own bytes there, then is refused
   (:class:`~sordino.errors.RateLimited`, 429); a batch of several requests is then
   retried one request at a time by the scheduler, so only that tenant's rows fail;
2. reserves one block for the batch's tensors (each input, each fixed-size output,
   64-byte aligned), waiting up to ``memory.overflow_wait`` for space, then
   :class:`~sordino.errors.OutOfMemory` (503);
3. sends the block's layout with the batch; the actor copies the inputs from the
   object store into the block, runs the model on them there and writes the outputs
   into their places, from where Ray returns them;
4. gives the block and the charges back when the call ends, however it ends.

What differs from the process path: the object store delivers the batch and takes
the outputs back (Ray owns those buffers), so the pool adds one copy of the inputs
and one of the outputs on the node (``bench/bench_ray.py`` measures it); outputs of
unknown size (strings, variable dimensions) go back through the object store only;
blocks live only while their batch runs, so nothing is ever parked to move and a
node pool is never defragmented or resized.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sordino.config.memory import MemoryConfig
from sordino.datatypes import to_numpy_dtype
from sordino.errors import OutOfMemory, RateLimited
from sordino.inference import ModelMetadata, Tensor
from sordino.memory.allocator import ALIGNMENT, Block, Strategy
from sordino.memory.quotas import QuotaLedger
from sordino.memory.strategies import allocator_factory
from sordino.records import ArenaStatistics, NodeMemoryStatistics

__all__ = ["NodePool", "NodePools", "PlacedBatch", "PoolActor", "place_and_run"]

log = logging.getLogger("sordino.execution")

Layout = dict[str, tuple[int, str, tuple[int, ...]]]
"""Tensor name -> (offset in the segment, numpy dtype string, shape)."""


def _aligned(nbytes: int) -> int:
    return -(-max(nbytes, 1) // ALIGNMENT) * ALIGNMENT


RELEASE_WAIT_S = 5.0
"""How long :meth:`NodePools.close` waits for the pools to remove their segments."""


class PoolActor:
    """Runs on one node: owns that node's pool segment for as long as the server runs."""

    def __init__(self, capacity: int) -> None:
        from sordino.memory.segments import create_segment

        # Removed by release() at the server's stop, before the actor is killed (the
        # kill takes this process's resource tracker with it). Its pages are reserved
        # (create_segment): a full /dev/shm must not end the actor with SIGBUS.
        self._shm, _ = create_segment(None, capacity)

    def segment(self) -> tuple[str, int]:
        """The segment's name and size in bytes."""
        return self._shm.name, self._shm.size

    def release(self) -> None:
        """Remove the segment (the server is done with it). ``ray.kill`` alone left it
        in the node's /dev/shm: the kill takes the resource tracker that would have
        removed it too."""
        with contextlib.suppress(BufferError):  # a view maps it: the unlink still frees it
            self._shm.close()
        with contextlib.suppress(FileNotFoundError):
            self._shm.unlink()


@dataclass(slots=True)
class PlacedBatch:
    """What one batch holds in a node pool until :meth:`release`."""

    pool: NodePool
    block: Block | None
    charges: list[tuple[str, int]]
    placement: dict[str, Any] | None
    """Sent to the actor: the segment's name and the inputs' and outputs' layouts."""
    released: bool = False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.pool.give_back(self)


@dataclass(slots=True)
class NodePool:
    """The server's side of one node's pool: its allocator, waiters and quota ledger."""

    node: str
    address: str
    segment: str
    allocator: Strategy
    quotas: QuotaLedger
    actor: Any
    batches: int = 0
    overflow_waits: int = 0
    overflow_rejections: int = 0
    _freed: asyncio.Event = field(default_factory=asyncio.Event)
    _waiting: int = 0

    async def place(
        self,
        parts: Sequence[Mapping[str, Tensor]],
        arrays: Mapping[str, Tensor],
        tenants: Sequence[str],
        metadata: ModelMetadata,
        memory: MemoryConfig,
    ) -> PlacedBatch:
        """Charge the batch's tenants, reserve its block; raise if either cannot be had."""
        charges = await self._charge(parts, tenants, metadata)
        placed = PlacedBatch(self, None, charges, None)
        try:
            rows = int(next(iter(arrays.values())).shape[0]) if metadata.batched else 1
            inputs: Layout = {}
            offset = 0
            for name, array in arrays.items():
                inputs[name] = (offset, array.dtype.str, tuple(array.shape))
                offset += _aligned(int(array.nbytes))
            outputs: Layout = {}
            for spec in metadata.outputs:
                dims = spec.item_shape if metadata.batched else spec.shape
                if spec.datatype == "BYTES" or any(d < 0 for d in dims):
                    continue  # unknown size: back through the object store only
                shape = (rows, *dims) if metadata.batched else tuple(dims)
                dtype = to_numpy_dtype(spec.datatype)
                outputs[spec.name] = (offset, dtype.str, shape)
                offset += _aligned(math.prod(shape) * dtype.itemsize)
            placed.block = await self._reserve(offset, memory.overflow_wait)
            base = placed.block.offset
            placed.placement = {
                "segment": self.segment,
                "inputs": {n: (base + o, d, s) for n, (o, d, s) in inputs.items()},
                "outputs": {n: (base + o, d, s) for n, (o, d, s) in outputs.items()},
            }
            self.batches += 1
        except BaseException:
            placed.release()
            raise
        return placed

    async def _charge(
        self,
        parts: Sequence[Mapping[str, Tensor]],
        tenants: Sequence[str],
        metadata: ModelMetadata,
    ) -> list[tuple[str, int]]:
        """Charge each tenant its parts' bytes on this node (see the module's doc)."""
        from sordino.execution.staging import batch_bytes  # staging imports the memory layer

        wanted: dict[str, list[Mapping[str, Tensor]]] = {}
        for index, part in enumerate(parts):
            tenant = tenants[index] if index < len(tenants) and tenants[index] else "default"
            wanted.setdefault(tenant, []).append(part)
        charges: list[tuple[str, int]] = []
        try:
            for tenant, own in wanted.items():
                nbytes = batch_bytes(own, metadata)
                quota = self._quota(tenant)
                if quota is not None and nbytes > quota and len(parts) > 1:
                    # Together over the whole quota, though perhaps not one by one: the
                    # scheduler retries each request alone (see the module's doc).
                    raise RateLimited(
                        f"tenant {self.quotas.owner(tenant)!r}'s rows in this batch need "
                        f"{nbytes} bytes of node {self.address}'s pool, more than its quota "
                        f"({quota} bytes per node, memory.quotas)",
                        retry_after_s=1.0,
                    )
                charges.append((await self.quotas.acquire(tenant, nbytes), nbytes))
        except BaseException:
            for owner, nbytes in charges:
                self.quotas.release(owner, nbytes)
            raise
        return charges

    def _quota(self, tenant: str) -> int | None:
        owner = self.quotas.owner(tenant)
        return next(o.quota_bytes for o in self.quotas.statistics() if o.owner == owner)

    async def _reserve(self, nbytes: int, wait_s: float) -> Block:
        capacity = self.allocator.capacity
        if nbytes > capacity:
            self.overflow_rejections += 1
            raise OutOfMemory(
                f"a batch of {nbytes} bytes cannot fit node {self.address}'s pool of "
                f"{capacity} bytes; raise memory.pool_size or lower the batch size"
            )
        if not self._waiting and self.allocator.fits(nbytes):
            return self.allocator.acquire_nowait(nbytes)
        # Wait for a release (all-or-nothing: one block per batch, so no batch holds
        # part of what another waits for). Written here rather than with the Arena's
        # waiters because the segment is on another machine: only its offsets are here.
        self.overflow_waits += 1
        self._waiting += 1
        try:
            async with asyncio.timeout(wait_s):
                while not self.allocator.fits(nbytes):
                    self._freed.clear()
                    await self._freed.wait()
                return self.allocator.acquire_nowait(nbytes)
        except TimeoutError:
            self.overflow_rejections += 1
            error = OutOfMemory(
                f"node {self.address}'s pool ({capacity} bytes) stayed too full for a batch "
                f"of {nbytes} bytes for {wait_s:g} s; retry later, or raise memory.pool_size"
            )
            error.retry_after_s = max(1.0, wait_s)
            raise error from None
        finally:
            self._waiting -= 1

    def give_back(self, placed: PlacedBatch) -> None:
        if placed.block is not None:
            self.allocator.release(placed.block)
            placed.block = None
            self._freed.set()
        for owner, nbytes in placed.charges:
            self.quotas.release(owner, nbytes)
        placed.charges = []

    def statistics(self) -> NodeMemoryStatistics:
        return NodeMemoryStatistics(
            node=self.node,
            address=self.address,
            arena=self.allocator.statistics().of_arena(self.segment, self._waiting),
            owners=self.quotas.statistics(),
            batches=self.batches,
            overflow_waits=self.overflow_waits,
            overflow_rejections=self.overflow_rejections,
        )


class NodePools:
    """Every node's pool of one server, made the first time an actor lands on the node."""

    def __init__(self, memory: MemoryConfig, capacity: int) -> None:
        self.memory = memory
        self._capacity = memory.initial_pool(capacity)
        self._pools: dict[str, NodePool] = {}
        self._lock = asyncio.Lock()
        self._remote: Any = None
        self.made: list[Callable[[NodePool], None]] = []
        """Called with each new pool (the executor reports it to the telemetry)."""

    def get(self, node: str) -> NodePool | None:
        return self._pools.get(node)

    async def ensure(self, node: str, address: str, timeout_s: float) -> NodePool:
        """The pool of ``node``, making its segment there first if needed."""
        async with self._lock:
            pool = self._pools.get(node)
            if pool is not None:
                return pool
            import ray
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            if self._remote is None:
                self._remote = ray.remote(num_cpus=0, max_restarts=0)(PoolActor)
            # The server's own actor (not a named one): its allocator is this server's
            # alone, so two servers on one cluster must never share a segment.
            actor = self._remote.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote(self._capacity)
            segment, size = await asyncio.wait_for(actor.segment.remote(), timeout_s)
            memory = self.memory
            strategy = memory.strategy if memory.enabled else "best_fit"
            factory = allocator_factory(
                strategy, small_max=memory.small_max, medium_max=memory.medium_max
            )
            quotas = {q.tenant: q.max for q in memory.quotas} if memory.enabled else {}
            pool = NodePool(
                node=node,
                address=address,
                segment=segment,
                allocator=factory(size // ALIGNMENT * ALIGNMENT),
                quotas=QuotaLedger(quotas, wait_s=memory.quota_wait),
                actor=actor,
            )
            self._pools[node] = pool
            for made in self.made:
                made(pool)
            log.info("node pool %s on %s: %d bytes (%s)", segment, address, size, strategy)
            return pool

    def statistics(self) -> tuple[NodeMemoryStatistics, ...]:
        return tuple(pool.statistics() for _, pool in sorted(self._pools.items()))

    def arena_statistics(self, node: str) -> ArenaStatistics | None:
        """One node's pool figures (the telemetry's pool sample), None once it is gone."""
        pool = self._pools.get(node)
        return pool.statistics().arena if pool is not None else None

    def nodes(self) -> list[tuple[str, str]]:
        return [(pool.node, pool.address) for pool in self._pools.values()]

    def close(self) -> None:
        """Remove each node's segment, then kill the pool actors."""
        import ray

        releasing = []
        for pool in self._pools.values():
            try:
                releasing.append(pool.actor.release.remote())
            except Exception as exc:  # its node is gone already
                log.debug("releasing a pool: %s", exc)
        if releasing:
            try:  # a node that does not answer in time keeps its segment
                ray.wait(releasing, num_returns=len(releasing), timeout=RELEASE_WAIT_S)
            except Exception as exc:
                log.debug("releasing the pools: %s", exc)
        for pool in self._pools.values():
            try:
                ray.kill(pool.actor, no_restart=True)
            except Exception as exc:  # its node is gone already
                log.debug("killing a pool actor: %s", exc)
        self._pools.clear()


_segments: dict[str, Any] = {}
"""In an actor's process: the node pool segments it mapped, by name."""


def place_and_run(
    placement: Mapping[str, Any], arrays: Mapping[str, Tensor], infer: Any
) -> dict[str, Tensor]:
    """In the actor: put ``arrays`` in the pool block, run ``infer`` there, outputs too.

    Returns the outputs; those with a place in the block are views of it (Ray copies
    them out as the call returns, before the server gives the block back).
    """
    from sordino.memory.segments import attach_segment

    name = placement["segment"]
    shm = _segments.get(name)
    if shm is None:
        shm = _segments[name] = attach_segment(name)
    buffer = shm.buf
    placed: dict[str, Tensor] = {}
    for tensor, (offset, dtype, shape) in placement["inputs"].items():
        view = np.ndarray(shape, np.dtype(dtype), buffer, offset)
        view[...] = arrays[tensor]  # the one copy: object store -> node pool
        placed[tensor] = view
    outputs: dict[str, Tensor] = infer(placed)
    for tensor, (offset, dtype, shape) in placement["outputs"].items():
        result = outputs.get(tensor)
        if result is None or tuple(result.shape) != tuple(shape) or result.dtype.str != dtype:
            continue  # not as the metadata said: it goes back as it is
        view = np.ndarray(shape, np.dtype(dtype), buffer, offset)
        view[...] = result
        outputs[tensor] = view
    return outputs
