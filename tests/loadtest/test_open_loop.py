"""The open-loop sender against a real sordino server: rate accuracy and a planted stall."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from sordino.config import load_config
from sordino.control.client import AdminClient
from sordino.loadtest.profiles import load_profile
from sordino.loadtest.results import Recorder
from sordino.loadtest.run import execute, prepare
from sordino.loadtest.sender import Progress, run_closed_loop
from sordino.models.repository import builtin_sources
from sordino.testing import RunningServer, serve_in_thread

TOKEN = "stress-test-token"
STALL_S = 1.0


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    config = load_config(None, {"server.admin_token": TOKEN})
    digits = [s for s in builtin_sources() if s.name == "digits-classifier"]
    with serve_in_thread(config, digits) as running:
        yield running


def _stall(server: RunningServer) -> None:
    """Every batch of the model that starts in the next second takes a second longer."""
    AdminClient(server.url, TOKEN).inject(
        "worker:digits-classifier", "latency", latency=f"{STALL_S}s", duration=f"{STALL_S}s"
    )


@pytest.mark.timeout(120)
def test_achieved_rate_keeps_the_target_over_8_s(
    server: RunningServer,
) -> None:
    """150 requests/s for 8 s, evenly spaced: the client keeps the schedule (bounds
    generous enough for a loaded 2-core machine; bench/ measures the accuracy)."""
    steady = load_profile("steady").scaled(duration=8, peak_rate=150)
    profile = steady.model_copy(update={"arrivals": "constant"})
    result = execute(prepare(server.url, "digits-classifier", profile))
    assert result.intended_mean == pytest.approx(150, rel=0.001)
    assert result.achieved_mean == pytest.approx(150, rel=0.1), result.achieved_mean
    assert result.total.count + result.total.errors == result.send.sent == 1200
    assert result.total.errors == 0 and result.server_observed
    # Per second too: the typical second is on schedule, and none is far off it (a
    # scheduler hiccup on a loaded machine moves a few requests to the next second).
    inner = sorted(result.sent_rate[1:-1])
    assert abs(inner[len(inner) // 2] - 150) <= 15, result.sent_rate
    assert inner[0] > 75 and inner[-1] < 225, result.sent_rate


@pytest.mark.timeout(120)
def test_a_one_second_stall_shows_in_open_loop_p99_and_hides_from_a_closed_loop(
    server: RunningServer,
) -> None:
    """The same stall, measured both ways: only the open loop's p99 sees it."""
    steady = load_profile("steady").scaled(duration=4.5, peak_rate=100)
    plan = prepare(
        server.url, "digits-classifier", steady.model_copy(update={"arrivals": "constant"})
    )
    injected = threading.Event()

    def at_one_and_a_half_seconds(progress: Progress) -> None:
        if progress.elapsed_s >= 1.5 and not injected.is_set():
            injected.set()
            threading.Thread(target=_stall, args=(server,)).start()

    open_loop = execute(plan, progress=at_one_and_a_half_seconds)
    assert injected.is_set()
    assert open_loop.total.errors == 0
    assert open_loop.total.max_ms is not None and open_loop.total.max_ms >= 900
    # About a second of arrivals (over a fifth of the run) waited behind the stall.
    assert open_loop.total.p99_ms is not None and open_loop.total.p99_ms >= 500
    assert open_loop.total.p90_ms is not None and open_loop.total.p90_ms >= 100

    recorder = Recorder(window_s=1.0, windows=6)

    async def closed() -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(1.5, lambda: loop.run_in_executor(None, _stall, server))
        await run_closed_loop(server.url, plan.classes[0], recorder, duration_s=6.0)

    asyncio.run(closed())
    hidden = recorder.summary()
    assert hidden.max_ms is not None and hidden.max_ms >= 900  # the one request that waited
    assert hidden.count > 300  # it kept sending once the stall was over...
    assert hidden.p99_ms is not None and hidden.p99_ms < 300  # ...so its p99 never saw it
