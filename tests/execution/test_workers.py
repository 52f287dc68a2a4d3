"""Worker processes under real load: SIGKILL, hang and latency faults, thread isolation.

One server (two worker processes for the digits classifier, a 3 s heartbeat timeout)
serves every test here; each counts events from its own starting mark.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Iterator

import httpx
import pytest

from sordino.config import RuntimeConfig
from sordino.control.client import AdminClient
from sordino.errors import InferenceFailed
from sordino.events import Event
from sordino.testing import RunningServer, serve_in_thread
from tests.execution.load import (
    BODY,
    Load,
    digits,
    events,
    mark,
    only_instance,
    wait_until,
    worker,
)
from tests.metrics import counter_sum

TOKEN = "test-admin-token"


@pytest.fixture(scope="module")
def pair() -> Iterator[RunningServer]:
    config = RuntimeConfig.model_validate(
        {
            "server": {"admin_token": TOKEN},
            "workers": {
                "heartbeat_timeout": "3s",
                "execution_timeout": "30s",
                "restart_backoff": "1s",
            },
        }
    )
    with serve_in_thread(config, digits(instance_count=2)) as server:
        yield server


def test_sigkill_under_load_loses_no_request(pair: RunningServer) -> None:
    """SIGKILL a worker under steady load: no failed request, one restart, the new one serves."""
    start = mark(pair)
    before = worker(pair, 0)
    with Load(pair.url, clients=6) as load:
        load.wait_ok(50)
        os.kill(before.pid, signal.SIGKILL)
        wait_until(lambda: events(pair, "worker_restarted", start), 60, "the restart")
        replaced = worker(pair, 0)
        assert replaced.pid != before.pid and replaced.state == "ready"
        served = replaced.batches
        wait_until(lambda: worker(pair, 0).batches > served + 5, 60, "the new worker to serve")
        load.wait_ok(20)
    assert load.errors == []
    failed = events(pair, "worker_failed", start)
    restarted = events(pair, "worker_restarted", start)
    assert [e.cause for e in failed] == ["killed by SIGKILL"]
    assert len(restarted) == 1 and restarted[0].cause == "killed by SIGKILL"
    assert restarted[0].subject == "digits-classifier/0"
    assert worker(pair, 0).restarts == before.restarts + 1


def test_hang_is_detected_retried_and_replaced(pair: RunningServer) -> None:
    """A hung worker is found by its heartbeat, its batch runs elsewhere, it is replaced."""
    start = mark(pair)
    admin = AdminClient(pair.url, TOKEN)
    hung = worker(pair, 1)
    with Load(pair.url, clients=6) as load:
        load.wait_ok(20)
        fault = admin.inject("worker:digits-classifier/1", "hang")
        wait_until(lambda: events(pair, "worker_failed", start), 60, "hang detection")
        admin.clear(fault["id"])
        wait_until(lambda: events(pair, "worker_restarted", start), 60, "the replacement")
        load.wait_ok(20)
    assert load.errors == []
    (failed,) = events(pair, "worker_failed", start)
    assert failed.subject == "digits-classifier/1"
    assert failed.cause.startswith("hang: no heartbeat for")
    silent = float(re.search(r"for ([\d.]+) s", failed.cause).group(1))  # type: ignore[union-attr]
    assert 3.0 <= silent < 20.0  # printed to 0.1 s: just past 3 s reads "3.0"
    retried = events(pair, "batch_retried", start)
    assert [e.subject for e in retried] == ["digits-classifier/1"]
    assert worker(pair, 1).pid != hung.pid
    assert [e.kind for e in events(pair, "fault_injected", start)] == ["fault_injected"]


def test_crash_fault_exits_the_worker_and_it_comes_back(pair: RunningServer) -> None:
    """A crash fault makes the worker exit mid-batch; the batch is retried, the worker restarted."""
    start = mark(pair)
    admin = AdminClient(pair.url, TOKEN)
    with Load(pair.url, clients=4) as load:
        load.wait_ok(20)
        fault = admin.inject("worker:digits-classifier/0", "crash")
        wait_until(lambda: events(pair, "worker_failed", start), 60, "the crash")
        admin.clear(fault["id"])
        wait_until(lambda: events(pair, "worker_restarted", start), 60, "the replacement")
        load.wait_ok(20)
    assert load.errors == []
    (failed,) = events(pair, "worker_failed", start)
    assert (failed.subject, failed.cause) == ("digits-classifier/0", "exited with code 70")
    assert [e.subject for e in events(pair, "batch_retried", start)] == ["digits-classifier/0"]


def _buckets(url: str) -> list[tuple[float, float]]:
    """The cumulative buckets of sordino_request_seconds from /metrics."""
    text = httpx.get(url + "/metrics").text
    return [
        (float(le), float(count))
        for le, count in re.findall(
            r'sordino_request_seconds_bucket\{le="([^"]+)",model="digits-classifier"\} (\S+)', text
        )
    ]


def _p99(before: list[tuple[float, float]], after: list[tuple[float, float]]) -> float:
    """The p99 (bucket upper bound) of the requests finished between two scrapes."""
    counts = [(le, n - m) for (le, n), (_, m) in zip(after, before, strict=True)]
    total = counts[-1][1]
    return next(le for le, count in counts if count >= 0.99 * total)


def test_latency_fault_raises_p99_without_errors(pair: RunningServer) -> None:
    """200 ms of injected latency shows in the p99 of /metrics; nothing fails."""
    admin = AdminClient(pair.url, TOKEN)
    with Load(pair.url, clients=4) as load:
        start = _buckets(pair.url)
        load.wait_ok(50)
        calm = _buckets(pair.url)
        admin.inject("worker:digits-classifier", "latency", latency="300ms")
        try:
            load.wait_ok(8)  # requests already in flight may still be fast
            slow = _buckets(pair.url)
            load.wait_ok(24, timeout=120)
        finally:
            admin.clear()
        end = _buckets(pair.url)
    assert load.errors == []
    assert _p99(slow, end) >= 0.3
    assert _p99(slow, end) >= _p99(start, calm)


def test_admin_api_needs_the_token(pair: RunningServer) -> None:
    """Without the bearer token the admin API answers 401 and injects nothing."""
    response = httpx.post(pair.url + "/v2/admin/chaos", json={"target": "x", "fault": "error"})
    assert response.status_code == 401
    response = httpx.get(
        pair.url + "/v2/admin/chaos", headers={"Authorization": "Bearer wrong-token"}
    )
    assert response.status_code == 401
    assert AdminClient(pair.url, TOKEN).faults() == []


def test_admin_api_is_off_without_a_token(server: RunningServer) -> None:
    """A server without an admin token refuses the admin API (403) with the fix."""
    response = httpx.get(server.url + "/v2/admin/chaos")
    assert response.status_code == 403
    assert "SORDINO_ADMIN_TOKEN" in response.json()["error"]


def test_thread_isolation_serves_in_process() -> None:
    """isolation: thread runs the model inside the server, with no worker process."""
    with serve_in_thread(RuntimeConfig(), digits(isolation="thread")) as server:
        response = httpx.post(server.url + "/v2/models/digits-classifier/infer", json=BODY)
        assert response.status_code == 200
        (stats,) = server.runtime.executor.statistics().workers
        assert (stats.isolation, stats.pid) == ("thread", None)


def test_a_batch_cancelled_mid_run_replaces_its_worker(pair: RunningServer) -> None:
    """A cancelled batch leaves the worker's pipe exchange half done: it is replaced, and
    the model keeps serving."""
    start = mark(pair)
    client = AdminClient(pair.url, TOKEN)
    client.inject("worker:digits-classifier", "latency", latency="5s", duration="30s")
    try:
        runtime = pair.runtime
        model = runtime.get("digits-classifier")

        async def cancel_one() -> None:
            import asyncio

            from sordino.backends.base import dummy_inputs

            task = asyncio.ensure_future(
                runtime.executor.run(model.key, [dummy_inputs(model.metadata, 1)])
            )
            # Cancel once a worker is inside the batch (held there by the latency fault).
            for _ in range(1000):
                if any(w.busy for w in runtime.executor.statistics().workers):
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # past the hand-over: well inside the 5 s fault
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        pair.call(cancel_one())
    finally:
        client.clear()
    wait_until(lambda: events(pair, "worker_restarted", start), 60, "the replacement")
    failed = events(pair, "worker_failed", start)
    assert [e.cause for e in failed] == ["its batch was cancelled while it ran"]
    r = httpx.post(f"{pair.url}/v2/models/digits-classifier/infer", json=BODY, timeout=60)
    assert r.status_code == 200


def test_crash_on_the_only_instance_costs_the_client_no_error() -> None:
    """One instance (the default) and one crashed batch: the client gets its answer."""
    config = RuntimeConfig.model_validate(
        {"server": {"admin_token": TOKEN}, "workers": {"restart_backoff": "100ms"}}
    )
    with serve_in_thread(config, digits()) as server:
        admin = AdminClient(server.url, TOKEN)
        fault = admin.inject("worker:digits-classifier", "crash")

        def clear_on_crash(event: Event) -> None:
            # On the server's loop, as the crash is seen: the retry runs without the fault.
            if event.kind == "worker_failed":
                server.runtime.executor.faults.clear(fault["id"])

        server.runtime.events.subscribe(clear_on_crash)
        # The retry waits for a fresh worker (spawn and load): seconds on a busy machine.
        response = httpx.post(
            f"{server.url}/v2/models/digits-classifier/infer", json=BODY, timeout=60
        )
        assert response.status_code == 200, response.text
        assert [e.cause for e in events(server, "batch_retried")] == ["exited with code 70"]
        assert worker(server, 0).restarts == 1

        def arena_empty() -> bool:
            arena = server.runtime.executor.arena_statistics()
            return arena is not None and arena.in_use_bytes == 0

        wait_until(arena_empty, 30, "the arena to hold nothing once the response went out")


def test_a_batch_sent_as_the_only_worker_is_replaced_waits_for_the_new_one() -> None:
    """The guardian's restart_worker (or any kill) on the only instance, a batch sent at
    once: the worker is gone before its supervisor sees the exit, and the batch waits
    for the replacement instead of failing with "failed on every device it runs on"."""
    with only_instance(restart_backoff="0.1s") as one:

        async def replace_then_run() -> object:
            await one.replace()
            return await one.executor.run(one.key, [one.rows])

        outputs = one.server.call(replace_then_run())
        outputs.release()  # type: ignore[attr-defined]
        assert worker(one.server, 0).restarts == 1


def test_a_batch_waiting_for_a_replacement_ends_when_the_model_is_unloaded() -> None:
    """The only worker lost before it served (its replacement waits out the 30 s backoff),
    a batch waiting for it, the model unloaded: the batch ends with an error that says
    so, at once, not after the backoff nor never."""
    with only_instance(restart_backoff="30s") as one:

        async def unload_under_it() -> str:
            await one.replace()
            waiting = asyncio.ensure_future(one.executor.run(one.key, [one.rows]))
            await asyncio.sleep(0.5)
            assert not waiting.done()
            await one.executor.unload(one.key)
            with pytest.raises(InferenceFailed) as failed:
                await asyncio.wait_for(waiting, 10)
            return str(failed.value)

        message = one.server.call(unload_under_it())
    assert "has no instance left to run the batch" in str(message)
    assert "unloaded" in str(message)


def test_every_worker_death_counts_once_in_worker_failures() -> None:
    """Kills of an idle worker counted too, and one under load counted once, not per
    batch it took: the failures counter rises by exactly the number of kills."""
    config = RuntimeConfig.model_validate(
        {"workers": {"heartbeat_timeout": "3s", "restart_backoff": "0.1s"}}
    )
    kills = 3
    with serve_in_thread(config, digits(instance_count=1)) as server:
        before = counter_sum(server, "sordino_worker_failures")
        start = mark(server)
        for n in range(kills):
            victim = worker(server, 0)
            if n < kills - 1:
                os.kill(victim.pid, signal.SIGKILL)  # idle: no batch is lost with it
                _restarted(server, start, n + 1)
            else:
                with Load(server.url, clients=4) as load:
                    load.wait_ok(20)
                    os.kill(victim.pid, signal.SIGKILL)
                    _restarted(server, start, n + 1)
                    load.wait_ok(10)
                assert load.errors == []
        assert counter_sum(server, "sordino_worker_failures") - before == kills
        assert worker(server, 0).failures == kills


def _restarted(server: RunningServer, start: int, count: int) -> None:
    def serving() -> bool:
        restarts = events(server, "worker_restarted", start)
        return len(restarts) >= count and worker(server, 0).state == "ready"

    wait_until(serving, 60, f"restart {count}")


def _thread_niceness(pid: int) -> dict[int, int]:
    """Each thread of ``pid`` and its niceness (field 19 of ``/proc/PID/task/TID/stat``)."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        # a thread may end meanwhile
        with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/task/{tid}/stat") as stat:
            found[int(tid)] = int(stat.read().rsplit(")", 1)[1].split()[16])
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc")
def test_every_thread_of_a_worker_runs_below_the_server(pair: RunningServer) -> None:
    """``workers.nice`` (10 by default) lowers all of a worker's threads, the model's too."""
    server = os.getpriority(os.PRIO_PROCESS, 0)
    threads = _thread_niceness(worker(pair, 0).pid)
    # the main thread and the heartbeat at least; ONNX Runtime's and numpy's pools where
    # the cores give them threads
    assert len(threads) >= 2
    assert set(threads.values()) == {min(19, server + 10)}


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc")
def test_nice_zero_keeps_the_servers_priority() -> None:
    config = RuntimeConfig.model_validate({"workers": {"nice": 0}})
    with serve_in_thread(config, digits()) as server:
        threads = _thread_niceness(worker(server, 0).pid)
    assert set(threads.values()) == {os.getpriority(os.PRIO_PROCESS, 0)}


def test_a_niceness_outside_unix_range_is_refused() -> None:
    with pytest.raises(ValueError, match="nice"):
        RuntimeConfig.model_validate({"workers": {"nice": 20}})
