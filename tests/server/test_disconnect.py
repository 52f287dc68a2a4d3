"""until_disconnect: late requests listen for the client; quick ones never pay for it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sordino.errors import Cancelled
from sordino.server.disconnect import until_disconnect

DISCONNECT = {"type": "http.disconnect"}


def _channel(*messages: dict[str, Any]) -> asyncio.Queue[dict[str, Any]]:
    """An ASGI receive channel holding ``messages`` (its ``get`` is the ``receive``)."""
    channel: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for message in messages:
        channel.put_nowait(message)
    return channel


async def test_a_quick_request_never_reads_the_channel() -> None:
    channel = _channel(DISCONNECT)

    async def work() -> str:
        await asyncio.sleep(0)
        return "answer"

    assert await until_disconnect(channel.get, work(), watch_after_s=30) == "answer"
    assert channel.qsize() == 1  # nobody listened: no task, no future


async def test_a_late_request_notices_a_client_that_already_left() -> None:
    channel = _channel(DISCONNECT)  # the client left before the watcher started
    ran = asyncio.Event()
    finished = False

    async def work() -> None:
        nonlocal finished
        ran.set()
        await asyncio.Event().wait()  # queued for good
        finished = True

    with pytest.raises(Cancelled, match="disconnected"):
        await until_disconnect(channel.get, work(), watch_after_s=0.01)
    assert ran.is_set() and not finished
    assert channel.qsize() == 0


async def test_zero_listens_at_once() -> None:
    channel = _channel(DISCONNECT)

    with pytest.raises(Cancelled, match="disconnected"):
        # An hour's wait is never reached: the watcher starts with the work.
        await until_disconnect(channel.get, asyncio.sleep(3600), watch_after_s=0)
    assert channel.qsize() == 0


async def test_a_result_stands_when_the_client_stays() -> None:
    channel = _channel()

    async def work() -> int:
        await asyncio.sleep(0.02)  # past the watcher's start
        return 7

    assert await until_disconnect(channel.get, work(), watch_after_s=0.001) == 7
