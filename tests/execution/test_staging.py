"""Staging batches in the shared-memory arena: every block comes back, whatever happens."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import numpy as np
import pytest

from sordino.clock import MonotonicClock
from sordino.config import RuntimeConfig
from sordino.errors import OutOfMemory
from sordino.events import EventSink
from sordino.execution.chain import ChainExecutor
from sordino.execution.staging import Staging
from sordino.inference import ModelKey, ModelMetadata, TensorSpec
from sordino.memory.owner import ArenaOwner
from sordino.memory.refs import Lease, TensorsBuilder
from sordino.models.repository import builtin_sources

ROWS = 4


def _metadata(outputs: int) -> ModelMetadata:
    """A batched model taking 16 floats a row and giving ``outputs`` floats a row."""
    return ModelMetadata(
        name="m",
        version="1",
        platform="test",
        inputs=(TensorSpec("x", "FP32", (-1, 16)),),
        outputs=(TensorSpec("y", "FP32", (-1, outputs)),),
        batched=True,
    )


def _batch() -> list[dict[str, np.ndarray]]:
    return [{"x": np.ones((ROWS, 16), np.float32)}]  # 256 bytes, one part


@pytest.fixture
def staging() -> Iterator[Staging]:
    staging = Staging(ArenaOwner(1024))
    yield staging
    staging.owner.close()


def _in_use(staging: Staging) -> int:
    stats = staging.owner.statistics()
    assert stats is not None
    return stats.in_use_bytes


async def test_a_staged_batch_gives_every_block_back(staging: Staging) -> None:
    """Inputs, reserved outputs and output space allocated later all return on release."""
    staged = await staging.stage(_batch(), _metadata(8), in_arena=True)
    assert staged.allocate is not None and staged.copies and staged.outputs
    await staged.allocate({"extra": 64})
    assert staged.copies.nbytes == 256 and staged.outputs.nbytes == 128 + 64
    staging.release(staged)
    staging.release(staged)  # a second release does nothing
    assert _in_use(staging) == 0


async def test_a_released_batch_is_freed_without_the_collector(staging: Staging) -> None:
    """A staged batch holds no reference cycle once released: it and everything it holds
    (its parts, their tensors, its context) go when its last reference does, not at the
    cycle collector's next pass (which found ~70 objects a batch before)."""
    gc.collect()
    gc.disable()
    try:
        staged = await staging.stage(_batch(), _metadata(8), in_arena=True)
        assert staged.allocate is not None
        await staged.allocate({"extra": 64})
        staging.release(staged)
        del staged
        assert gc.collect() == 0
    finally:
        gc.enable()


async def test_outputs_too_large_for_the_arena_release_the_inputs(staging: Staging) -> None:
    """An output reservation that can never fit fails, and the input block goes back."""
    with pytest.raises(OutOfMemory):
        await staging.stage(_batch(), _metadata(1024), in_arena=True)  # 16 KiB of outputs
    assert _in_use(staging) == 0


async def test_a_cancelled_wait_for_output_space_releases_the_inputs(staging: Staging) -> None:
    """Cancelled while waiting for output space, staging gives back the inputs it placed."""
    hog = staging.arena.acquire_nowait(512)  # inputs fit beside it, outputs (512 B) do not
    stage = asyncio.ensure_future(staging.stage(_batch(), _metadata(32), in_arena=True))
    for _ in range(100):
        if staging.arena.statistics().waiting:
            break
        await asyncio.sleep(0)
    assert staging.arena.statistics().waiting == 1
    stage.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stage
    staging.arena.release(hog)
    assert _in_use(staging) == 0


async def test_one_part_in_the_arena_goes_by_reference(staging: Staging) -> None:
    """A part already in the arena (a stream's state) becomes a handle to its own bytes."""
    builder = TensorsBuilder(staging.arena)
    builder.put("x", np.full((2, 16), 1.0, np.float32))
    part = builder.finish()
    before = _in_use(staging)
    staged = await staging.stage([part], _metadata(8), in_arena=True)
    assert staged.copies is not None and staged.copies.nbytes == 0
    assert staged.handles["x"].offset == part.ref("x").offset
    assert _in_use(staging) == before + 64  # only the outputs' block
    staging.release(staged)
    part.release()
    assert _in_use(staging) == 0


async def test_several_parts_are_written_once_into_one_block(staging: Staging) -> None:
    """Requests batched together are concatenated straight into the batch's block."""
    parts = [{"x": np.full((1, 16), float(i), np.float32)} for i in range(3)]
    staged = await staging.stage(parts, _metadata(8), in_arena=True)
    assert staged.copies is not None and staged.copies.nbytes == 192
    handle = staged.handles["x"]
    batch = np.ndarray(handle.shape, np.dtype(handle.dtype), staging.arena.buffer, handle.offset)
    np.testing.assert_array_equal(batch[:, 0], [0.0, 1.0, 2.0])
    staging.release(staged)
    assert _in_use(staging) == 0


async def test_outputs_handed_over_outlive_the_staged_batch(staging: Staging) -> None:
    """The output block goes with the results; releasing them gives it back."""
    staged = await staging.stage(_batch(), _metadata(8), in_arena=True)
    outputs = staging.outputs(staged, {})
    staging.release(staged)
    assert _in_use(staging) == 128
    outputs.release()
    assert _in_use(staging) == 0


async def test_output_space_granted_after_release_goes_back(staging: Staging) -> None:
    """Space the worker asked for that arrives once the batch has ended is not kept."""
    staged = await staging.stage(_batch(), _metadata(8), in_arena=True)
    assert staged.allocate is not None
    hog = staging.arena.acquire_nowait(512)
    waiting = asyncio.ensure_future(staged.allocate({"extra": 512}))
    for _ in range(100):
        if staging.arena.statistics().waiting:
            break
        await asyncio.sleep(0)
    staging.release(staged)  # frees room: the waiting allocation is granted now
    staging.arena.release(hog)
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert _in_use(staging) == 0


async def test_thread_isolated_batches_stay_off_the_arena(staging: Staging) -> None:
    """Without ``in_arena`` a batch runs on its own arrays and no arena is created."""
    staged = await staging.stage(_batch(), _metadata(8), in_arena=False)
    assert staged.copies is None and staged.allocate is None
    assert staging.owner.statistics() is None


async def test_the_executor_releases_inputs_when_output_space_never_comes() -> None:
    """Through ``ChainExecutor.run``: a batch that can never fit the arena is refused at
    once (it waited for ever, holding its inputs: issue 27), and one whose output space
    does not come is cancelled; either way its inputs leave the arena with it."""
    source = next(s for s in builtin_sources() if s.name == "digits-classifier")
    config = RuntimeConfig.model_validate({"workers": {"shared_memory": 4096}})
    executor = ChainExecutor(config, clock=MonotonicClock(), events=EventSink())
    key = ModelKey(source.name, source.version)
    try:
        await executor.load(key, source.path, source.config)
        # 14 rows: 3,584 bytes of pixels fit in the 4 KiB arena; 560 of outputs do not.
        batch = [{"pixels": np.zeros((14, 64), np.float32)}]
        with pytest.raises(OutOfMemory, match="cannot fit"):
            await asyncio.wait_for(executor.run(key, batch), 5)
        stats = executor.arena_statistics()
        assert stats is not None and stats.in_use_bytes == 0 and stats.waiting == 0
        # 8 rows (2,048 + 320 bytes) with 2 KiB held elsewhere: the outputs wait; cancelled.
        arena = executor.staging.arena
        held = Lease(arena)
        held.acquire_nowait(2048)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                executor.run(key, [{"pixels": np.zeros((8, 64), np.float32)}]), 0.5
            )
        stats = executor.arena_statistics()
        assert stats is not None and stats.in_use_bytes == 2048 and stats.waiting == 0
        held.release()
        with await executor.run(key, [{"pixels": np.zeros((2, 64), np.float32)}]) as small:
            assert small["probabilities"].shape == (2, 10)
    finally:
        await executor.aclose()
