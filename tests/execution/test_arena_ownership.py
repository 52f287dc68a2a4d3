"""Every failure path gives its arena blocks back: in-use bytes return to zero.

A real worker process runs the digits classifier; its inputs are placed in the arena
as admission places them. Each case forces one way a batch can end badly — the
worker killed mid-batch, the caller cancelled, the execution timeout — and checks
that once the caller releases what it holds, the arena holds nothing. (An output
reservation that can never fit is in ``test_staging.py``.) The last test does the
same through a whole server under mixed traffic, streaming and refusals included.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from sordino.clock import MonotonicClock
from sordino.config import RuntimeConfig
from sordino.errors import InferenceFailed
from sordino.events import Event, EventSink
from sordino.execution.chain import ChainExecutor
from sordino.inference import ModelKey
from sordino.memory.refs import Tensors, TensorsBuilder
from sordino.models.repository import builtin_sources
from sordino.testing import VirtualClock, serve_in_thread
from tests.waiting import wait_for

SOURCE = next(s for s in builtin_sources() if s.name == "digits-classifier")
KEY = ModelKey(SOURCE.name, SOURCE.version)


@pytest.fixture
async def executor() -> AsyncIterator[ChainExecutor]:
    config = RuntimeConfig.model_validate(
        {"workers": {"execution_timeout": "1s", "restart_backoff": "50ms"}}
    )
    executor = ChainExecutor(config, clock=MonotonicClock(), events=EventSink())
    await executor.load(KEY, SOURCE.path, SOURCE.config)
    yield executor
    await executor.aclose()


def _inputs(executor: ChainExecutor, rows: int = 3) -> Tensors:
    arena = executor.input_arena(KEY)
    assert arena is not None
    builder = TensorsBuilder(arena)
    builder.put("pixels", np.random.default_rng(rows).random((rows, 64), dtype=np.float32))
    tensors = builder.finish()
    assert tensors.ref("pixels").in_arena
    return tensors


def _in_use(executor: ChainExecutor) -> int:
    stats = executor.arena_statistics()
    assert stats is not None
    return stats.in_use_bytes


async def _serving(executor: ChainExecutor) -> None:
    for _ in range(500):
        if all(w.state == "ready" for w in executor.statistics().workers):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the worker did not come back")


async def test_a_batch_that_succeeds_holds_only_its_outputs(executor: ChainExecutor) -> None:
    inputs = _inputs(executor)
    outputs = await executor.run(KEY, [inputs])
    assert outputs.ref("probabilities").in_arena  # a view of the arena, not a copy
    assert _in_use(executor) == 64 * 4 * 3 + 128  # the pixels' block and the outputs' block
    outputs.release()
    inputs.release()
    assert _in_use(executor) == 0


async def test_worker_death_mid_batch(executor: ChainExecutor) -> None:
    """The only worker dies with the batch, and again with its retry: the batch fails."""
    parts = [_inputs(executor), _inputs(executor, 2)]
    fault = executor.inject_fault("worker:digits-classifier", "crash", rate=1.0)
    with pytest.raises(InferenceFailed, match="lost its worker twice"):
        await executor.run(KEY, parts)
    for part in parts:
        part.release()
    assert _in_use(executor) == 0
    executor.faults.clear(fault.id)
    await _serving(executor)
    with _inputs(executor) as inputs, await executor.run(KEY, [inputs]) as after:
        assert after["probabilities"].shape == (3, 10)
    assert _in_use(executor) == 0
    assert executor.statistics().retries == 1


async def test_a_crash_on_the_only_instance_is_retried_on_its_restart() -> None:
    """One instance crashes with a batch: the batch waits for the restart and runs there."""
    events = EventSink()
    config = RuntimeConfig.model_validate({"workers": {"restart_backoff": "50ms"}})
    executor = ChainExecutor(config, clock=MonotonicClock(), events=events)
    await executor.load(KEY, SOURCE.path, SOURCE.config)
    try:
        fault = executor.inject_fault("worker:digits-classifier", "crash", rate=1.0)

        def clear_on_crash(event: Event) -> None:
            # The crash is seen before the restart begins: the retry runs without the fault.
            if event.kind == "worker_failed":
                executor.faults.clear(fault.id)

        events.subscribe(clear_on_crash)
        parts = [_inputs(executor), _inputs(executor, 2)]
        with await executor.run(KEY, parts) as outputs:
            assert outputs["probabilities"].shape == (5, 10)
        for part in parts:
            part.release()
        assert _in_use(executor) == 0
        (worker,) = executor.statistics().workers
        assert (worker.restarts, worker.state) == (1, "ready")
        assert [e.cause for e in events.recent("batch_retried")] == ["exited with code 70"]
        assert executor.statistics().retries == 1
    finally:
        await executor.aclose()


async def test_cancelled_while_the_worker_runs(executor: ChainExecutor) -> None:
    inputs = _inputs(executor)
    executor.inject_fault("worker:digits-classifier", "latency", latency_s=0.5, duration_s=0.4)
    task = asyncio.ensure_future(executor.run(KEY, [inputs]))
    for _ in range(500):
        if any(w.busy for w in executor.statistics().workers):
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    inputs.release()
    assert _in_use(executor) == 0
    await _serving(executor)


async def test_execution_timeout(executor: ChainExecutor) -> None:
    inputs = _inputs(executor)
    # The fault stays until cleared: the retry on the restarted worker times out too,
    # however long the restart takes (a fault that expired meanwhile let it succeed).
    fault = executor.inject_fault("worker:digits-classifier", "latency", latency_s=3.0)
    with pytest.raises(InferenceFailed):
        await executor.run(KEY, [inputs])
    executor.faults.clear(fault.id)
    inputs.release()
    assert _in_use(executor) == 0
    await _serving(executor)


async def test_a_batch_within_its_timeout_is_not_killed_for_the_one_before(
    executor: ChainExecutor,
) -> None:
    """The execution timeout counts from each batch's own start: a batch that takes
    half the timeout, started late in the timeout of a quick batch before it, runs to
    its end (one watchdog timer serves the worker's batches, not one a batch)."""
    inputs = _inputs(executor)
    (await executor.run(KEY, [inputs])).release()  # the watchdog looks 1 s from here
    await asyncio.sleep(0.7)
    fault = executor.inject_fault("worker:digits-classifier", "latency", latency_s=0.5)
    try:
        (await executor.run(KEY, [inputs])).release()  # still running at that look
    finally:
        executor.faults.clear(fault.id)
    inputs.release()
    assert executor.statistics().retries == 0  # ran once: its worker was never killed
    assert _in_use(executor) == 0


def test_a_server_under_mixed_traffic_returns_to_zero() -> None:
    """Binary and JSON, bad requests, streams, cancelled streams: nothing stays behind."""
    with serve_in_thread() as server:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for rows in (1, 3):
                body = {
                    "inputs": [
                        {
                            "name": "pixels",
                            "datatype": "FP32",
                            "shape": [rows, 64],
                            "data": [0.5] * (rows * 64),
                        }
                    ]
                }
                ok = client.post("/v2/models/digits-classifier/infer", json=body)
                assert ok.status_code == 200, ok.text
            bad = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 63]}]}
            bad["inputs"][0]["data"] = [0.0] * 63  # type: ignore[index]
            assert client.post("/v2/models/digits-classifier/infer", json=bad).status_code == 400
            streamed = client.post("/v2/models/countdown/generate_stream", json={"COUNT": 3})
            assert streamed.status_code == 200 and streamed.text.count("data:") == 3
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        count = grpcclient.InferInput("COUNT", [1, 1], "INT32")
        count.set_data_from_numpy(np.array([[2]], dtype=np.int32))
        results: list[object] = []
        grpc.start_stream(callback=lambda result, error: results.append(error or result))
        grpc.async_stream_infer("countdown", [count])
        wait_for(lambda: len(results) == 2, "both responses of the stream")
        grpc.stop_stream()
        grpc.close()

        def idle() -> bool:
            stats = server.runtime.executor.arena_statistics()
            return stats is not None and stats.in_use_bytes == 0

        wait_for(idle, "the arena to hold nothing once every request ended")


async def test_a_retry_gives_up_when_the_only_instance_does_not_come_back_in_time() -> None:
    """The restart lies beyond workers.start_timeout: the batch fails, saying so."""
    clock = VirtualClock()
    events = EventSink()
    config = RuntimeConfig.model_validate(
        {"workers": {"restart_backoff": "30s", "start_timeout": "20s"}}
    )
    executor = ChainExecutor(config, clock=clock, events=events)
    await executor.load(KEY, SOURCE.path, SOURCE.config)
    try:
        executor.inject_fault("worker:digits-classifier", "crash", rate=1.0)
        inputs = _inputs(executor)
        task = asyncio.ensure_future(executor.run(KEY, [inputs]))
        for _ in range(1000):
            if events.recent("worker_failed") or task.done():
                break
            await asyncio.sleep(0.01)
        assert not task.done() and events.recent("batch_retried")
        await clock.advance(19)
        assert not task.done()  # still waiting for the restart
        await clock.advance(1)
        with pytest.raises(InferenceFailed, match=r"within 20 s \(workers.start_timeout\)"):
            await task
        inputs.release()
        assert _in_use(executor) == 0
    finally:
        await executor.aclose()
