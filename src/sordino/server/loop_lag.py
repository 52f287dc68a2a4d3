"""Seeing a saturated server: how late its event loop runs, and how much to admit.

The scheduler sheds by the work queued for a model (``ModelScheduler.shed_unread``),
but when the HTTP path itself is the bottleneck — reading, parsing and answering
requests on one core — the model's queue stays short while requests wait in socket
buffers and in the event loop's ready queue, unseen, until every one of them is late
(receive livelock: at 3× capacity goodput fell to 6 % of capacity). Those waits show
as the event loop running late: a timer due every ``tick_s`` fires late by about the
time a request now waits to be read.

:class:`LoopLag` follows CoDel (Nichols & Jacobson, 2012): a standing queue is one
whose *smallest* delay over an interval stays above a target — a burst that drains
within the interval is left alone. Each interval whose smallest lag is above
``target_s`` halves the share of lower-priority requests admitted — or cuts it in
proportion, ``target / lag``, when the lag stands more than twice the target, so that
a surge far past capacity is met within an interval or two rather than seven (as
Envoy's adaptive concurrency scales its limit by the latency's gradient); each interval
below it adds ``1/10`` back, or ``1/50`` if the loop's thread was on CPU for most of it
(AIMD, as TCP, so the admitted rate settles near what the core can serve).

Shedding is by criticality, as in Google SRE's load shedding: the highest priority
level is touched only once the lower ones are down to their floor (``_MIN_SHARE``) and
the loop is still late — when the highest priority's own requests, with the refusals
of all the others, are more than the core can read and answer. Past that point,
refusing none of them lets the backlog grow until every request is late (at 3× the
digits model's capacity, with 20 % high priority, 1 % of them were served); so then a
share of the highest priority (``top_share``) is admitted, by the same AIMD, and
nothing below it. On the way back the highest priority recovers first.

The admitted share is applied without randomness: each request adds the share to a
credit and is admitted when the credit reaches one, so exactly that share gets in.
"""

from __future__ import annotations

import asyncio
import math
import time

__all__ = ["LoopLag"]

_DECREASE = 0.5
_INCREASE = 0.1
_BUSY_INCREASE = 0.02
_BUSY = 0.8
"""A loop thread that used this share of an interval's time on CPU was busy in it."""
_MIN_SHARE = 0.01
"""The floor of the lower priorities' share while the highest is admitted whole."""
_MIN_TOP_SHARE = 0.01
"""Some highest-priority requests always get in, however late the loop."""


class LoopLag:
    """Event-loop lag, CoDel-style, turned into a share of lower priorities to admit."""

    def __init__(
        self,
        target_s: float,
        *,
        interval_s: float = 0.1,
        tick_s: float = 0.01,
        idle_s: float = 1.0,
    ) -> None:
        if target_s <= 0:
            raise ValueError("target_s must be positive")
        self.target_s = target_s
        self.interval_s = interval_s
        self.tick_s = tick_s
        self.idle_s = idle_s
        """With no request for this long the ticks stop (and the share resets)."""
        self.share = 1.0
        """Share of lower-priority requests admitted now (1: all of them); none while
        ``top_share`` is below 1."""
        self.top_share = 1.0
        """Share of the highest priority admitted now (1: all; cut only once ``share``
        is at its floor)."""
        self.last_lag_s = 0.0
        self._window_end: float | None = None
        self._window_min = math.inf
        self._window_cpu: float | None = None
        self._credit = 0.0
        self._top_credit = 0.0
        self._last_request = -math.inf
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the decision (pure: tests drive it with their own times) ----------------------

    def observe(self, now: float, lag_s: float, cpu_s: float | None = None) -> None:
        """Take one measurement: the loop ran ``lag_s`` late at ``now``; ``cpu_s`` is
        its thread's CPU time then (None: unknown, taken as busy)."""
        self.last_lag_s = lag_s
        self._window_min = min(self._window_min, lag_s)
        if self._window_end is None:
            self._window_end = now + self.interval_s
            self._window_cpu = cpu_s
            return
        if now < self._window_end:
            return
        if self._window_min > self.target_s:
            # Half, or in proportion to how late it stands if that is less: a loop
            # 300 ms late at a 10 ms target is cut to a thirtieth at once.
            factor = min(_DECREASE, self.target_s / self._window_min)
            if self.share > _MIN_SHARE:
                self.share = max(_MIN_SHARE, self.share * factor)
            else:
                self.top_share = max(_MIN_TOP_SHARE, self.top_share * factor)
        else:
            # On time: back by a tenth if the loop's thread had time to spare, by a
            # fiftieth if it was busy all the same (a core spent reading and refusing
            # is on time only just; a tenth at a time overshot it again and again).
            began = self._window_end - self.interval_s
            spare = (
                cpu_s is not None
                and self._window_cpu is not None
                and cpu_s - self._window_cpu < _BUSY * (now - began)
            )
            step = _INCREASE if spare else _BUSY_INCREASE
            if self.top_share < 1.0:
                self.top_share = min(1.0, self.top_share + step)
            else:
                self.share = min(1.0, self.share + step)
        self._window_end = now + self.interval_s
        self._window_min = math.inf
        self._window_cpu = cpu_s

    def admit(self) -> bool:
        """Whether to admit the next lower-priority request (exactly ``share`` of them,
        and none while the highest priority is cut)."""
        if self.top_share < 1.0:
            return False
        admitted, self._credit = _by_credit(self.share, self._credit)
        return admitted

    def admit_top(self) -> bool:
        """Whether to admit the next highest-priority request (exactly ``top_share``)."""
        admitted, self._top_credit = _by_credit(self.top_share, self._top_credit)
        return admitted

    def reset(self) -> None:
        """Forget the past: all admitted, no window open."""
        self.share = self.top_share = 1.0
        self.last_lag_s = 0.0
        self._window_end = None
        self._window_min = math.inf
        self._credit = self._top_credit = 0.0

    # -- measuring on a running loop ---------------------------------------------------

    def request_seen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Note a request on ``loop``; start measuring if not already."""
        self._last_request = loop.time()
        if self._timer is None:
            self._loop = loop
            self._timer = loop.call_later(self.tick_s, self._tick, loop.time() + self.tick_s)

    def _tick(self, due: float) -> None:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        self.observe(now, max(0.0, now - due), time.thread_time())
        if now - self._last_request > self.idle_s:
            self._timer = None
            self.reset()
            return
        self._timer = loop.call_later(self.tick_s, self._tick, now + self.tick_s)

    def close(self) -> None:
        """Stop measuring."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _by_credit(share: float, credit: float) -> tuple[bool, float]:
    """Admit one more of a stream of which ``share`` is admitted: ``(admitted, credit)``."""
    if share >= 1.0:
        return True, credit
    credit += share
    if credit >= 1.0:
        return True, credit - 1.0
    return False, credit
