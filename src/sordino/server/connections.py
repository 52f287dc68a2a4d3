"""Guarding the HTTP listener: connection limits and read timeouts.

Every connection holds a file descriptor. uvicorn times out only an idle keep-alive
connection *after* a response; a client that connects and sends nothing, trickles
its headers (slow-loris) or stops halfway through a body holds its descriptor for as
long as it likes, and enough of them lock every other client out. This module adds,
on uvicorn's httptools protocol:

- a **header timeout** (``server.header_timeout``): from the connection (or the first
  byte of a later request on it) to the end of the request's headers;
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
  TLS a connection counts from its accept, through the handshake;
- a **monitoring reserve** (``server.monitoring_connections``): past a limit, that many
  connections more are admitted for ``GET /metrics`` and ``/v2/health/*`` only; any
  other request on one (or none within :data:`RESERVE_WAIT_S`) gets the same 503.

A refused connection lingers at most :data:`LINGER_S` (its client reads the 503),
and no more than :data:`MAX_LINGERING` linger at once: past that, a refused
connection is answered and closed at once, so refusing can never hold many descriptors.

A request may also be refused from its headers alone (:attr:`ConnectionGuard.early_shed`,
``server/early_shed.py``): its answer is written at once, its body is skipped unread,
no ASGI task is made, and the connection stays open for the next request. While
requests are being refused, whole requests that arrive at a request boundary are
read for that without the HTTP parser (:meth:`_GuardedProtocol._refuse_whole`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import resource
import ssl
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple, Protocol

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from sordino.protocol.codec import encode_error
from sordino.records import ConnectionStatistics
from sordino.server.malloc_trim import Trimmer

__all__ = [
    "LINGER_S",
    "MAX_LINGERING",
    "RECEIVED",
    "RESERVED_DESCRIPTORS",
    "RESERVE_WAIT_S",
    "ConnectionGuard",
    "default_max_connections",
    "guarded_protocol",
    "tls_protocol",
]

log = logging.getLogger("sordino.http")

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
        max_pending_bodies: int = 256,
        body_min_rate: float = 0.0,
        body_rate_grace: float = 10.0,
        monitoring_connections: int = 0,
    ) -> None:
        self.max_connections = max_connections
        self.max_per_client = max_per_client
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.max_pending_bodies = max_pending_bodies
        self.body_min_rate = body_min_rate
        self.body_rate_grace = body_rate_grace
        self.monitoring_connections = monitoring_connections
        self._open: Counter[str] = Counter()
        self._total = 0
        self._reserved = 0  # connections open in the monitoring reserve
        # Connections waiting between reads of a body, oldest first.
        self.pending_bodies: dict[_GuardedProtocol, None] = {}
        self.trimmer = Trimmer()  # gives the heap back after large bodies (malloc_trim.py)
        self.lingering: set[asyncio.Transport] = set()
        self._refused_total = self._refused_per_client = 0
        self._timeouts: Counter[Phase] = Counter()
        self._warned_at = -_WARN_EVERY_S
        self._live: set[_GuardedProtocol] = set()
        self._sweeping: asyncio.TimerHandle | None = None
        # Deadlines are checked by one sweep a few times per timeout, not by a timer per
        # request: arming a timer for every request cost the inference path ~10 % on W1.
        shortest = min(header_timeout, body_timeout, body_rate_grace)
        self.sweep_s = min(1.0, max(0.02, shortest / 8))
        self.early_shed: ShedCheck | None = None

    def watch(self, protocol: _GuardedProtocol) -> None:
        """Check ``protocol``'s read deadline from now on (until :meth:`unwatch`)."""
        self._live.add(protocol)
        if self._sweeping is None:
            self._sweeping = protocol.loop.call_later(self.sweep_s, self._sweep, protocol.loop)

    def unwatch(self, protocol: _GuardedProtocol) -> None:
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
        return len(self.pending_bodies) > self.max_pending_bodies

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


def tls_protocol(
    make: Callable[[], asyncio.Protocol],
    guard: ConnectionGuard,
    context: ssl.SSLContext,
    handshake_timeout: float,
) -> Callable[[], asyncio.Protocol]:
    """A protocol factory for a plain listening socket that serves TLS: each connection
    is admitted (counted against the limits) when it is accepted, before its handshake,
    which must end within ``handshake_timeout``; then ``make()``'s protocol (from
    :func:`guarded_protocol`) serves it. Pending handshakes hold descriptors too."""
    return lambda: _TlsAccept(make, guard, context, handshake_timeout)


class _TlsAccept(asyncio.Protocol):
    """A TCP connection of a TLS listener until its handshake is done."""

    def __init__(
        self,
        make: Callable[[], asyncio.Protocol],
        guard: ConnectionGuard,
        context: ssl.SSLContext,
        handshake_timeout: float,
    ) -> None:
        self.make = make
        self.guard = guard
        self.context = context
        self.handshake_timeout = handshake_timeout
        self.protocol: _GuardedProtocol | None = None
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # the ClientHello is for the TLS layer start_tls makes
        admission = self.guard.admit(_client(transport))
        if admission.kind == "refused" and len(self.guard.lingering) >= MAX_LINGERING:
            transport.abort()  # no room left even to say 503 over TLS
            return
        protocol = self.make()
        assert isinstance(protocol, _GuardedProtocol)
        protocol.admission = admission
        if admission.kind == "refused":
            self.guard.lingering.add(transport)  # its handshake, then its 503, hold it
        self.protocol = protocol
        self.task = asyncio.get_running_loop().create_task(self._handshake(transport, protocol))

    async def _handshake(self, transport: asyncio.Transport, protocol: _GuardedProtocol) -> None:
        loop = asyncio.get_running_loop()
        try:
            secured = await loop.start_tls(
                transport,
                protocol,
                self.context,
                server_side=True,
                ssl_handshake_timeout=self.handshake_timeout,
            )
        except Exception as exc:  # any failed handshake just ends the connection
            # Its traceback holds asyncio's handshake frames (the TLS objects, this
            # protocol) in a cycle with the waiter that holds it: broken, they go at once.
            exc.__traceback__ = exc.__context__ = None
            transport.abort()
            protocol.forget()
            protocol.parser = None  # type: ignore[assignment]  # a cycle of bound methods
            return
        finally:
            self.guard.lingering.discard(transport)
            self.task = self.protocol = None  # no cycle through this coroutine's frame
        if secured is None or secured.is_closing():
            protocol.forget()
            return
        protocol.connection_made(secured)

    def connection_lost(self, exc: Exception | None) -> None:
        # Lost before start_tls took the transport over: nothing else will release it.
        if self.protocol is not None and self.task is not None and not self.task.done():
            self.task.cancel()
            self.protocol.forget()


def _client(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"


def guarded_protocol(guard: ConnectionGuard) -> type[HttpToolsProtocol]:
    """The httptools protocol class for uvicorn's ``Config(http=...)``, bound to ``guard``."""

    class Bound(_GuardedProtocol):
        pass

    Bound.guard = guard
    return Bound


class _GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits and timeouts of a :class:`ConnectionGuard`."""

    guard: ConnectionGuard

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.admission: Admission | None = None  # set at accept on a TLS listener
        self._address = ""
        self._admitted = False
        self._made = False
        self._early: list[bytes] = []  # TLS data that came before connection_made
        self._refused_late = False  # a reserve connection answered 503: reads are dropped
        self._body_began = 0.0
        self._body_bytes = 0
        self._phase: Phase | None = None
        self._timer: asyncio.TimerHandle | None = None  # a refused connection's linger
        self.deadline: float | None = None  # when the phase being read times out
        self._request_bytes = False  # some of the current request's headers arrived
        self._shedding = False  # the current request was refused from its headers
        self._asked = False  # the request the parser reads next was admitted unparsed

    # -- the connection --------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._made = True
        if self.admission is None:  # plain TCP; a TLS connection was admitted at accept
            self.admission = self.guard.admit(_client(transport))
        admission = self.admission
        self._address = admission.client
        if admission.kind == "refused":
            self.transport = transport
            self._refuse(transport, admission.refusal)
            return
        self._admitted = True
        super().connection_made(transport)
        self.guard.watch(self)
        self._arm("header")
        if admission.kind == "reserve":
            self._timer = self.loop.call_later(RESERVE_WAIT_S, self._refuse_reserved)
        early, self._early = self._early, []
        for data in early:
            self.data_received(data)

    def forget(self) -> None:
        """Release what :meth:`ConnectionGuard.admit` counted for this connection (once)."""
        if self.admission is not None:
            self.guard.release(self.admission)
            self.admission = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.guard.unwatch(self)
        if self._timer is not None:
            self._timer.cancel()
        self.forget()
        if not self._made:
            self.parser = None  # type: ignore[assignment]  # see below
            return  # a TLS handshake that failed
        self.guard.lingering.discard(self.transport)
        if not self._admitted:
            # The parser holds this protocol's bound methods: a refused connection left
            # that cycle (and its transport) for the cyclic GC, hundreds under pressure.
            self.parser = None  # type: ignore[assignment]
            return
        self._admitted = False
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._made:
            self._early.append(data)  # decrypted before start_tls returned
            return
        if not self._admitted or self._refused_late:
            return  # a refused connection: its request is not read
        shed = self.guard.early_shed
        if (
            shed is not None
            and data[:5] == b"POST "
            and shed.refusing()
            and (self._phase is None or (self._phase == "header" and not self._request_bytes))
            and (self.cycle is None or self.cycle.response_complete)
            and not self.pipeline
            and not self._shedding
        ):
            data = self._refuse_whole(data, shed)
            if not data:
                return
        if self._phase == "header":
            self._request_bytes = True
        super().data_received(data)
        if self._phase == "body" and self.guard.too_many_bodies():
            self.guard.evict_oldest_body()

    def _refuse_whole(self, data: bytes, shed: ShedCheck) -> bytes:
        """Refuse the whole requests ``data`` starts with, unparsed; return the rest.

        The fast path of a refusal from the headers: at a boundary between requests,
        each complete request in ``data`` (headers and its whole ``Content-Length``
        body) that :attr:`ConnectionGuard.early_shed` refuses is answered at once,
        without the HTTP parser's callbacks — a tenth to a fifth of a refusal's CPU
        under overload (docs/benchmarks.md, "Overload, third pass"). Tried only while
        requests are being refused (:meth:`ShedCheck.refusing`). Anything else —
        a request it would serve, an incomplete one, chunked, ``Expect``, not plainly
        keep-alive HTTP/1.1, or a header it cannot read — stops the fast path, and the
        parser takes the rest from that request on, as before.
        """
        refused = False
        while data[:5] == b"POST " and not self.transport.is_closing():
            end = data.find(b"\r\n\r\n")
            head = _plain_head(data, end) if end > 0 else None
            if head is None:
                break
            target, headers, length = head
            following = end + 4 + length
            if following > len(data):
                break  # the body is not all here: the parser reads it
            response = shed(target, headers)
            if response is None:
                # Admitted: the parser reads it next, and must not ask again (a share
                # admitted by credit would be asked twice, and admitted squared).
                self._asked = True
                break
            if not refused:
                self._unset_keepalive_if_required()
                refused = True
            self.transport.write(response)
            self.server_state.total_requests += 1
            data = data[following:]
        if refused:
            self._disarm()  # between requests, as after any answer
            if not data:  # idle now: the keep-alive timeout runs, as after any answer
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler
                )
        return data

    # -- parser callbacks ------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # A request that follows a refusal in the same read: the idle timer the refusal
        # armed (on_response_complete) must not close the connection under it.
        self._unset_keepalive_if_required()
        if self._phase is None:  # a later request on a kept-alive connection
            self._arm("header")
        self._request_bytes = True

    def on_headers_complete(self) -> None:
        self._disarm()
        if self.admission is not None and self.admission.kind == "reserve":
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self.parser.get_method() not in (b"GET", b"HEAD") or not _monitoring(self.url):
                self._refuse_reserved()
                return
        shed = self.guard.early_shed
        asked, self._asked = self._asked, False
        if (
            shed is not None
            and not asked
            and (self.cycle is None or self.cycle.response_complete)
            and not self.pipeline
            and self.parser.get_method() == b"POST"
        ):
            response = shed(self.url, self.headers)
            if response is not None:
                self._shed(response)
                return
        # When the request was read: its deadline counts from here (fast_infer.py).
        self.scope["extensions"] = {RECEIVED: {"at": time.monotonic()}}
        super().on_headers_complete()
        if self.admission is not None and self.admission.kind == "reserve" and self.cycle:
            self.cycle.keep_alive = False  # a reserve slot serves one request, then is free
        self._arm("body")  # on_message_complete follows at once when there is no body

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if len(body) >= _LARGE_READ:
            self.guard.trimmer.note(self.loop, len(body))
        if not self._shedding and not self._refused_late:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        if self._refused_late:
            return
        if self._shedding:
            self._shedding = False
            self.on_response_complete()  # as after any response: keep-alive, pipelining
            return
        super().on_message_complete()

    def _shed(self, response: bytes) -> None:
        """Answer the request whose headers were just read with ``response``; skip its body."""
        self._shedding = True
        if self.expect_100_continue or not self.parser.should_keep_alive():
            # The client waits to send its body (or closes after the answer): end here.
            # The body bytes already here are still parsed, and still dropped.
            self.transport.write(response.replace(b"\r\n", b"\r\nconnection: close\r\n", 1))
            self.transport.close()
            return
        self.transport.write(response)
        self._arm("body")  # the body still has to arrive (and is dropped) in time

    # -- timeouts and refusals -------------------------------------------------------

    def _arm(self, phase: Phase) -> None:
        guard = self.guard
        now = self.loop.time()
        self._phase = phase
        self._request_bytes = False
        if phase == "header":
            self.deadline = now + guard.header_timeout
            return
        self._body_began, self._body_bytes = now, 0
        self.deadline = now + (
            min(guard.body_timeout, guard.body_rate_grace)
            if guard.body_min_rate > 0
            else guard.body_timeout
        )
        guard.pending_bodies[self] = None

    def _disarm(self) -> None:
        if self._phase == "body":
            self.guard.pending_bodies.pop(self, None)
        self._phase = None
        self.deadline = None
        self._request_bytes = False

    def _slow_body(self, now: float) -> str | None:
        """Why the body being read is too slow at ``now``, or None after moving the
        deadline to when it would be (the minimum rate's check, as ``mod_reqtimeout``)."""
        guard = self.guard
        final = self._body_began + guard.body_timeout
        if now >= final:
            return f"the request body did not arrive within {guard.body_timeout:g} s"
        earned = max(guard.body_rate_grace, self._body_bytes / guard.body_min_rate)
        due = self._body_began + earned
        if now < due:
            self.deadline = min(final, due)
            return None
        return (
            f"the request body arrived slower than {guard.body_min_rate:g} bytes/s "
            f"(server.body_min_rate): {self._body_bytes} bytes in {now - self._body_began:.1f} s"
        )

    def expire(self, now: float, *, because: str | None = None) -> None:
        """The phase being read ran past its deadline (or, ``because``, must end now):
        answer 408 if due, and close."""
        phase, request_bytes = self._phase, self._request_bytes
        if phase == "body" and because is None:
            because = (
                self._slow_body(now)
                if self.guard.body_min_rate > 0
                else f"the request body did not arrive within {self.guard.body_timeout:g} s"
            )
            if because is None:
                return  # not behind: the deadline moved on
        self._disarm()
        if phase is None or self.transport.is_closing():
            return
        if self.admission is not None and self.admission.kind == "reserve" and phase == "header":
            self._refuse_reserved()
            return
        self.guard.timed_out(phase, self._address)
        cycle = self.cycle
        idle = cycle is None or cycle.response_complete
        if phase == "header" and request_bytes and idle:
            seconds = self.guard.header_timeout
            self._answer(408, f"the request headers did not arrive within {seconds:g} s")
        elif phase == "body" and cycle is not None and not cycle.response_started:
            # The application waits for the body: it now hears a disconnect, and its
            # answer (if any) is dropped instead of following ours.
            cycle.disconnected = True
            cycle.message_event.set()
            self._answer(408, because or "the request body did not arrive in time")
        self.transport.close()

    def _refuse_reserved(self) -> None:
        """A connection of the monitoring reserve asked for something else (or nothing in
        :data:`RESERVE_WAIT_S`): answer the 503 it was spared at connect, and close."""
        self._timer = None
        admission = self.admission
        if admission is None or self._refused_late or self.transport.is_closing():
            return
        self._refused_late = True
        self._disarm()
        self.guard.unwatch(self)
        self.guard.refused(admission.scope, admission.client)
        self._refuse(self.transport, admission.refusal)

    def _answer(self, status: int, message: str) -> None:
        self.transport.write(_response(status, message))

    def _refuse(self, transport: asyncio.Transport, message: str) -> None:
        transport.write(_response(503, message, retry_after=True))
        if len(self.guard.lingering) >= MAX_LINGERING:
            # No room to linger: the answer is in the socket's buffer already; a client
            # that is still sending may miss it, but none is reset without one.
            transport.close()
            return
        self.guard.lingering.add(transport)
        if transport.can_write_eof() and not transport.is_closing():
            # The client may be gone already (reset): shutdown() then raises, which must
            # not end this callback before the linger is armed.
            with contextlib.suppress(OSError):
                transport.write_eof()
        self._timer = self.loop.call_later(LINGER_S, transport.close)


def _monitoring(target: bytes) -> bool:
    path = target.split(b"?", 1)[0]
    return path == _MONITORING[0] or path.startswith(_MONITORING[1])


_LARGE_READ = 16 * 1024
"""Body reads from this size on count towards the next ``malloc_trim`` (small bodies
come from Python's own allocator and do not leave the heap holding free pages)."""

_REASONS = {408: b"Request Timeout", 503: b"Service Unavailable"}
_AS_PARSER_DOES = frozenset({b"transfer-encoding", b"expect", b"upgrade", b"connection"})
"""Headers that change how a request is framed or answered: the parser handles those."""


def _plain_head(data: bytes, end: int) -> tuple[bytes, list[tuple[bytes, bytes]], int] | None:
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


def _response(status: int, message: str, *, retry_after: bool = False) -> bytes:
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
