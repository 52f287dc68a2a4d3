"""Outlier ejection: an instance that fails every batch costs no client an error.

Real worker processes run the digits classifier with a real ``error`` fault injected
into one of them; the executor's clock is virtual, so an ejection lasts until the
test moves it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

import httpx
import numpy as np
import pytest

from sordino.config import ModelConfig, RuntimeConfig
from sordino.config.workers import OutlierEjectionConfig
from sordino.control.client import AdminClient
from sordino.errors import InferenceFailed
from sordino.events import EventSink
from sordino.execution.chain import ChainExecutor
from sordino.execution.outliers import OutlierDetector
from sordino.inference import ModelKey
from sordino.memory.refs import Tensors
from sordino.models.repository import builtin_sources
from sordino.telemetry.execution_metrics import ExecutionCollector
from sordino.testing import VirtualClock, serve_in_thread
from tests.execution.load import Load, digits, events

SOURCE = next(s for s in builtin_sources() if s.name == "digits-classifier")
KEY = ModelKey(SOURCE.name, SOURCE.version)
ROWS = np.random.default_rng(0).random((2, 64), dtype=np.float32)


def _source(instances: int) -> ModelConfig:
    return ModelConfig.model_validate({**SOURCE.config.model_dump(), "instance_count": instances})


async def _run(executor: ChainExecutor) -> None:
    outputs = await executor.run(KEY, [Tensors.of({"pixels": ROWS})])
    outputs.release()


async def _until(predicate: object, what: str, seconds: float = 60.0) -> None:
    assert callable(predicate)
    for _ in range(int(seconds / 0.02)):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def test_one_of_two_instances_failing_every_batch_costs_no_error() -> None:
    """Every batch instance 1 fails runs on instance 0; instance 1 is ejected and shown."""
    clock, events = VirtualClock(), EventSink()
    executor = ChainExecutor(RuntimeConfig(), clock=clock, events=events)
    await executor.load(KEY, SOURCE.path, _source(2))
    try:
        executor.inject_fault(f"worker:{KEY.name}/1", "error", rate=1.0)
        for _ in range(10):
            # Several at a time, so that both instances are offered batches.
            await asyncio.gather(*(_run(executor) for _ in range(4)))
        stats = executor.statistics()
        (ejected,) = events.recent("instance_ejected")
        assert ejected.subject == f"{KEY.name}/1" and "injected error fault" in ejected.cause
        assert ejected.payload["consecutive_failures"] == 3
        (outlier,) = [o for o in stats.outliers if o.index == 1]
        assert outlier.ejections == 1 and outlier.ejected_until is not None
        assert not [o for o in stats.outliers if o.index == 0 and o.ejections]
        failures = {w.index: w.failures for w in stats.workers}
        assert 3 <= failures[1] <= 5, "ejected after three failures (some were in flight)"
        # The ejection ends on the clock; the next batch it fails ejects it for twice as long.
        await clock.advance(1.0)
        for _ in range(3):
            await asyncio.gather(*(_run(executor) for _ in range(4)))
        again = events.recent("instance_ejected")
        assert len(again) == 2 and again[1].payload["ejection_s"] == 2.0
        assert [e.cause for e in events.recent("instance_returned")] == [
            "ejection time over; offered batches again"
        ]
        metrics = {m.name: m for m in ExecutionCollector(executor.statistics).collect()}
        (sample,) = [
            s for s in metrics["sordino_instance_ejections"].samples if s.labels["instance"] == "1"
        ]
        assert sample.name == "sordino_instance_ejections_total" and sample.value == 2
    finally:
        await executor.aclose()


def test_a_server_with_one_of_two_instances_failing_answers_every_request() -> None:
    """Over HTTP, with the chaos API's error fault on one instance: no client error, the
    ejection in the journal and in /metrics (the issue's drill cost 70 x 500)."""
    token = "test-admin-token"
    config = RuntimeConfig.model_validate({"server": {"admin_token": token}})
    with serve_in_thread(config, digits(instance_count=2)) as server:
        AdminClient(server.url, token).inject("worker:digits-classifier/1", "error", rate=1.0)
        with Load(server.url, clients=4) as load:
            load.wait_ok(200)
        assert load.errors == []
        (ejected,) = events(server, "instance_ejected")[:1]
        assert ejected.subject == "digits-classifier/1"
        metrics = httpx.get(server.url + "/metrics").text
        assert (
            'sordino_instance_ejections_total{instance="1",model="digits-classifier",version="1"}'
            in metrics
        )


async def test_a_batch_failing_on_both_instances_is_its_own_error_and_ejects_none() -> None:
    """The model fails every batch everywhere: each ends in an explicit error, no ejection."""
    clock, events = VirtualClock(), EventSink()
    executor = ChainExecutor(RuntimeConfig(), clock=clock, events=events)
    await executor.load(KEY, SOURCE.path, _source(2))
    try:
        executor.inject_fault(f"worker:{KEY.name}", "error", rate=1.0)
        for _ in range(6):
            with pytest.raises(InferenceFailed, match="injected error fault"):
                await _run(executor)
        assert events.recent("instance_ejected") == []
        assert sum(w.failures for w in executor.statistics().workers) == 12  # two tries each
    finally:
        await executor.aclose()


GUARDED = RuntimeConfig.model_validate(
    {
        "self_healing": {
            "enabled": True,
            "triggers": [{"metric": "error_rate", "threshold": "5%", "action": "restart_worker"}],
        }
    }
)
"""The brief's block: the guardian replaces an instance when the error rate is high."""


async def test_a_single_failing_instance_holds_its_batches_until_it_is_replaced() -> None:
    """One instance, which the guardian replaces: once it keeps failing, failed batches wait
    for its replacement and run there; without one they fail, naming the wait, after it."""
    clock, events = VirtualClock(), EventSink()
    executor = ChainExecutor(GUARDED, clock=clock, events=events)
    await executor.load(KEY, SOURCE.path, SOURCE.config)
    try:
        executor.inject_fault(f"worker:{KEY.name}/0", "error", rate=1.0)
        for _ in range(2):  # not yet an outlier: a failure may be the batch's own
            with pytest.raises(InferenceFailed, match="injected error fault"):
                await _run(executor)
        held = asyncio.ensure_future(_run(executor))
        await _until(lambda: events.recent("batch_retried"), "the batch to be held")
        assert events.recent("batch_retried")[-1].payload["waits_for_restart"] is True
        assert not held.done()
        # What the guardian's restart_worker does: the worker replaced, its fault gone.
        assert await executor.restart_instance(KEY, 0, cause="test")
        await _until(lambda: events.recent("worker_failed"), "the worker to be replaced")
        # It never ran a batch: a crash loop to the backoff, which waits restart_backoff.
        assert events.recent("worker_failed")[0].payload["restart_in_s"] == 1
        await clock.advance(1.0)
        await asyncio.wait_for(held, 60)
        held.result()
        # Without a replacement, the held batch fails once restart_wait has passed.
        executor.inject_fault(f"worker:{KEY.name}/0", "error", rate=1.0)
        for _ in range(2):
            with pytest.raises(InferenceFailed):
                await _run(executor)
        waiting = asyncio.ensure_future(_run(executor))
        await _until(lambda: len(events.recent("batch_retried")) == 2, "the second hold")
        await clock.advance(5.0)
        with pytest.raises(InferenceFailed, match=r"not replaced within 5 s \(workers"):
            await asyncio.wait_for(waiting, 60)
    finally:
        await executor.aclose()


async def test_an_instance_failing_alone_does_not_open_its_devices_breaker() -> None:
    """With a device chain, one failing instance of two is ejected; the device keeps serving."""
    clock, events = VirtualClock(), EventSink()
    config = RuntimeConfig.model_validate(
        {
            "devices": [
                {"name": "cpu_a", "provider": "cpu", "intra_op_threads": 1},
                {"name": "cpu_b", "provider": "cpu", "intra_op_threads": 1},
            ],
            "scheduler": {
                "strategies": [
                    {
                        "name": "fallback_chain",
                        "primary": "cpu_a",
                        "fallbacks": ["cpu_b"],
                        "switch_threshold": "error_rate>5% for 30s",
                        "min_requests": 3,
                    }
                ]
            },
        }
    )
    executor = ChainExecutor(config, clock=clock, events=events)
    await executor.load(KEY, SOURCE.path, _source(2))
    try:
        first = min(w.index for w in executor.statistics().workers if w.device == "cpu_a")
        executor.inject_fault(f"worker:{KEY.name}/{first}", "error", rate=1.0)
        for _ in range(8):
            await asyncio.gather(*(_run(executor) for _ in range(4)))
        assert [e.subject for e in events.recent("instance_ejected")] == [f"{KEY.name}/{first}"]
        assert events.recent("breaker_open") == [] and events.recent("device_switch") == []
        batches = {w.device: 0 for w in executor.statistics().workers}
        for w in executor.statistics().workers:
            batches[w.device] += w.batches
        assert batches["cpu_b"] == 0, "the fallback device was never needed"
    finally:
        await executor.aclose()


async def test_without_a_guardian_to_replace_it_a_failing_instance_fails_at_once() -> None:
    """Nothing replaces a failing single instance: every batch it fails fails at once."""
    clock, events = VirtualClock(), EventSink()
    executor = ChainExecutor(RuntimeConfig(), clock=clock, events=events)
    await executor.load(KEY, SOURCE.path, SOURCE.config)
    try:
        executor.inject_fault(f"worker:{KEY.name}/0", "error", rate=1.0)
        for _ in range(5):
            with pytest.raises(InferenceFailed, match=r"failed on a batch: InjectedFault"):
                await asyncio.wait_for(_run(executor), 60)
        assert events.recent("batch_retried") == []
    finally:
        await executor.aclose()


@dataclass
class _Instance:
    key: ModelKey
    index: int
    pid: int | None
    serving: bool = True

    @property
    def subject(self) -> str:
        return f"{self.key.name}/{self.index}"


def test_the_last_serving_instance_of_a_device_is_never_ejected() -> None:
    """Two instances failing in turn: one is ejected, the other (now alone) is not."""
    clock, events = VirtualClock(), EventSink()
    detector = OutlierDetector(OutlierEjectionConfig(), clock=clock, events=events)
    a, b = _Instance(KEY, 0, 10), _Instance(KEY, 1, 11)
    ejected = [detector.failed(i, "boom", peers=[a, b]) for i in (a, a, a, b, b, b)]
    assert ejected == [False, False, True, False, False, False]
    assert detector.ejected(a) and not detector.ejected(b)
    # A replaced instance (a new process) starts afresh.
    assert not detector.ejected(replace(a, pid=12))
    assert [e.kind for e in events.recent()] == ["instance_ejected", "instance_returned"]
