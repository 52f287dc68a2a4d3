"""The shared-memory arena: waiting for space, tensor handles, mapping from another process."""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.synchronize
import time
from pathlib import Path

import numpy as np
import pytest

from sordino.errors import OutOfMemory
from sordino.memory import Arena, attach_segment, view_tensor, write_tensor
from sordino.memory.segments import remove_stale_segments


def _double_in_child(name: str, offset: int) -> None:
    segment = attach_segment(name)
    assert segment.buf is not None
    view = np.ndarray((4,), np.float32, segment.buf, offset)
    view *= 2
    del view
    segment.close()


def test_numeric_and_bytes_tensors_round_trip() -> None:
    """A tensor written at a handle reads back equal; BYTES use the length-prefixed layout."""
    arena = Arena(1 << 16)
    try:
        numbers = np.arange(12, dtype=np.float32).reshape(3, 4)
        texts = np.array([[b"a"], [b"hello"], ["\u00e9t\u00e9"]], dtype=object)
        for array in (numbers, texts):
            block = arena.acquire_nowait(1024)
            handle = write_tensor(arena.buffer, block.offset, block.size, array)
            back = view_tensor(arena.buffer, handle).copy()
            assert back.shape == array.shape
            arena.release(block)
        assert np.array_equal(back.ravel(), [b"a", b"hello", "\u00e9t\u00e9".encode()])
    finally:
        arena.close()


def test_a_worker_process_writes_in_place() -> None:
    """Another process maps the segment by name and changes the tensor without pickling it."""
    arena = Arena(1 << 16)
    try:
        block = arena.acquire_nowait(16)
        handle = write_tensor(arena.buffer, block.offset, block.size, np.ones(4, np.float32))
        child = multiprocessing.get_context("spawn").Process(
            target=_double_in_child, args=(arena.name, block.offset)
        )
        child.start()
        child.join(60)
        assert child.exitcode == 0
        view = view_tensor(arena.buffer, handle)
        assert view.tolist() == [2.0, 2.0, 2.0, 2.0]
        del view
    finally:
        arena.close()


async def test_acquire_waits_for_a_release() -> None:
    """acquire waits until a block is released; acquire_nowait refuses meanwhile."""
    arena = Arena(64 * 4)
    try:
        held = arena.acquire_nowait(64 * 3)
        waiter = asyncio.ensure_future(arena.acquire(64 * 2))
        await asyncio.sleep(0)
        assert not waiter.done() and arena.statistics().waiting == 1
        with pytest.raises(OutOfMemory):
            arena.acquire_nowait(64)  # never overtakes a waiter
        arena.release(held)
        block = await asyncio.wait_for(waiter, 5)
        assert block.size == 128
        with pytest.raises(OutOfMemory, match="cannot fit"):
            await arena.acquire(1 << 20)
    finally:
        arena.close()


def _hold_recorded_arena(registry: str, ready: multiprocessing.synchronize.Event) -> None:
    arena = Arena(1 << 16, registry=Path(registry))
    ready.set()
    time.sleep(60)  # until SIGKILLed: nothing removes the segment
    arena.close()


def test_a_recorded_segment_of_a_live_arena_is_left_alone(tmp_path: Path) -> None:
    """The arena's own record is locked: a cleanup meanwhile removes nothing."""
    arena = Arena(1 << 16, registry=tmp_path)
    try:
        assert (tmp_path / arena.name).exists()
        assert remove_stale_segments(tmp_path) == []
        assert Path("/dev/shm", arena.name).exists()
    finally:
        arena.close()
    assert list(tmp_path.iterdir()) == []


def test_a_segment_left_by_a_killed_process_is_removed_and_reported(tmp_path: Path) -> None:
    """SIGKILL leaves the segment; the next cleanup on the registry removes it, once."""
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    child = context.Process(target=_hold_recorded_arena, args=(str(tmp_path), ready))
    child.start()
    try:
        assert ready.wait(60)
        (record,) = tmp_path.iterdir()
        assert Path("/dev/shm", record.name).exists()
        assert remove_stale_segments(tmp_path) == []  # its owner is alive
    finally:
        child.kill()
        child.join(30)
    (stale,) = remove_stale_segments(tmp_path)
    assert stale.name == record.name and stale.pid == child.pid
    assert stale.size_bytes == 1 << 16 and stale.removed
    assert not Path("/dev/shm", record.name).exists()
    assert list(tmp_path.iterdir()) == []
    assert remove_stale_segments(tmp_path) == []
