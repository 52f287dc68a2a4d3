"""Waiting in tests for a state to be reached, never for a length of time.

A test that sleeps "long enough" is slow on a quiet machine and flaky on a loaded
one. These helpers poll the condition instead, with bounds far above what a loaded
2-core CI machine needs, and fail saying what never happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sordino.testing import RunningServer

POLL_S = 0.05


def wait_for(condition: Callable[[], object], message: str, timeout: float = 30.0) -> None:
    """Poll ``condition`` every 50 ms until it is true; fail after ``timeout`` seconds.

    ``message`` names what was awaited ("the breaker to open").
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {message}")
        time.sleep(POLL_S)


def wait_for_closed_second(server: RunningServer, timeout: float = 30.0) -> int:
    """Wait until the telemetry ticker has closed the wall-clock second running now.

    Everything that finished before the call is then in the per-second rows, which
    ``/metrics``, the telemetry snapshot (monitor, dashboard) and the journal are fed
    from. Return that second.
    """
    second = int(time.time())
    wait_for(
        lambda: (server.runtime.telemetry.series.statistics().last_closed or 0) >= second,
        f"the telemetry ticker to close second {second}",
        timeout,
    )
    return second
