"""The heap is given back after large request bodies (glibc's malloc_trim, for real)."""

from __future__ import annotations

import asyncio
import ctypes.util

import pytest

from sordino.server import malloc_trim
from sordino.server.malloc_trim import TRIM_AFTER_BYTES, Trimmer

pytestmark = pytest.mark.skipif(
    malloc_trim._malloc_trim() is None, reason=f"no malloc_trim in {ctypes.util.find_library('c')}"
)


def test_a_trim_follows_enough_large_bodies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(malloc_trim, "TRIM_EVERY_S", 0.01)
    trimmer = Trimmer()

    async def read_bodies() -> None:
        loop = asyncio.get_running_loop()
        trimmer.note(loop, TRIM_AFTER_BYTES // 2)
        await asyncio.sleep(0.1)
        assert trimmer.trims == 0  # not worth a trim yet
        for _ in range(3):  # more while one is due: still one trim
            trimmer.note(loop, TRIM_AFTER_BYTES // 2)
        for _ in range(100):
            if trimmer.trims:
                break
            await asyncio.sleep(0.05)

    asyncio.run(read_bodies())
    assert trimmer.trims == 1
