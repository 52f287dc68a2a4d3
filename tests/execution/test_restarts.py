"""Repeated worker kills: a worker that served is replaced at once, a crash loop backs off.

Real worker processes run the digits classifier; the executor's clock is virtual and
never advanced in the first test, so any restart delay would leave the instances down.
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import replace

import numpy as np

from sordino.config import ModelConfig, RuntimeConfig
from sordino.events import EventSink
from sordino.execution.chain import ChainExecutor
from sordino.inference import ModelKey
from sordino.memory.refs import Tensors
from sordino.models.repository import builtin_sources
from sordino.records import WorkerStatistics
from sordino.testing import VirtualClock

SOURCE = next(s for s in builtin_sources() if s.name == "digits-classifier")
KEY = ModelKey(SOURCE.name, SOURCE.version)
TWO = replace(
    SOURCE,
    config=ModelConfig.model_validate({**SOURCE.config.model_dump(), "instance_count": 2}),
)


def _workers(executor: ChainExecutor) -> list[WorkerStatistics]:
    return sorted(executor.statistics().workers, key=lambda w: w.index)


async def _until(predicate: object, what: str, seconds: float = 60.0) -> None:
    assert callable(predicate)
    for _ in range(int(seconds / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def _serve_on_both(executor: ChainExecutor) -> None:
    """Run batches, several at a time, until each instance has run at least one."""
    rows = np.random.default_rng(0).random((2, 64), dtype=np.float32)
    while min(w.batches for w in _workers(executor)) < 1:
        outputs = await asyncio.gather(
            *(executor.run(KEY, [Tensors.of({"pixels": rows})]) for _ in range(8))
        )
        for out in outputs:
            out.release()


async def test_killing_every_serving_instance_restarts_them_without_waiting() -> None:
    """Both instances SIGKILLed after healthy service serve again; the clock never moves."""
    clock = VirtualClock()
    events = EventSink()
    config = RuntimeConfig.model_validate(
        {"workers": {"restart_backoff": "30s", "restart_backoff_reset_batches": 1}}
    )
    executor = ChainExecutor(config, clock=clock, events=events)
    await executor.load(KEY, TWO.path, TWO.config)
    try:
        await _serve_on_both(executor)
        before = [w.pid for w in _workers(executor)]
        for pid in before:
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
        await _until(
            lambda: all(
                w.state == "ready" and w.pid not in before and w.restarts == 1
                for w in _workers(executor)
            ),
            "both instances to serve again",
        )
        failed = events.recent("worker_failed")
        assert [e.payload["restart_in_s"] for e in failed] == [0, 0]
        assert [e.payload["crash_loop"] for e in failed] == [0, 0]
        await _serve_on_both(executor)
    finally:
        await executor.aclose()


async def test_a_worker_killed_before_serving_waits_out_the_backoff() -> None:
    """A replacement that dies before its first batch is a crash loop: it waits 30 s."""
    clock = VirtualClock()
    events = EventSink()
    config = RuntimeConfig.model_validate(
        {"workers": {"restart_backoff": "30s", "restart_backoff_reset_batches": 1}}
    )
    executor = ChainExecutor(config, clock=clock, events=events)
    await executor.load(KEY, SOURCE.path, SOURCE.config)
    try:
        (first,) = _workers(executor)
        assert first.pid is not None
        os.kill(first.pid, signal.SIGKILL)
        await _until(lambda: events.recent("worker_failed"), "the failure to be seen")
        (failed,) = events.recent("worker_failed")
        assert failed.payload["restart_in_s"] == 30 and failed.payload["crash_loop"] == 1
        await asyncio.sleep(0.5)
        assert _workers(executor)[0].state == "restarting"  # waiting on the virtual clock
        await clock.advance(30)
        await _until(lambda: _workers(executor)[0].state == "ready", "the restart")
    finally:
        await executor.aclose()
