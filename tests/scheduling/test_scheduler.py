"""ModelScheduler on a virtual clock: ordering, batching, deadlines, modes, accounting."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from sordino.errors import (
    InferenceFailed,
    ModelError,
    QueueFull,
    QueueTimeout,
    RateLimited,
    Shed,
    ShuttingDown,
)
from sordino.execution.batch import NO_CONTEXT, BatchContext
from sordino.inference import ModelKey, RequestFacts
from sordino.memory.refs import Tensors
from sordino.records import BatchDone, QueueSettings, RequestDone
from sordino.scheduling.batcher import BatchPolicy
from sordino.scheduling.estimate import STALE_S
from sordino.scheduling.modes import StaticController, build_controller
from sordino.scheduling.scheduler import ModelScheduler
from sordino.testing import ScriptedExecutor, VirtualClock

KEY = ModelKey("m", "1")


class QueueDepths:
    """An observer that keeps every queue depth the scheduler reports."""

    def __init__(self) -> None:
        self.depths: list[int] = []

    def request_done(self, done: RequestDone) -> None:
        pass

    def batch_done(self, done: BatchDone) -> None:
        pass

    def queue_changed(self, model: ModelKey, depth: int) -> None:
        self.depths.append(depth)


def _scheduler(
    clock: VirtualClock,
    executor: ScriptedExecutor,
    policy: BatchPolicy | None = None,
    settings: QueueSettings | None = None,
    mode: str = "manual",
    observer: QueueDepths | EventLog | None = None,
) -> ModelScheduler:
    policy = policy or BatchPolicy(max_batch=8, max_delay_s=0.010)
    controller = build_controller(mode, policy, slo_s=0.1)  # type: ignore[arg-type]
    sched = ModelScheduler(
        KEY,
        batched=True,
        executor=executor,
        controller=controller,
        settings=settings or QueueSettings(),
        clock=clock,
        observers=(observer,) if observer is not None else (),
    )
    sched.start()
    return sched


def _x(value: float, rows: int = 1) -> dict[str, np.ndarray]:
    return {"x": np.full((rows, 2), value, dtype=np.float32)}


async def test_concurrent_requests_share_a_batch_and_get_their_own_rows() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, fn=lambda b: {"y": b["x"] * 2})
    sched = _scheduler(clock, executor)
    tasks = [asyncio.create_task(sched.infer(_x(i), priority=2)) for i in range(5)]
    await clock.advance(0.02)
    results = await asyncio.gather(*tasks)
    assert executor.batches == [5]
    for i, out in enumerate(results):
        np.testing.assert_array_equal(out["y"], np.full((1, 2), 2 * i, dtype=np.float32))
    await sched.close()


async def test_batch_waits_no_longer_than_delay() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=8, max_delay_s=0.010))
    task = asyncio.create_task(sched.infer(_x(1), priority=2))
    await clock.advance(0.009)
    assert executor.batches == []
    await clock.advance(0.002)
    assert executor.batches == [1]
    await task
    await sched.close()


async def test_full_batch_does_not_wait() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=4, max_delay_s=10.0))
    tasks = [asyncio.create_task(sched.infer(_x(i), priority=2)) for i in range(4)]
    await clock.settle()
    assert executor.batches == [4]
    await asyncio.gather(*tasks)
    await sched.close()


async def test_max_batch_splits_large_backlog() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.005)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=4, max_delay_s=0.001))
    tasks = [asyncio.create_task(sched.infer(_x(i), priority=2)) for i in range(10)]
    await clock.advance(0.1)
    await asyncio.gather(*tasks)
    assert executor.batches == [4, 4, 2]
    await sched.close()


async def test_high_priority_is_batched_first() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.005)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=2, max_delay_s=0.0))
    # The first request occupies the only instance; the rest queue behind it.
    first = asyncio.create_task(sched.infer(_x(0), priority=2))
    await clock.settle()
    low = [asyncio.create_task(sched.infer(_x(10 + i), priority=3)) for i in range(2)]
    high = [asyncio.create_task(sched.infer(_x(20 + i), priority=1)) for i in range(2)]
    await clock.advance(0.1)
    await asyncio.gather(first, *low, *high)
    order = [float(b["x"][0, 0]) for b in executor.contents]
    assert order == [0.0, 20.0, 10.0]
    await sched.close()


async def test_different_shapes_never_share_a_batch() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock)
    sched = _scheduler(clock, executor)
    a = asyncio.create_task(sched.infer({"x": np.zeros((1, 2), np.float32)}, priority=2))
    b = asyncio.create_task(sched.infer({"x": np.zeros((1, 3), np.float32)}, priority=2))
    await clock.advance(0.05)
    await asyncio.gather(a, b)
    assert sorted(executor.batches) == [1, 1]
    await sched.close()


async def test_expired_request_is_never_run() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 1.0)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=1))
    busy = asyncio.create_task(sched.infer(_x(0), priority=2))
    await clock.settle()
    waiting = asyncio.create_task(sched.infer(_x(1), priority=2, timeout_s=0.1))
    await clock.advance(0.2)
    with pytest.raises(QueueTimeout, match="timed out in the queue"):
        await waiting
    await clock.advance(1.0)
    await busy
    assert executor.batches == [1]
    assert sched.statistics().timed_out == 1
    await sched.close()


def _observed_one_at_a_time(
    batch_s: float,
) -> tuple[VirtualClock, ModelScheduler, QueueDepths]:
    """A scheduler of one-row batches of ``batch_s`` each, its queue depths observed."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: batch_s)
    depths = QueueDepths()
    return clock, _scheduler(clock, executor, BatchPolicy(max_batch=1), observer=depths), depths


async def test_observers_see_the_queue_empty_once_its_requests_expired() -> None:
    """Requests that time out in the queue leave it: the last depth reported is 0."""
    clock, sched, depths = _observed_one_at_a_time(batch_s=1.0)
    busy = asyncio.create_task(sched.infer(_x(0), priority=2))
    await clock.settle()
    waiting = [asyncio.create_task(sched.infer(_x(i), priority=2, timeout_s=0.1)) for i in (1, 2)]
    await clock.settle()
    assert depths.depths[-1] == 2
    await clock.advance(0.2)
    for task in waiting:
        with pytest.raises(QueueTimeout):
            await task
    assert depths.depths[-1] == 0
    await clock.advance(1.0)
    await busy
    await sched.close()


async def test_observers_see_the_queue_empty_once_hopeless_work_is_dropped() -> None:
    """Work dropped because it cannot finish in time left the queue: depth 0 reported."""
    clock, sched, depths = _observed_one_at_a_time(batch_s=0.2)
    await asyncio.gather(sched.infer(_x(0), priority=2), clock.advance(0.3))
    first = asyncio.create_task(sched.infer(_x(1), priority=2))
    await clock.settle()  # runs for 0.2 s
    late = asyncio.create_task(sched.infer(_x(2), priority=2, timeout_s=0.3))
    await clock.settle()
    assert depths.depths[-1] == 1
    await clock.advance(1.0)
    await first
    with pytest.raises(QueueTimeout, match="cannot finish before its deadline"):
        await late
    assert depths.depths[-1] == 0
    await sched.close()


async def test_observers_see_the_queue_empty_after_a_close_without_drain() -> None:
    clock, sched, depths = _observed_one_at_a_time(batch_s=0.01)
    tasks = [asyncio.create_task(sched.infer(_x(i), priority=2)) for i in range(3)]
    await clock.settle()
    assert depths.depths[-1] == 2
    closing = asyncio.create_task(sched.close(drain=False))
    await clock.advance(1.0)
    await closing
    await asyncio.gather(*tasks, return_exceptions=True)
    assert depths.depths[-1] == 0


async def test_full_queue_rejects_immediately() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 1.0)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=1), QueueSettings(max_queue_size=2))
    tasks = [asyncio.create_task(sched.infer(_x(0), priority=2))]
    await clock.settle()  # the first runs
    tasks += [asyncio.create_task(sched.infer(_x(i), priority=2)) for i in (1, 2)]
    await clock.settle()  # two queue behind it
    with pytest.raises(QueueFull):
        sched.submit(_x(9), priority=2)
    assert sched.statistics().rejected == 1
    await clock.advance(5.0)
    await asyncio.gather(*tasks)
    await sched.close()


async def test_backend_failure_fails_every_request_of_the_batch() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, fail=RuntimeError("boom"))
    sched = _scheduler(clock, executor)
    tasks = [asyncio.create_task(sched.infer(_x(i), priority=2)) for i in range(3)]
    await clock.advance(0.05)
    for task in tasks:
        with pytest.raises(InferenceFailed, match="boom"):
            await task
    stats = sched.statistics()
    assert stats.failed == 3 and stats.succeeded == 0
    await sched.close()


async def test_cancelled_request_is_removed_and_counted() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 1.0)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=1))
    busy = asyncio.create_task(sched.infer(_x(0), priority=2))
    await clock.settle()
    queued = asyncio.create_task(sched.infer(_x(1), priority=2))
    await clock.settle()
    queued.cancel()
    await clock.advance(2.0)
    await busy
    assert executor.batches == [1]
    stats = sched.statistics()
    assert stats.cancelled == 1
    assert stats.accepted == stats.succeeded + stats.failed + stats.cancelled + stats.in_flight
    await sched.close()


async def test_close_drains_queued_work_and_refuses_new() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.01)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=1))
    tasks = [asyncio.create_task(sched.infer(_x(i), priority=2)) for i in range(3)]
    await clock.settle()
    closing = asyncio.create_task(sched.close())
    await clock.settle()
    with pytest.raises(ShuttingDown):
        sched.submit(_x(9), priority=2)
    await clock.advance(1.0)
    await closing
    assert len(await asyncio.gather(*tasks)) == 3


async def test_close_without_drain_fails_queued_explicitly() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.01)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=1))
    tasks = [asyncio.create_task(sched.infer(_x(i), priority=2)) for i in range(3)]
    await clock.settle()
    closing = asyncio.create_task(sched.close(drain=False))
    await clock.advance(1.0)
    await closing
    results = await asyncio.gather(*tasks, return_exceptions=True)
    # The two queued and the one running (cancelled: a close without drain never waits).
    assert sum(isinstance(r, ShuttingDown) for r in results) == 3
    stats = sched.statistics()
    assert stats.accepted == stats.succeeded + stats.failed + stats.cancelled + stats.in_flight


async def test_ultra_low_latency_never_waits() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock)
    sched = _scheduler(
        clock, executor, BatchPolicy(max_batch=8, max_delay_s=1.0), mode="ultra_low_latency"
    )
    task = asyncio.create_task(sched.infer(_x(1), priority=2))
    await clock.settle()
    assert executor.batches == [1]
    await task
    await sched.close()


async def test_manual_mode_waits_full_delay_at_light_load() -> None:
    """Unlike adaptive, manual mode holds every lone request for the whole delay."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=8, max_delay_s=0.05), mode="manual")
    for i in range(3):
        task = asyncio.create_task(sched.infer(_x(i), priority=2))
        await clock.advance(0.04)
        assert executor.batches == [1] * i  # still waiting, however light the load has been
        await clock.advance(0.02)
        assert executor.batches == [1] * (i + 1)
        np.testing.assert_array_equal(executor.contents[-1]["x"], _x(i)["x"])
        out = await task
        np.testing.assert_array_equal(out["x"], _x(i)["x"])
        await clock.advance(1.0)  # one request a second: light load
    await sched.close()


async def test_adaptive_mode_does_not_add_delay_at_light_load() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=8, max_delay_s=0.05), mode="adaptive")
    for i in range(3):
        task = asyncio.create_task(sched.infer(_x(i), priority=2))
        await clock.settle()
        assert executor.batches == [1] * (i + 1)  # ran without waiting for the delay
        await task
        await clock.advance(1.0)  # one request a second: light load
    await sched.close()


async def test_conservative_mode_halves_batches() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock)
    sched = _scheduler(
        clock, executor, BatchPolicy(max_batch=8, max_delay_s=0.01), mode="conservative"
    )
    tasks = [asyncio.create_task(sched.infer(_x(i), priority=2)) for i in range(8)]
    await clock.advance(0.1)
    await asyncio.gather(*tasks)
    assert executor.batches == [4, 4]
    await sched.close()


async def test_two_instances_run_batches_concurrently() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.1, count=2)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=1))
    tasks = [asyncio.create_task(sched.infer(_x(i), priority=2)) for i in range(2)]
    await clock.settle()
    assert sched.statistics().running_batches == 2
    await clock.advance(0.2)
    await asyncio.gather(*tasks)
    await sched.close()


def test_static_controller_reports_its_policy() -> None:
    stats = StaticController("manual", BatchPolicy(max_batch=4, max_delay_s=0.01)).statistics()
    assert (stats.max_batch, stats.max_delay_s) == (4, 0.01)


class EarlyClock(VirtualClock):
    """A clock whose timers fire half a millisecond early, as uvloop's may (a timer set
    for less than that ahead fires on time, so time still moves on)."""

    def call_at(self, when: float, callback):  # type: ignore[no-untyped-def]
        early = when - 0.0005
        return super().call_at(early if early > self.now() else when, callback)


async def test_batch_runs_when_the_delay_timer_fires_early() -> None:
    clock = EarlyClock()
    executor = ScriptedExecutor(clock)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=8, max_delay_s=0.010))
    task = asyncio.create_task(sched.infer(_x(1), priority=2))
    await clock.advance(0.05)
    assert executor.batches == [1], "the request was left waiting after an early timer"
    await task
    await sched.close()


def _poisonable(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A model that raises on any negative value, as a model does on an input it cannot take."""
    if (batch["x"] < 0).any():
        raise ModelError("model m failed on a batch: negative input")
    return {"y": batch["x"] * 2}


async def test_a_request_the_model_raises_on_fails_alone() -> None:
    """A batch the model raised on is re-run one request at a time: only the offender fails."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, fn=_poisonable)
    sched = _scheduler(clock, executor)
    values = [1.0, 2.0, -1.0, 3.0]
    tasks = [asyncio.create_task(sched.infer(_x(v), priority=2)) for v in values]
    await clock.advance(0.05)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert executor.batches == [4, 1, 1, 1, 1]
    assert isinstance(results[2], ModelError)
    for value, result in zip(values, results, strict=True):
        if value >= 0:
            assert not isinstance(result, BaseException)
            np.testing.assert_array_equal(result["y"], np.full((1, 2), 2 * value, np.float32))
    stats = sched.statistics()
    assert (stats.succeeded, stats.failed, stats.isolated_batches) == (3, 1, 1)
    await sched.close()


class _NodeQuota(ScriptedExecutor):
    """Refuses (429) any batch holding a part of owner "small", as a Ray node pool
    refuses a tenant over its per-node quota; records each batch's owners."""

    owners: list[tuple[str, ...]]

    async def run(
        self,
        model: ModelKey,
        parts: Sequence[Mapping[str, Any]],
        context: BatchContext = NO_CONTEXT,
    ) -> Tensors:
        owners = context.owners
        self.owners.append(owners)
        assert len(owners) == len(parts), "one owner per part, in the parts' order"
        if "small" in owners:
            raise RateLimited("tenant 'small' is over its quota on node n1")
        return await super().run(model, parts, context)


async def test_a_tenant_refused_by_a_node_quota_fails_alone() -> None:
    """The executor learns each part's owner; a RateLimited batch of several requests is
    re-run one request at a time, so only the over-quota tenant's request fails."""
    clock = VirtualClock()
    executor = _NodeQuota(clock)
    executor.owners = []
    sched = _scheduler(clock, executor)
    owners = ["acme", "small", "default"]
    requests = [sched.submit(_x(i), priority=2, owner=o) for i, o in enumerate(owners)]
    await clock.advance(0.05)
    results = await asyncio.gather(*(sched.result(r) for r in requests), return_exceptions=True)
    assert executor.owners == [("acme", "small", "default"), ("acme",), ("small",), ("default",)]
    assert isinstance(results[1], RateLimited)
    assert not isinstance(results[0], BaseException) and not isinstance(results[2], BaseException)
    assert sched.statistics().isolated_batches == 1
    await sched.close()


async def test_a_batch_lost_for_another_reason_is_not_re_run_per_request() -> None:
    """Only a model error isolates requests; a lost worker or dead device fails the batch."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, fail=InferenceFailed("the batch lost its worker twice"))
    sched = _scheduler(clock, executor)
    tasks = [asyncio.create_task(sched.infer(_x(i), priority=2)) for i in range(3)]
    await clock.advance(0.05)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert executor.batches == [3]
    assert all(isinstance(r, InferenceFailed) for r in results)
    assert sched.statistics().isolated_batches == 0
    await sched.close()


async def test_low_priority_is_shed_first_and_fast_when_the_work_ahead_misses_its_deadline() -> (
    None
):
    """With a backlog, a low-priority request whose deadline the queue cannot meet is
    refused at arrival (503, never accepted), while a high-priority one still gets in."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.1)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=4))
    warm = asyncio.create_task(sched.infer(_x(0, rows=4), priority=2))
    await clock.advance(0.2)
    await warm  # the scheduler has seen a batch: 4 rows in 0.1 s
    backlog = [asyncio.create_task(sched.infer(_x(i), priority=3)) for i in range(40)]
    await clock.settle()
    with pytest.raises(Shed, match="overloaded") as refused:
        sched.submit(_x(9), priority=3, timeout_s=0.5)  # 36 rows queued ahead: about 1 s
    assert refused.value.retry_after_s > 0.5
    high = asyncio.create_task(sched.infer(_x(7), priority=1, timeout_s=0.5))
    await clock.advance(0.3)
    out = await high
    np.testing.assert_array_equal(out["x"], _x(7)["x"])
    assert sched.statistics().rejected == 1
    await clock.advance(2.0)
    await asyncio.gather(*backlog)
    await sched.close()


async def test_work_that_cannot_finish_before_its_deadline_is_not_started() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.2)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=1))
    await asyncio.gather(sched.infer(_x(0), priority=2), clock.advance(0.3))
    first = asyncio.create_task(sched.infer(_x(1), priority=2))
    await clock.settle()  # runs for 0.2 s
    late = asyncio.create_task(sched.infer(_x(2), priority=2, timeout_s=0.3))
    await clock.advance(1.0)
    await first
    with pytest.raises(QueueTimeout, match="cannot finish before its deadline"):
        await late
    assert executor.batches == [1, 1]  # the hopeless one never ran
    await sched.close()


async def test_an_idle_model_with_a_stale_batch_time_runs_what_it_says_is_late() -> None:
    """Refused while the batch time is fresh; over a second later, with nothing else in
    flight, the request runs (a probe) and its batch's time replaces the old figure."""
    clock = VirtualClock()
    latencies = [0.2, 0.2, 0.01]
    executor = ScriptedExecutor(clock, latency=lambda rows: latencies.pop(0))
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=1))
    await asyncio.gather(sched.infer(_x(0), priority=2), clock.advance(0.3))
    with pytest.raises(Shed, match="overloaded"):
        sched.submit(_x(1), priority=2, timeout_s=0.1)  # 0.1 s after a 0.2 s batch
    await clock.advance(STALE_S)
    late = asyncio.create_task(sched.infer(_x(2), priority=2, timeout_s=0.1))
    await clock.advance(0.3)
    np.testing.assert_array_equal((await late)["x"], _x(2)["x"])
    fast = asyncio.create_task(sched.infer(_x(3), priority=2, timeout_s=0.1))  # 0.2 s known
    with pytest.raises(Shed):
        await fast
    assert executor.batches == [1, 1]
    await sched.close()


async def test_one_slow_batch_does_not_refuse_every_later_deadline() -> None:
    """A cold first batch (0.5 s), then 1 ms ones; a request every 50 ms with a 100 ms
    deadline. Before, every one was refused at arrival for good (``shed``: the 0.5 s
    learnt) and no batch ran to learn otherwise; now they are refused for about a
    second, then one runs, and every one after it is served."""
    clock = VirtualClock()
    slow = [0.5]
    executor = ScriptedExecutor(clock, latency=lambda rows: slow.pop() if slow else 0.001)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=4))
    first = asyncio.create_task(sched.infer(_x(0), priority=2))
    await clock.advance(0.6)
    await first
    answers = []
    for i in range(1, 41):
        task = asyncio.create_task(sched.infer(_x(i), priority=2, timeout_s=0.1))
        await clock.advance(0.05)
        try:
            await task
            answers.append("ok")
        except Shed:
            answers.append("shed")
    served = answers.index("ok")
    assert served <= STALE_S / 0.05 and answers[served:] == ["ok"] * (40 - served)
    assert sched.expected_wait(2) is not None and sched.expected_wait(2) < 0.01
    await sched.close()


async def test_a_backlog_is_costed_in_full_batches_once_batch_sizes_vary() -> None:
    """A batch costs a fixed 50 ms plus 1 ms a row. Seen at 1 and at 8 rows, that split
    is known: 48 rows queued are 6 full batches (about 0.35 s, with its own batch 0.4 s),
    so a request with a 0.6 s deadline is admitted (0.4 s is within the admitted 80 % of
    it) — and does finish in time. (Costing every row at the recent rows-per-second, as
    before, put 48 rows near 1 s and refused it.)"""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.05 + 0.001 * rows)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=8, max_delay_s=0.0))
    for rows in (1, 8, 1, 8, 1, 8):  # at the backlog's priority: no higher arrivals
        done = asyncio.create_task(sched.infer(_x(0, rows=rows), priority=3))
        await clock.advance(0.1)
        await done
    backlog = [asyncio.create_task(sched.infer(_x(i, rows=8), priority=3)) for i in range(7)]
    await clock.settle()  # the first is running; 48 rows wait
    expected = sched.expected_wait(3)
    assert expected is not None and 0.3 < expected < 0.48
    late = asyncio.create_task(sched.infer(_x(5), priority=3, timeout_s=0.6))
    await clock.advance(1.0)
    np.testing.assert_array_equal((await late)["x"], _x(5)["x"])
    assert sched.statistics().rejected == 0
    assert executor.batches[-1] == 1  # it ran, last and alone
    await asyncio.gather(*backlog)


async def test_arrival_rate_counts_bursts_over_a_window() -> None:
    """Bursts separated by quiet gaps read at their true rate (issue 16: an average of
    gaps, stretched by the time since the last arrival, read far under it)."""
    from sordino.scheduling.estimate import ARRIVAL_WINDOW_S

    clock = VirtualClock()
    executor = ScriptedExecutor(clock)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=64, max_delay_s=0.05), mode="manual")
    tasks = []
    for _burst in range(20):  # 8 requests at once, every 20 ms: 400 rows/s
        tasks += [asyncio.create_task(sched.infer(_x(i), priority=2)) for i in range(8)]
        await clock.settle()
        await clock.advance(0.02)
    assert 0.9 * 400 <= sched._arrival_rate() <= 400
    await clock.advance(ARRIVAL_WINDOW_S)
    assert sched._arrival_rate() == 0.0  # nothing arrived in the window
    await asyncio.gather(*tasks)
    await sched.close()


async def test_adaptive_mode_does_not_wait_for_a_closed_loop_that_is_all_here() -> None:
    """One client sending its next request as soon as the last is answered, 500 a
    second: the arrival rate is high, but nobody else can come, so nothing waits."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.001)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=8, max_delay_s=0.05), mode="adaptive")
    for i in range(40):
        task = asyncio.create_task(sched.infer(_x(i), priority=2))
        await clock.settle()
        assert len(executor.batches) == i + 1  # ran without waiting for the delay
        await clock.advance(0.001)
        await task
        await clock.advance(0.001)
    await sched.close()


async def test_a_batch_ending_with_nothing_queued_takes_no_scheduling_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At one request in flight each batch used to end in a scheduling turn that only
    found the queue empty (an event-loop step per request); now the loop looks again
    when a batch ends only if work is queued (it runs next) or the scheduler closes."""
    from sordino.scheduling.loop import SchedulingLoop

    turns = 0
    schedule = SchedulingLoop._schedule

    def counted(self: SchedulingLoop, now: float) -> Any:
        nonlocal turns
        turns += 1
        return schedule(self, now)

    monkeypatch.setattr(SchedulingLoop, "_schedule", counted)
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.001)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=8, max_delay_s=0.05), mode="adaptive")
    await clock.settle()
    turns = 0
    for i in range(10):  # one at a time: each runs at once, alone
        task = asyncio.create_task(sched.infer(_x(i), priority=2))
        await clock.advance(0.002)
        assert (await task)["x"][0, 0] == i
    assert executor.batches == [1] * 10
    # One a request, at its arrival (the arrival's turn, run as a callback, does not
    # look again at the queue it emptied); none when its batch ended (main: 30).
    assert turns == 10
    await sched.close()


async def test_an_arrival_at_an_idle_loop_runs_without_waking_the_scheduling_task() -> None:
    """A lone arrival is scheduled by a callback where the task's wake-up would be: its
    batch runs, and the task stays asleep; a burst handed over in one step still
    batches together, and work the batch leaves queued wakes the task."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.001)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=4, max_delay_s=0.0))
    await clock.settle()
    wake = sched._wake  # the loop's event is what this test watches
    sets = 0
    original = wake.set

    def counted() -> None:
        nonlocal sets
        sets += 1
        original()

    wake.set = counted  # type: ignore[method-assign]
    task = asyncio.create_task(sched.infer(_x(1), priority=2))
    await clock.advance(0.002)
    assert (await task)["x"][0, 0] == 1
    assert executor.batches == [1] and sets == 0
    burst = [asyncio.create_task(sched.infer(_x(i), priority=2)) for i in range(6)]
    await clock.advance(0.01)
    assert [(await t)["x"][0, 0] for t in burst] == list(range(6))
    assert executor.batches == [1, 4, 2]  # the burst together: 4, then the 2 left
    assert sets >= 1  # the 2 left over are the task's to run
    await sched.close()


async def test_work_queued_behind_a_batch_runs_when_it_ends_and_a_close_waits_for_it() -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.001)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=8, max_delay_s=0.0))
    first = asyncio.create_task(sched.infer(_x(1), priority=2))
    await clock.settle()
    second = asyncio.create_task(sched.infer(_x(2), priority=2))
    await clock.settle()
    closing = asyncio.create_task(sched.close())
    await clock.advance(0.01)
    assert [(await t)["x"][0, 0] for t in (first, second)] == [1, 2]
    await closing
    assert executor.batches[-2:] == [1, 1]


async def test_adaptive_mode_does_not_wait_while_another_instance_is_idle() -> None:
    """Arrivals are expected (8 came at once a moment ago), but with both instances
    idle a lone request runs at once: waiting would leave the second one unused."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.001, count=2)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=8, max_delay_s=0.05), mode="adaptive")
    await asyncio.gather(*(sched.infer(_x(i), priority=2) for i in range(8)), clock.advance(0.01))
    task = asyncio.create_task(sched.infer(_x(8), priority=2))
    await clock.settle()
    assert executor.batches == [8, 1]
    await clock.advance(0.01)
    await task
    await sched.close()


async def _warm(sched: ModelScheduler, clock: VirtualClock, priority: int = 3) -> None:
    """Batches of 1 and 4 rows: enough for the scheduler to fit a batch's fixed and per-row cost."""
    for rows in (1, 4, 1, 4):
        done = asyncio.create_task(sched.infer(_x(0, rows=rows), priority=priority))
        await clock.advance(0.2)
        await done


async def _low_refused_behind_highs(
    sched: ModelScheduler, clock: VirtualClock, highs: int
) -> list[asyncio.Task[Any]]:
    """``highs`` high rows arriving at 80 a second, then ten low rows queued: a low
    request with a 0.3 s deadline behind them is refused at once. Returns the queued."""
    queued = []
    for _ in range(highs):
        queued.append(asyncio.create_task(sched.infer(_x(1), priority=1)))
        await clock.advance(0.0125)
    queued += [asyncio.create_task(sched.infer(_x(2), priority=3)) for _ in range(10)]
    await clock.settle()
    expected = sched.expected_wait(3)
    assert expected is not None and expected > 0.3
    with pytest.raises(Shed, match="overloaded"):
        sched.submit(_x(9), priority=3, timeout_s=0.3)
    return queued


@pytest.mark.parametrize(
    ("latency", "expected"),
    [
        # Each row costs the batch time (a CNN on a CPU): the high one runs alone, and
        # the low ones after it in a batch of their own.
        (lambda rows: 0.01 * rows, [1, 4]),
        # The batch time is mostly fixed (a small MLP): the low ones ride along for free.
        (lambda rows: 0.05 + 0.001 * rows, [5]),
    ],
    ids=["per-row cost", "fixed cost"],
)
async def test_low_priority_rows_join_a_high_priority_batch_only_where_they_are_nearly_free(
    latency: Any, expected: list[int]
) -> None:
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=latency)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=8, max_delay_s=0.0))
    await _warm(sched, clock)
    running = asyncio.create_task(sched.infer(_x(1), priority=3))
    await clock.settle()  # it runs; the rest queue behind it
    low = [asyncio.create_task(sched.infer(_x(2), priority=3)) for _ in range(4)]
    high = asyncio.create_task(sched.infer(_x(3), priority=1))
    await clock.advance(1.0)
    await asyncio.gather(running, high, *low)
    assert executor.batches[-len(expected) :] == expected
    await sched.close()


async def test_a_low_request_is_refused_at_once_when_higher_arrivals_would_overtake_it() -> None:
    """High-priority rows arrive at 80 a second and take 10 ms each: 80 % of the model's
    time. Ten low rows queued are 0.1 s of work, but they get only the remaining fifth
    of each second, so a low request behind them waits about 0.5 s: with a 0.3 s
    deadline it is refused now (it was accepted, overtaken and refused late, before),
    while a high request with the same deadline is accepted and served in time."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.01 * rows)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=1, max_delay_s=0.0))
    await _warm(sched, clock)
    queued = await _low_refused_behind_highs(sched, clock, highs=20)  # 80 rows/s for 0.25 s
    high = asyncio.create_task(sched.infer(_x(7), priority=1, timeout_s=0.3))
    await clock.advance(2.0)
    np.testing.assert_array_equal((await high)["x"], _x(7)["x"])
    await asyncio.gather(*queued)
    assert sched.statistics().rejected == 1
    await sched.close()


async def test_the_higher_rate_reads_right_at_the_onset_of_a_surge() -> None:
    """After a silence, high-priority rows arrive at 80 a second. 50 ms into the surge
    their rate reads about 80/s (counted over the time they have run), not 16/s (four
    rows over the whole 250 ms window): a low request behind 10 queued low rows is
    refused at once, instead of being admitted against a rate read low."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.01 * rows)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=1, max_delay_s=0.0))
    await _warm(sched, clock)
    await clock.advance(2.0)  # silence: every window empties
    queued = await _low_refused_behind_highs(sched, clock, highs=4)
    await clock.advance(2.0)
    await asyncio.gather(*queued)
    await sched.close()


async def test_under_steady_high_load_a_low_request_with_nothing_ahead_is_accepted() -> None:
    """High-priority rows take 40 % of the model's time, steadily. The allowance for
    their bursts applies to work queued ahead: with nothing ahead a low-priority request
    starts at once, so it is accepted even with a deadline of a few batches."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.01 * rows)
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=1, max_delay_s=0.0))
    await _warm(sched, clock)
    highs = []
    for _ in range(60):  # 40 rows a second for 1.5 s
        highs.append(asyncio.create_task(sched.infer(_x(1), priority=1)))
        await clock.advance(0.025)
    await asyncio.gather(*highs)
    expected = sched.expected_wait(3)
    assert expected is not None and expected < 0.02
    low = asyncio.create_task(sched.infer(_x(5), priority=3, timeout_s=0.05))
    await clock.advance(0.1)
    np.testing.assert_array_equal((await low)["x"], _x(5)["x"])
    await sched.close()


async def test_a_close_without_drain_answers_a_batch_that_never_finishes() -> None:
    """Issue 27: a batch that never finishes (then: one waiting for arena space that
    never came) kept ``close(drain=False)``, and so the server's stop, waiting for
    ever. The batch is cancelled and its requests get ShuttingDown; meanwhile
    ``running_for`` (what readiness reads) tells how long it has been stuck."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 1e9)
    sched = _scheduler(clock, executor)
    tasks = [asyncio.create_task(sched.infer(_x(i), priority=2)) for i in range(3)]
    await clock.advance(0.02)
    assert executor.batches == [3]
    await clock.advance(500.0)
    assert sched.running_for() >= 500.0
    await asyncio.wait_for(sched.close(drain=False), 5)
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    assert all(isinstance(r, ShuttingDown) for r in results), results
    assert "stopping" in str(results[0])
    assert sched.running_for() == 0.0
    assert sched.statistics().in_flight == 0


async def test_a_close_without_drain_answers_every_request_of_a_batch_run_one_by_one() -> None:
    """A batch the model refused is re-run one request at a time; cancelled during the
    first of those runs, the requests not yet run alone are answered too."""
    clock = VirtualClock()
    executor = ScriptedExecutor(
        clock, latency=lambda rows: 1e9 if rows == 1 else 0.0, fail=ModelError("poisoned")
    )
    sched = _scheduler(clock, executor)
    tasks = [asyncio.create_task(sched.infer(_x(i), priority=2)) for i in range(3)]
    await clock.advance(0.02)
    assert executor.batches == [3, 1]
    await asyncio.wait_for(sched.close(drain=False), 5)
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    assert all(isinstance(r, ShuttingDown) for r in results), results
    assert sched.statistics().in_flight == 0


async def test_the_executor_is_handed_each_batchs_context() -> None:
    """Executor.run gets the batch's context: per part, in the parts' order, each
    request's facts and owner; the tenants of a tenanted batch; no step region."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock)
    sched = _scheduler(clock, executor)
    given = RequestFacts(id="r1", correlation_id=5, parameters='{"a":1}', priority=2)
    first = sched.submit(_x(1), priority=2, facts=given, tenant="acme", owner="acme")
    second = sched.submit(_x(2), priority=3, request_id="r2", tenant="beta")
    await clock.advance(0.05)
    for request in (first, second):
        (await sched.result(request)).release()
    (context,) = executor.contexts
    assert context.owners == ("acme", "")
    assert context.tenants == frozenset({"acme", "beta"})
    assert context.region is None
    # A request submitted without facts (a pipeline node's) gets its priority alone.
    assert context.requests == (given, RequestFacts(priority=3))
    await sched.close()


async def test_a_batch_without_request_facts_carries_none() -> None:
    """Requests submitted without facts (their backend reads none): no facts are made."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock)
    sched = _scheduler(clock, executor)
    request = sched.submit(_x(1), priority=2, request_id="r1")
    await clock.advance(0.05)
    (await sched.result(request)).release()
    (context,) = executor.contexts
    assert context.requests == () and context.owners == ("",)
    await sched.close()


class EventLog:
    """An observer that keeps every event, in the order it heard them."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def request_done(self, done: RequestDone) -> None:
        self.events.append(("request", done.request_id))

    def batch_done(self, done: BatchDone) -> None:
        self.events.append(("batch", done.requests))

    def queue_changed(self, model: ModelKey, depth: int) -> None:
        self.events.append(("queue", depth))


async def test_observers_hear_every_event_once_in_the_order_it_happened() -> None:
    """Request ends and batches reach the observers a moment after the answers (one
    callback a batch), in order with the queue changes around them; a close hands on
    what still waits."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.001)
    log = EventLog()
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=8, max_delay_s=0.0), observer=log)
    await clock.settle()
    burst = [
        asyncio.create_task(sched.infer(_x(i), priority=2, request_id=f"r{i}")) for i in range(2)
    ]
    await clock.advance(0.01)
    await asyncio.gather(*burst)
    last = asyncio.create_task(sched.infer(_x(9), priority=2, request_id="r9"))
    await clock.advance(0.01)
    await last
    await sched.close()  # whatever still waits is handed on before it returns
    assert log.events == [
        ("queue", 1),
        ("queue", 2),
        ("queue", 0),
        ("request", "r0"),
        ("request", "r1"),
        ("batch", 2),
        ("queue", 1),
        ("queue", 0),
        ("request", "r9"),
        ("batch", 1),
    ]


async def test_a_batch_answers_all_its_requests_before_its_telemetry_is_counted() -> None:
    """The observers hear of a batch once each of its requests has its answer: the
    responses leave first (at one request in flight, the telemetry is off its latency)."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.001)
    answered: list[list[bool]] = []

    class Watcher(EventLog):
        def batch_done(self, done: BatchDone) -> None:
            answered.append([task.done() for task in burst])

    sched = _scheduler(
        clock, executor, BatchPolicy(max_batch=8, max_delay_s=0.0), observer=Watcher()
    )
    await clock.settle()
    burst = [asyncio.create_task(sched.infer(_x(i), priority=2)) for i in range(3)]
    await clock.advance(0.01)
    await asyncio.gather(*burst)
    await sched.close()
    assert answered == [[True, True, True]]


async def test_the_next_batch_starts_as_an_instance_comes_free_before_the_answers() -> None:
    """One instance, three batches' worth queued: each batch starts the moment the one
    before returns from the executor, ahead of that batch's answers (so the model
    computes while they are written), and never two at once on the one instance."""
    clock = VirtualClock()
    executor = ScriptedExecutor(clock, latency=lambda rows: 0.001)
    inside = 0
    most = 0
    run = executor.run

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        try:
            return await run(*args, **kwargs)
        finally:
            inside -= 1

    executor.run = counted  # type: ignore[method-assign]
    sched = _scheduler(clock, executor, BatchPolicy(max_batch=2, max_delay_s=0.0))
    started_at_answer: dict[int, int] = {}
    tasks = []

    def answered(i: int) -> None:
        started_at_answer.setdefault(i, len(executor.batches))

    for i in range(6):
        task = asyncio.create_task(sched.infer(_x(i), priority=2))
        task.add_done_callback(lambda _t, i=i: answered(i))
        tasks.append(task)
    await clock.advance(0.01)
    assert [(await t)["x"][0, 0] for t in tasks] == [0, 1, 2, 3, 4, 5]
    assert executor.batches == [2, 2, 2]
    # The first batch's requests were answered after the second batch had started, the
    # second's after the third had.
    assert started_at_answer == {0: 2, 1: 2, 2: 3, 3: 3, 4: 3, 5: 3}
    assert most == 1
    await sched.close()
