"""Owned tensor references: leases give their blocks back exactly once, to the last holder."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from sordino.memory.arena import Arena
from sordino.memory.refs import Lease, TensorRef, Tensors, TensorsBuilder


@pytest.fixture
def arena() -> Iterator[Arena]:
    arena = Arena(1 << 16)
    yield arena
    arena.close()


def _in_use(arena: Arena) -> int:
    return arena.statistics().in_use_bytes


def test_a_lease_gives_back_its_blocks_when_the_last_holder_lets_go(arena: Arena) -> None:
    lease = Lease(arena)
    lease.acquire_nowait(1000)
    lease.acquire_nowait(64)
    lease.hold()
    lease.release()
    assert _in_use(arena) == 1024 + 64
    lease.release()
    assert _in_use(arena) == 0 and lease.released


def test_releasing_a_lease_more_often_than_held_raises(arena: Arena) -> None:
    lease = Lease(arena)
    lease.release()
    with pytest.raises(RuntimeError, match="already released"):
        lease.release()


def test_builder_places_numeric_tensors_in_the_arena_and_bytes_on_the_heap(arena: Arena) -> None:
    builder = TensorsBuilder(arena)
    source = np.arange(6, dtype=np.float32).reshape(2, 3)
    builder.put("x", source)
    builder.put("s", np.array([b"a", b"bc"], dtype=object))
    tensors = builder.finish()
    assert tensors.ref("x").in_arena and not tensors.ref("s").in_arena
    np.testing.assert_array_equal(tensors["x"], source)
    assert tensors["x"].ctypes.data != source.ctypes.data  # copied once, into the block
    assert _in_use(arena) == 64
    tensors.release()
    tensors.release()  # idempotent
    assert _in_use(arena) == 0


def test_builder_falls_back_to_the_heap_when_the_arena_is_full(arena: Arena) -> None:
    builder = TensorsBuilder(arena)
    builder.put("big", np.zeros(1 << 17, dtype=np.uint8))
    tensors = builder.finish()
    assert not tensors.ref("big").in_arena
    assert _in_use(arena) == 0
    tensors.release()


def test_abandoned_builder_gives_everything_back(arena: Arena) -> None:
    builder = TensorsBuilder(arena)
    builder.put("x", np.ones(100, dtype=np.float64))
    assert _in_use(arena) > 0
    builder.abandon()
    assert _in_use(arena) == 0


def test_row_slices_share_the_block_until_every_slice_is_released(arena: Arena) -> None:
    builder = TensorsBuilder(arena)
    builder.put("y", np.arange(8, dtype=np.int32).reshape(4, 2))
    batch = builder.finish()
    first, second = batch.rows(0, 1), batch.rows(1, 4)
    batch.release()
    assert _in_use(arena) == 64
    np.testing.assert_array_equal(second["y"], [[2, 3], [4, 5], [6, 7]])
    assert second.ref("y").offset == batch.ref("y").offset + 8  # type: ignore[operator]
    first.release()
    assert _in_use(arena) == 64
    second.release()
    assert _in_use(arena) == 0


def test_compose_holds_every_source(arena: Arena) -> None:
    a = TensorsBuilder(arena)
    a.put("x", np.zeros(4, dtype=np.float32))
    own = a.finish()
    b = TensorsBuilder(arena)
    b.put("state", np.ones(4, dtype=np.float32))
    carried = b.finish()
    step = Tensors.compose({"x": (own, "x"), "state": (carried, "state")})
    own.release()
    carried.release()
    assert _in_use(arena) == 128
    np.testing.assert_array_equal(step["state"], np.ones(4))
    step.release()
    assert _in_use(arena) == 0


def test_released_tensors_cannot_be_shared(arena: Arena) -> None:
    """Once released, arena tensors refuse to be shared (their blocks may be reused)."""
    builder = TensorsBuilder(arena)
    builder.put("x", np.zeros(2))
    tensors = builder.finish()
    tensors.release()
    with pytest.raises(RuntimeError, match="released"):
        tensors.share()


def test_heap_tensors_have_nothing_to_give_back() -> None:
    """Releasing tensors that hold no arena block changes nothing; they stay usable."""
    tensors = Tensors({"x": TensorRef(np.zeros(2))})
    tensors.release()
    assert not tensors.released
    assert tensors.share()["x"].shape == (2,)
