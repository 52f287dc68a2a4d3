"""The HTTP connection figures of a server with front-end processes (``server.frontends`` > 1).

With front ends the engine reads no client connection: each front end's connection
guard counts what it accepts, refuses and times out. :class:`ConnectionReporter` (in a
front end) sends those figures over the link when they change, at most once per
``link_frames.CONNECTIONS_EVERY_S``; :class:`ConnectionTally` (in the engine) keeps
each front end's last figures and sums them with the engine's own guard's (the
connections handed over to it) for ``sordino_http_connections*`` and
``sordino_http_timeouts_total`` (``telemetry/connection_metrics.py``):

- **open connections and clients** are summed over the live front ends and the engine
  (a client address with connections in two processes counts twice in ``clients``);
  a front end that is gone leaves the sum;
- **the limits** are the sum of the live front ends' limits: each front end applies
  ``server.max_connections`` (and ``max_connections_per_client``) on its own, so with
  N front ends running the server holds up to N × the setting. The engine's own limit
  (it only serves connections a front end accepted) is not added; with no front end
  reporting yet, the figures are the engine's own;
- **the counters** (refusals, timeouts) never go backwards: a front end that is gone
  has its last figures added to a carried total (what it counted after its last report
  is lost, at most ``CONNECTIONS_EVERY_S`` worth).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Hashable

from sordino.records import ConnectionStatistics

__all__ = ["ConnectionReporter", "ConnectionTally"]


class ConnectionTally:
    """The front ends' last connection figures, summed with the engine's own (above).

    Written on the engine's loop; :meth:`total` may be read from any thread (a scrape)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a reader never sees a gone one both ways or neither
        self._live: dict[Hashable, ConnectionStatistics] = {}
        self._carried = (0, 0, 0, 0)  # refused_total, refused_per_client, header, body

    def report(self, frontend: Hashable, stats: ConnectionStatistics) -> None:
        """Front end ``frontend`` sent its figures: they replace its last ones."""
        with self._lock:
            self._live[frontend] = stats

    def gone(self, frontend: Hashable) -> None:
        """Front end ``frontend`` is gone: its open connections leave the sum, its
        counters stay in it (carried). Safe for one that never reported."""
        with self._lock:
            last = self._live.pop(frontend, None)
            if last is not None:
                refused, per_client, header, body = self._carried
                self._carried = (
                    refused + last.refused_total,
                    per_client + last.refused_per_client,
                    header + last.header_timeouts,
                    body + last.body_timeouts,
                )

    def total(self, own: ConnectionStatistics) -> ConnectionStatistics:
        """The server's figures: the engine's ``own`` and the front ends' (above)."""
        with self._lock:
            live = list(self._live.values())
            refused, per_client, header, body = self._carried
        parts = [own, *live]
        limits = live or [own]
        return ConnectionStatistics(
            open=sum(s.open for s in parts),
            clients=sum(s.clients for s in parts),
            max_connections=sum(s.max_connections for s in limits),
            max_connections_per_client=sum(s.max_connections_per_client for s in limits),
            refused_total=refused + sum(s.refused_total for s in parts),
            refused_per_client=per_client + sum(s.refused_per_client for s in parts),
            header_timeouts=header + sum(s.header_timeouts for s in parts),
            body_timeouts=body + sum(s.body_timeouts for s in parts),
        )


class ConnectionReporter:
    """In a front end: looks at ``source`` every ``every_s`` seconds and calls ``send``
    with its figures when they differ from the last sent (at once on :meth:`start`),
    and at least every ``beat_s`` seconds even when they do not: the engine takes a
    front end it has not heard from in a while for hung (``server/frontends.py``)."""

    def __init__(
        self,
        source: Callable[[], ConnectionStatistics],
        send: Callable[[ConnectionStatistics], None],
        every_s: float,
        beat_s: float = 1.0,
    ) -> None:
        self._source = source
        self._send = send
        self._every_s = every_s
        self._beat = max(1, round(beat_s / every_s))  # looks between beats
        self._quiet = 0
        self._last: ConnectionStatistics | None = None
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Send the figures now, then whenever they change (on the running loop)."""
        self._tick()

    def _tick(self) -> None:
        stats = self._source()
        self._quiet += 1
        if stats != self._last or self._quiet >= self._beat:
            self._last, self._quiet = stats, 0
            self._send(stats)
        self._timer = asyncio.get_running_loop().call_later(self._every_s, self._tick)

    def stop(self) -> None:
        """Send nothing more."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
