"""A device's circuit breaker: closed, open, half-open, on the runtime's clock.

- **closed**: batches run on the device; each outcome enters a sliding window. When
  the window holds at least ``min_requests`` batches and the threshold holds (for
  example ``error_rate>5% for 30s``), the breaker opens.
- **open**: the device gets no traffic (it goes down the fallback chain) until
  ``cooldown`` has passed; then the breaker turns half-open.
- **half-open**: one probe batch at a time runs on the device. ``probes`` successes
  in a row close the breaker (with a fresh window); a failure opens it again.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from sordino.clock import Clock
from sordino.config.threshold import Threshold
from sordino.records import BreakerState, BreakerStatistics

__all__ = ["CircuitBreaker"]


StateListener = Callable[["CircuitBreaker", BreakerState, BreakerState, str], None]


class CircuitBreaker:
    """Decides whether a device may take the next batch."""

    def __init__(
        self,
        name: str,
        threshold: Threshold,
        *,
        clock: Clock,
        min_requests: int = 10,
        cooldown_s: float = 5.0,
        probes: int = 3,
        on_change: StateListener | None = None,
    ) -> None:
        self.name = name
        self.threshold = threshold
        self._clock = clock
        self._min_requests = min_requests
        self._cooldown = cooldown_s
        self._probes = probes
        self._on_change = on_change
        self._window: deque[tuple[float, bool, float]] = deque()
        self._state: BreakerState = "closed"
        self._since = clock.now()
        self._probes_in_flight = 0
        self._probe_successes = 0
        self._opened = self._closed = 0

    @property
    def state(self) -> BreakerState:
        """The current state; an open breaker past its cooldown reads as half-open."""
        if self._state == "open" and self._clock.now() >= self._since + self._cooldown:
            self._move("half_open", f"cooldown of {self._cooldown:g} s passed")
        return self._state

    def allows(self) -> bool:
        """True when the device may take a batch now (closed, or a free probe slot)."""
        state = self.state
        return state == "closed" or (state == "half_open" and self._probes_in_flight == 0)

    def begin(self) -> bool:
        """Note that a batch starts on the device; return True if it is a probe."""
        if self.state == "half_open":
            self._probes_in_flight += 1
            return True
        return False

    def record(self, ok: bool, latency_s: float, *, probe: bool, cause: str = "") -> None:
        """Record a batch's outcome; may open or close the breaker."""
        now = self._clock.now()
        if probe:
            self._probes_in_flight = max(0, self._probes_in_flight - 1)
            if self._state != "half_open":
                return
            if not ok:
                self._move("open", f"probe failed: {cause}" if cause else "probe failed")
                return
            self._probe_successes += 1
            if self._probe_successes >= self._probes:
                self._window.clear()
                self._move("closed", f"{self._probe_successes} probe batches succeeded")
            return
        self._window.append((now, ok, latency_s))
        self._prune(now)
        if self._state == "closed":
            measured = self._measure()
            if measured is not None and self.threshold.holds(measured):
                shown = (
                    f"{measured:.0%}"
                    if self.threshold.metric == "error_rate"
                    else f"{measured:g} s"
                )
                self._move(
                    "open",
                    f"{self.threshold.metric} {shown} over {len(self._window)} batches crossed "
                    f"'{self.threshold}'" + (f"; last error: {cause}" if cause else ""),
                )

    def trip(self, cause: str) -> None:
        """Open now (the guardian's switch_device); half-open probes follow the cooldown."""
        self._probes_in_flight = 0
        self._probe_successes = 0
        self._move("open", cause)

    def reset(self, cause: str) -> None:
        """Close now, forgetting the window (the guardian undoing its switch_device)."""
        self._window.clear()
        self._probes_in_flight = 0
        self._probe_successes = 0
        self._move("closed", cause)

    def statistics(self) -> BreakerStatistics:
        state = self.state
        self._prune(self._clock.now())
        failures = sum(1 for _, ok, _ in self._window if not ok)
        total = len(self._window)
        return BreakerStatistics(
            name=self.name,
            state=state,
            window_requests=total,
            window_failures=failures,
            error_rate=failures / total if total else 0.0,
            opened=self._opened,
            closed=self._closed,
            probes_in_flight=self._probes_in_flight,
            probe_successes=self._probe_successes,
            since=self._since,
        )

    # -- internals -------------------------------------------------------------------

    def _prune(self, now: float) -> None:
        horizon = now - self.threshold.window_s
        while self._window and self._window[0][0] < horizon:
            self._window.popleft()

    def _measure(self) -> float | None:
        if len(self._window) < self._min_requests:
            return None
        quantile = self.threshold.quantile
        if quantile is None:
            return sum(1 for _, ok, _ in self._window if not ok) / len(self._window)
        latencies = sorted(latency for _, ok, latency in self._window if ok)
        if not latencies:
            return math.inf
        return latencies[min(len(latencies) - 1, math.ceil(quantile * len(latencies)) - 1)]

    def _move(self, state: BreakerState, cause: str) -> None:
        before = self._state
        if state == before:
            return
        self._state = state
        self._since = self._clock.now()
        self._probe_successes = 0
        if state == "open":
            self._opened += 1
        elif state == "closed":
            self._closed += 1
        if self._on_change is not None:
            self._on_change(self, before, state, cause)
