"""Guarding the HTTP listener: connection limits and read timeouts.

Every connection holds a file descriptor. A client that connects and sends nothing,
trickles its headers (slow-loris) or stops halfway through a body would hold its
descriptor for as long as it likes, and enough of them lock every other client out.
:class:`ConnectionGuard` holds what the HTTP protocol (``server/http_protocol.py``)
enforces on each connection:

- a **header timeout** (``server.header_timeout``): from the connection (or the first
  byte of a later request on it) to the end of the request's headers;
- a **header size** (``server.max_header_size``): the request line and headers, at most
  that many bytes (httptools has no bound of its own: a client sending headers without
  end grew the server by 4.7 GB in the 10 s of the header timeout); larger: 431;
- a **body timeout** (``server.body_timeout``): from the end of the headers to the end
  of the body; a slow body is answered 408;
- a **budget for slow bodies**: after ``server.body_rate_grace`` a body must have come
  at ``server.body_min_rate`` bytes/s on average (Apache's ``mod_reqtimeout``
  ``MinRate``), and at most ``server.max_pending_bodies`` connections may wait between
  reads of a body at once: past that, the one waiting longest is answered 408;
- **connection limits**, in total (``server.max_connections``) and per client address
  (``server.max_connections_per_client``). Past either, a new connection is answered
  at once — 503 with ``Connection: close`` and ``Retry-After`` — and closed, without
  reaching the application; connections already open are served as before. With
  TLS a connection counts from its accept, through the handshake (``server/tls_accept.py``);
- a **monitoring reserve** (``server.monitoring_connections``): past a limit, that many
  connections more are admitted for ``GET /metrics`` and ``/v2/health/*`` only; any
  other request on one (or none within :data:`RESERVE_WAIT_S`) gets the same 503.

A refused connection lingers at most :data:`LINGER_S` (its client reads the 503),
and no more than :data:`MAX_LINGERING` linger at once: past that, a refused
connection is answered and closed at once, so refusing can never hold many descriptors.

A request may also be refused from its headers alone (:attr:`ConnectionGuard.early_shed`,
``server/early_shed.py``): its answer is written at once, its body is skipped unread,
and the connection stays open for the next request. While requests are being refused,
whole requests that arrive at a request boundary are read for that without the HTTP
parser (:func:`plain_head`).

Once the server stops (:meth:`ConnectionGuard.begin_closing`), every answer says
``Connection: close`` and its connection closes after it, so a keep-alive client
learns of the stop from an answer instead of from a close that may cross its next
request; refusals from headers stop with it (the stopping server answers each request).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import resource
import time
from collections import Counter
from collections.abc import Collection, Sequence
from typing import Literal, NamedTuple, Protocol

from sordino.protocol.encode import encode_error
from sordino.records import ConnectionStatistics
from sordino.server.malloc_trim import Trimmer

__all__ = [
    "CLOSING_GRACE_S",
    "LARGE_READ",
    "LINGER_S",
    "MAX_LINGERING",
    "RECEIVED",
    "RESERVED_DESCRIPTORS",
    "RESERVE_WAIT_S",
    "Admission",
    "ConnectionGuard",
    "Guarded",
    "Phase",
    "ShedCheck",
    "default_max_connections",
    "drained",
    "error_response",
    "monitoring",
    "plain_head",
]

log = logging.getLogger("sordino.http")

CLOSING_GRACE_S = 2.0
"""Once the server stops, how long kept-alive connections may still send a request (each
answer closing its connection) before the idle ones are closed under them."""
LINGER_S = 1.0
"""How long a refused connection stays open for its client to read the 503."""
MAX_LINGERING = 256
"""Refused connections allowed to linger at once; more are reset at once."""
RESERVED_DESCRIPTORS = 256
"""Descriptors the default ``max_connections`` leaves for everything else (workers,
gRPC, the journal, model files)."""
RESERVE_WAIT_S = 1.0
"""How long a connection admitted into the monitoring reserve may take to send its
request's headers; then it gets the 503 it would have had at once."""
_WARN_EVERY_S = 10.0
_MONITORING = (b"/metrics", b"/v2/health/")
"""Paths served on a connection of the monitoring reserve (``/metrics``, ``/v2/health/*``)."""
RECEIVED = "sordino.received"
"""ASGI scope extension: ``{"at": time.monotonic()}`` when the request's headers ended."""

Phase = Literal["header", "body"]
Scope = Literal["total", "per_client"]


class Admission(NamedTuple):
    """What :meth:`ConnectionGuard.admit` decided for a new connection."""

    kind: Literal["open", "reserve", "refused"]
    client: str
    refusal: str = ""
    """The 503's message (``reserve``: the one answered to a request it does not serve)."""
    scope: Scope = "total"


class ShedCheck(Protocol):
    """``(target, headers) -> response or None``: asked at the end of a POST's headers
    (``server/early_shed.py``)."""

    def __call__(self, target: bytes, headers: Sequence[tuple[bytes, bytes]]) -> bytes | None: ...

    def refusing(self) -> bool:
        """Whether it refused a request lately: only then are whole requests read
        without the parser (otherwise every served request would be read twice)."""
        ...


def default_max_connections() -> int:
    """The open-file limit in force less :data:`RESERVED_DESCRIPTORS` (at least 64)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(64, soft - RESERVED_DESCRIPTORS)


class ConnectionGuard:
    """The limits and timeouts of one HTTP listener, and what they did."""

    def __init__(
        self,
        *,
        max_connections: int,
        max_per_client: int,
        header_timeout: float,
        body_timeout: float,
        max_header_size: int = 64 * 1024,
        max_pending_bodies: int = 256,
        max_pending_body_size: int = 1 << 30,
        body_min_rate: float = 0.0,
        body_rate_grace: float = 10.0,
        monitoring_connections: int = 0,
    ) -> None:
        self.max_connections = max_connections
        self.max_per_client = max_per_client
        self.header_timeout = header_timeout
        self.max_header_size = max_header_size
        self.body_timeout = body_timeout
        self.max_pending_bodies = max_pending_bodies
        self.max_pending_body_size = max_pending_body_size
        self.pending_body_bytes = 0  # held of the bodies in pending_bodies (on_body)
        self.body_min_rate = body_min_rate
        self.body_rate_grace = body_rate_grace
        self.monitoring_connections = monitoring_connections
        self._open: Counter[str] = Counter()
        self._total = 0
        self._reserved = 0  # connections open in the monitoring reserve
        # Connections waiting between reads of a body, oldest first.
        self.pending_bodies: dict[Guarded, None] = {}
        self.trimmer = Trimmer()  # gives the heap back after large bodies (malloc_trim.py)
        self.lingering: set[asyncio.Transport] = set()
        self._refused_total = self._refused_per_client = 0
        self._timeouts: Counter[Phase] = Counter()
        self._warned_at = -_WARN_EVERY_S
        self._live: set[Guarded] = set()
        self._sweeping: asyncio.TimerHandle | None = None
        # Deadlines are checked by one sweep a few times per timeout, not by a timer per
        # request: arming a timer for every request cost the inference path ~10 % on W1.
        shortest = min(header_timeout, body_timeout, body_rate_grace)
        self.sweep_s = min(1.0, max(0.02, shortest / 8))
        self.early_shed: ShedCheck | None = None
        self.closing = False  # the server stops: answers close their connections

    def begin_closing(self) -> None:
        """The server stops: from now on every request's answer says ``Connection: close``
        (the answers being made on the connections open now too).

        A client between two requests on a kept-alive connection then sends its next
        request, gets its answer and the close with it, and opens no race with a close
        from the server. Refusals from headers stop too: a request refused that way is
        answered before its body is read, which a closing answer must not do.
        """
        self.closing = True
        self.early_shed = None
        for protocol in self._live:
            protocol.end_keep_alive()

    def watch(self, protocol: Guarded) -> None:
        """Check ``protocol``'s read deadline from now on (until :meth:`unwatch`)."""
        self._live.add(protocol)
        if self._sweeping is None:
            self._sweeping = protocol.loop.call_later(self.sweep_s, self._sweep, protocol.loop)

    def unwatch(self, protocol: Guarded) -> None:
        self._live.discard(protocol)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for protocol in [p for p in self._live if p.deadline is not None and now >= p.deadline]:
            protocol.expire(now)
        self._sweeping = loop.call_later(self.sweep_s, self._sweep, loop) if self._live else None

    def admit(self, client: str) -> Admission:
        """Count a new connection from ``client`` (open, or in the monitoring reserve),
        or say why it is refused; :meth:`release` forgets what this counted."""
        if self._total >= self.max_connections:
            scope: Scope = "total"
            refusal = (
                f"the server holds its limit of {self.max_connections} connections; retry "
                "later (server.max_connections)"
            )
        elif self._open[client] >= self.max_per_client:
            scope = "per_client"
            refusal = (
                f"{client} holds its limit of {self.max_per_client} open connections; reuse "
                "them or close some (server.max_connections_per_client)"
            )
        else:
            self._open[client] += 1
            self._total += 1
            return Admission("open", client)
        if self._reserved < self.monitoring_connections:
            self._reserved += 1
            return Admission("reserve", client, refusal, scope)
        self.refused(scope, client)
        return Admission("refused", client, refusal, scope)

    def refused(self, scope: Scope, client: str) -> None:
        """Count a connection refused for the limit ``scope``."""
        if scope == "total":
            self._refused_total += 1
            self._warn("the server holds %d connections (server.max_connections)", self._total)
        else:
            self._refused_per_client += 1
            self._warn(
                "%s holds %d connections (server.max_connections_per_client)",
                client,
                self._open[client],
            )

    def release(self, admission: Admission) -> None:
        """Forget a connection :meth:`admit` counted."""
        if admission.kind == "reserve":
            self._reserved -= 1
        elif admission.kind == "open":
            client = admission.client
            self._total -= 1
            self._open[client] -= 1
            if self._open[client] <= 0:
                del self._open[client]

    def too_many_bodies(self) -> bool:
        return (
            len(self.pending_bodies) > self.max_pending_bodies
            or self.pending_body_bytes > self.max_pending_body_size
        )

    def evict_bodies(self) -> None:
        """Answer 408 to the connections that have waited longest for the rest of a body
        until the pending bodies are within both of their limits."""
        while self.pending_bodies and len(self.pending_bodies) > self.max_pending_bodies:
            self.evict_oldest_body()
        while self.pending_bodies and self.pending_body_bytes > self.max_pending_body_size:
            oldest = next(iter(self.pending_bodies))
            oldest.expire(
                oldest.loop.time(),
                because=(
                    "the request body was still incomplete when the bodies still arriving "
                    f"held {self.pending_body_bytes} bytes, past {self.max_pending_body_size} "
                    "(server.max_pending_body_size); send the body with its headers, or "
                    "retry when the server is less busy"
                ),
            )

    def evict_oldest_body(self) -> None:
        """Answer 408 to the connection that has waited longest for the rest of a body."""
        oldest = next(iter(self.pending_bodies))
        oldest.expire(
            oldest.loop.time(),
            because=(
                f"the request body was still incomplete when {self.max_pending_bodies} other "
                "connections were waiting for theirs (server.max_pending_bodies); send the "
                "body with its headers"
            ),
        )

    def timed_out(self, phase: Phase, client: str) -> None:
        """Count a connection closed for reading ``phase`` too slowly."""
        self._timeouts[phase] += 1
        log.debug("closed a connection from %s: no complete request %s in time", client, phase)

    def refuse(
        self, transport: asyncio.Transport, message: str, loop: asyncio.AbstractEventLoop
    ) -> asyncio.TimerHandle | None:
        """Answer 503 on ``transport`` and let it linger :data:`LINGER_S` (the timer that
        closes it), or close it at once when :data:`MAX_LINGERING` already linger."""
        transport.write(error_response(503, message, retry_after=True))
        if len(self.lingering) >= MAX_LINGERING:
            # No room to linger: the answer is in the socket's buffer already; a client
            # that is still sending may miss it, but none is reset without one.
            transport.close()
            return None
        self.lingering.add(transport)
        if transport.can_write_eof() and not transport.is_closing():
            # The client may be gone already (reset): shutdown() then raises, which must
            # not end this callback before the linger is armed.
            with contextlib.suppress(OSError):
                transport.write_eof()
        return loop.call_later(LINGER_S, transport.close)

    def close_lingering(self) -> None:
        """Close the refused connections still lingering (at shutdown)."""
        for transport in list(self.lingering):
            transport.abort()
        self.lingering.clear()

    def statistics(self) -> ConnectionStatistics:
        return ConnectionStatistics(
            open=self._total,
            clients=len(self._open),
            max_connections=self.max_connections,
            max_connections_per_client=self.max_per_client,
            refused_total=self._refused_total,
            refused_per_client=self._refused_per_client,
            header_timeouts=self._timeouts["header"],
            body_timeouts=self._timeouts["body"],
        )

    def _warn(self, message: str, *args: object) -> None:
        # One line per burst: a flood of refusals must not become a flood of log lines.
        now = time.monotonic()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning("refusing new HTTP connections: " + message, *args)


class Guarded(Protocol):
    """A connection whose read deadline the guard's sweep checks."""

    loop: asyncio.AbstractEventLoop
    deadline: float | None
    """Loop time the phase being read times out at (None: nothing being read)."""

    def expire(self, now: float, *, because: str | None = None) -> None:
        """The phase being read ran past its deadline (``because``: it must end now)."""
        ...

    def end_keep_alive(self) -> None:
        """The server stops: the last answer due on the connection closes it."""
        ...


async def drained(connections: Collection[object], within_s: float) -> None:
    """Return once ``connections`` (a live set the server keeps) is empty, or after
    ``within_s`` seconds, whichever comes first (looked at every 10 ms)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while connections:
        if loop.time() >= deadline:
            return
        await asyncio.sleep(0.01)


def monitoring(target: bytes) -> bool:
    """Whether ``target`` is one the monitoring reserve serves."""
    path = target.split(b"?", 1)[0]
    return path == _MONITORING[0] or path.startswith(_MONITORING[1])


LARGE_READ = 16 * 1024
"""Body reads from this size on count towards the next ``malloc_trim`` (small bodies
come from Python's own allocator and do not leave the heap holding free pages)."""

_REASONS = {
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}
_AS_PARSER_DOES = frozenset({b"transfer-encoding", b"expect", b"upgrade", b"connection"})
"""Headers that change how a request is framed or answered: the parser handles those."""


def plain_head(data: bytes, end: int) -> tuple[bytes, list[tuple[bytes, bytes]], int] | None:
    """``(target, headers, content length)`` of the request whose head is ``data[:end]``,
    if it is a plain keep-alive HTTP/1.1 POST with a ``Content-Length``; else None.

    Under overload a client sends the same head over and over: the last heads read are
    kept (about 2 µs of a refusal's 40), and the headers list must not be changed."""
    if end > _CACHED_HEAD:
        return _read_head.__wrapped__(data[:end])
    return _read_head(data[:end])


_CACHED_HEAD = 4096
"""Longest head kept by :func:`_read_head`'s cache: a client's huge heads must not be
what 256 entries hold (256 x 1 MB heads were 256 MB of cache)."""


@functools.lru_cache(maxsize=256)
def _read_head(head: bytes) -> tuple[bytes, list[tuple[bytes, bytes]], int] | None:
    lines = head.split(b"\r\n")
    request = lines[0].split(b" ")
    if len(request) != 3 or request[2] != b"HTTP/1.1":
        return None
    length = -1
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name[-1:].isspace() or name[:1].isspace():
            return None
        name = name.lower()
        value = value.strip()
        if name == b"content-length":
            if length >= 0 or not value.isdigit() or len(value) > 12:
                return None
            length = int(value)
        elif name in _AS_PARSER_DOES:
            return None
        headers.append((name, value))
    return (request[1], headers, length) if length >= 0 else None


def error_response(status: int, message: str, *, retry_after: bool = False) -> bytes:
    body = encode_error(message)
    head = [
        b"HTTP/1.1 %d %s" % (status, _REASONS[status]),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
    ]
    if retry_after:
        head.append(b"retry-after: 1")
    return b"\r\n".join(head) + b"\r\n\r\n" + body
