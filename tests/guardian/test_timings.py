"""network_latency and frame_delay: measured per second, read by the guardian's triggers."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import httpx
import numpy as np

from sordino.config import RuntimeConfig
from sordino.config.self_healing import SelfHealingConfig
from sordino.events import EventSink
from sordino.guardian import Guardian
from sordino.inference import ModelKey
from sordino.memory.arena import Arena
from sordino.memory.refs import TensorsBuilder
from sordino.records import QueueSettings, RequestDone
from sordino.scheduling.batcher import BatchPolicy
from sordino.scheduling.modes import build_controller
from sordino.scheduling.scheduler import ModelScheduler
from sordino.telemetry.timings import TimingSeries
from sordino.testing import ScriptedExecutor, VirtualClock, serve_in_thread
from sordino.testing.guardian import RecordingActions, ScriptedSeries
from tests.execution.load import BODY, digits
from tests.waiting import wait_for

KEY = ModelKey("m", "1")


async def test_a_late_request_reports_how_late_it_was() -> None:
    """A request with a 300 ms deadline that takes 1 s ends 0.7 s late; frame_delay says so."""
    clock = VirtualClock(start=100.0)
    timings = TimingSeries(wall=clock.now)
    timings.enabled = True
    arena = Arena(1 << 16)
    executor = ScriptedExecutor(clock, latency=lambda rows: 1.0, fn=lambda b: b, arena=arena)
    scheduler = ModelScheduler(
        KEY,
        batched=True,
        executor=executor,
        controller=build_controller("manual", BatchPolicy(max_batch=1), slo_s=0.1),
        settings=QueueSettings(),
        clock=clock,
        observers=(timings,),
    )
    scheduler.start()
    builder = TensorsBuilder(arena)
    builder.put("x", np.zeros((1, 1), dtype=np.float32))
    request = scheduler.submit(builder.finish(), priority=2, timeout_s=0.3)
    reading = asyncio.ensure_future(_drain(scheduler, request))
    await clock.advance(2.0)
    await reading
    await scheduler.close()
    arena.close()
    ((second, late),) = timings.recent("frame_delay")[KEY]
    assert second == 101 and abs(late - 0.7) < 1e-6


async def _drain(scheduler: ModelScheduler, request: Any) -> None:
    async for step in scheduler.responses(request):
        step.outputs.release()


async def test_frame_delay_over_16ms_skips_non_critical() -> None:
    """The guardian reads frame_delay from the timings: over 16 ms for the window → act."""
    clock = VirtualClock(start=0.0)
    series, timings = ScriptedSeries(), TimingSeries(wall=clock.now)
    timings.enabled = True
    actions = RecordingActions(clock.now)
    config = SelfHealingConfig.model_validate(
        {"triggers": [{"metric": "frame_delay", "threshold": "16ms", "window": "2s",
                       "action": "skip_non_critical"}]}
    )  # fmt: skip
    guardian = Guardian(
        config,
        series=series,
        make_action=actions,
        events=EventSink(),
        clock=clock,
        wall=clock.now,
        timings=timings.recent,
    )
    for t in range(4):
        timings.request_done(RequestDone(KEY, "success", "ok", 2, 0, 0.05, 0.05, 0.04))
        series.add(t, "m", requests=1)
        await clock.advance(1.0)
        guardian.evaluate()
        await clock.settle()
    assert [a for _, a in actions.applied] == ["skip_non_critical"]
    assert guardian.statistics().triggers[0].value_text == "40 ms"


def test_slow_bodies_turn_on_the_result_cache() -> None:
    """Bodies trickling in over 600 ms → network_latency > 500 ms → identical requests
    are answered from the result cache while it holds."""
    config = RuntimeConfig.model_validate(
        {"self_healing": {"enabled": True, "triggers": [
            {"metric": "network_latency", "threshold": "500ms", "window": "2s",
             "cooldown": "30s", "action": "cache_recent_results"}]}}
    )  # fmt: skip
    body = httpx.Request("POST", "http://x", json=BODY).content
    with serve_in_thread(config, digits()) as server:
        cache = server.runtime.result_cache
        stop = time.monotonic() + 60
        while not cache.active("digits-classifier") and time.monotonic() < stop:
            _slow_post(server.port, body, pause_s=0.6)
        assert cache.active("digits-classifier"), "the cache was not turned on"
        with httpx.Client(base_url=server.url) as client:
            first = client.post("/v2/models/digits-classifier/infer", content=body)
            second = client.post("/v2/models/digits-classifier/infer", content=body)
        assert first.status_code == second.status_code == 200
        assert first.json() == second.json()
        wait_for(lambda: cache.hits >= 1, "a cache hit", 10)


def _slow_post(port: int, body: bytes, pause_s: float) -> None:
    head = (
        f"POST /v2/models/digits-classifier/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + body[:10])
        time.sleep(pause_s)  # the client's slow network, not a wait for the server
        sock.sendall(body[10:])
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
