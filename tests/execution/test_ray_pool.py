"""A Ray node's memory pool without Ray: the server's bookkeeping and the actor's placing.

:class:`NodePool` is the server's side (the memory strategy's allocator over the node
segment's offsets, the per-node quota ledger); :func:`place_and_run` is what the actor
does with a batch's layout, here against a real shared-memory segment in this process.
The two-node tests in ``test_ray_executor.py`` run both on a real Ray cluster.
"""

from __future__ import annotations

import asyncio
import dataclasses
from multiprocessing import shared_memory
from typing import Any

import numpy as np
import pytest

from sordino.cli.memory import describe_nodes
from sordino.config.memory import MemoryConfig
from sordino.errors import InvalidRequest, OutOfMemory, RateLimited
from sordino.execution.ray_pool import NodePool, place_and_run
from sordino.inference import ModelMetadata, TensorSpec
from sordino.memory.allocator import ALIGNMENT
from sordino.memory.quotas import QuotaLedger
from sordino.memory.strategies import allocator_factory

ROW = 2 * 4 + 2 * 4
"""Bytes one row of the model below stages: x FP32 [2] in, y FP32 [2] out."""

METADATA = ModelMetadata(
    name="double",
    version="1",
    platform="onnxruntime_onnx",
    inputs=(TensorSpec("x", "FP32", (-1, 2)),),
    outputs=(TensorSpec("y", "FP32", (-1, 2)), TensorSpec("label", "BYTES", (-1,))),
    batched=True,
)


def _pool(capacity: int = 64 * 1024, quotas: dict[str, int] | None = None) -> NodePool:
    return NodePool(
        node="n1",
        address="10.0.0.1",
        segment="segment",
        allocator=allocator_factory("fragmentation_aware")(capacity),
        quotas=QuotaLedger(quotas or {}, wait_s=0.05),
        actor=None,
    )


def _part(rows: int, value: float = 1.0) -> dict[str, np.ndarray]:
    return {"x": np.full((rows, 2), value, np.float32)}


def _arrays(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {"x": np.concatenate([p["x"] for p in parts])}


MEMORY = MemoryConfig(overflow_wait=0.05)


async def test_a_batch_gets_one_block_laid_out_for_its_tensors_and_gives_it_back() -> None:
    pool = _pool()
    parts = [_part(3), _part(2)]
    placed = await pool.place(parts, _arrays(parts), ("acme", "acme"), METADATA, MEMORY)
    assert placed.placement is not None and placed.block is not None
    inputs, outputs = placed.placement["inputs"], placed.placement["outputs"]
    assert inputs["x"] == (placed.block.offset, "<f4", (5, 2))
    assert outputs == {"y": (placed.block.offset + ALIGNMENT, "<f4", (5, 2))}
    assert "label" not in outputs, "a BYTES output goes back through the object store only"
    figures = pool.statistics()
    assert figures.arena.in_use_bytes >= 5 * ROW and figures.batches == 1
    owner = {o.owner: o for o in figures.owners}["other"]
    assert owner.in_use_bytes == 5 * ROW
    placed.release()
    placed.release()  # once only
    figures = pool.statistics()
    assert figures.arena.in_use_bytes == 0 and figures.arena.peak_bytes >= 5 * ROW
    assert all(o.in_use_bytes == 0 for o in figures.owners)


async def test_a_batch_waits_for_space_then_gets_503() -> None:
    pool = _pool(capacity=4096)
    big = [_part(150)]  # 2,400 bytes: two of them do not fit 4 KiB
    first = await pool.place(big, _arrays(big), ("a",), METADATA, MEMORY)
    waiting = asyncio.create_task(pool.place(big, _arrays(big), ("a",), METADATA, MEMORY))
    await asyncio.sleep(0)  # it is waiting for space now
    assert pool.statistics().arena.waiting == 1
    first.release()
    second = await waiting  # served by the release
    with pytest.raises(OutOfMemory, match="stayed too full"):
        await pool.place(big, _arrays(big), ("a",), METADATA, MEMORY)
    second.release()
    figures = pool.statistics()
    assert (figures.overflow_waits, figures.overflow_rejections) == (2, 1)
    assert figures.arena.in_use_bytes == 0
    assert all(o.in_use_bytes == 0 for o in figures.owners), "a refused batch charges nothing"
    with pytest.raises(OutOfMemory, match="cannot fit"):
        huge = [_part(1000)]
        await pool.place(huge, _arrays(huge), ("a",), METADATA, MEMORY)


async def test_a_tenant_over_its_quota_on_the_node_waits_then_is_refused() -> None:
    pool = _pool(quotas={"small": 10 * ROW})
    six = [_part(6)]
    held = await pool.place(six, _arrays(six), ("small",), METADATA, MEMORY)
    with pytest.raises(RateLimited, match="'small'"):
        await pool.place(six, _arrays(six), ("small",), METADATA, MEMORY)
    other = await pool.place(six, _arrays(six), ("acme",), METADATA, MEMORY)  # unaffected
    other.release()
    waiting = asyncio.create_task(pool.place(six, _arrays(six), ("small",), METADATA, MEMORY))
    await asyncio.sleep(0)
    held.release()
    (await waiting).release()  # the room came back within memory.quota_wait
    small = {o.owner: o for o in pool.statistics().owners}["small"]
    assert (small.waits, small.rejections, small.in_use_bytes) == (2, 1, 0)


async def test_rows_over_the_whole_quota_are_refused_at_once() -> None:
    """Together over the quota: 429 at once (the scheduler re-runs each request alone);
    one request alone over it: 400, as on one machine."""
    pool = _pool(quotas={"small": 10 * ROW})
    parts = [_part(6), _part(1), _part(6)]
    with pytest.raises(RateLimited, match="more than its quota"):
        await pool.place(parts, _arrays(parts), ("small", "acme", "small"), METADATA, MEMORY)
    alone = [_part(11)]
    with pytest.raises(InvalidRequest, match="whole quota"):
        await pool.place(alone, _arrays(alone), ("small",), METADATA, MEMORY)
    figures = pool.statistics()
    assert all(o.in_use_bytes == 0 for o in figures.owners) and figures.arena.in_use_bytes == 0


def test_the_actor_runs_the_batch_in_its_block() -> None:
    """place_and_run: inputs copied into the block, the model run on them there, the
    outputs written to their places and returned from there."""
    shm = shared_memory.SharedMemory(create=True, size=4096)
    try:
        x = np.arange(6, dtype=np.float32).reshape(3, 2)
        placement = {
            "segment": shm.name,
            "inputs": {"x": (128, "<f4", (3, 2))},
            "outputs": {"y": (256, "<f4", (3, 2)), "z": (512, "<f4", (3, 2))},
        }
        seen: dict[str, Any] = {}

        def infer(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            seen["x"] = inputs["x"]
            return {"y": inputs["x"] * 2, "z": np.zeros((1,), np.float32)}

        outputs = place_and_run(placement, {"x": x}, infer)
        assert seen["x"].base is not None, "the model ran on a view of the segment"
        np.testing.assert_array_equal(np.frombuffer(shm.buf, np.float32, 6, 128), x.ravel())
        np.testing.assert_array_equal(outputs["y"], x * 2)
        np.testing.assert_array_equal(np.frombuffer(shm.buf, np.float32, 6, 256), x.ravel() * 2)
        assert outputs["z"].shape == (1,), "an output unlike the metadata goes back as it is"
        seen.clear()  # no view of the segment may outlive it
        outputs.clear()
    finally:
        from sordino.execution import ray_pool

        segment = ray_pool._segments.pop(shm.name)
        segment.close()
        shm.close()
        shm.unlink()


async def test_memory_status_shows_a_table_by_node() -> None:
    """``sordino memory status``'s node table, from the figures /v2/sordino/memory sends."""
    pool = _pool(capacity=2 * 2**20, quotas={"small": 2**20})
    rows = [_part(2**16)]  # 1 MiB staged in this node's pool, half of it in and half out
    placed = await pool.place(rows, _arrays(rows), ("small",), METADATA, MEMORY)
    with pytest.raises(RateLimited):
        await pool.place(rows, _arrays(rows), ("small",), METADATA, MEMORY)
    document = dataclasses.asdict(pool.statistics())
    placed.release()
    lines = describe_nodes([document])
    assert lines[0] == "ray node pools:"
    header, row = lines[1].split(), lines[2].split()
    assert header[:2] == ["node", "address"] and header[-2:] == ["quota", "use"]
    assert row[:6] == ["n1", "10.0.0.1", "1.0", "MiB", "2.0", "MiB"]  # in use, reserved
    assert "small 1.0 MiB/1.0 MiB" in lines[2]
    assert lines[3].strip() == "node n1 owner small: 1 waits, 1 refused by its per-node quota"
