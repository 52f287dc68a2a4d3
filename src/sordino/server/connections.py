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
- **connection limits**, in total (``server.max_connections``) and per client address
  (``server.max_connections_per_client``). Past either, a new connection is answered
  at once — 503 with ``Connection: close`` and ``Retry-After`` — and closed, without
  reaching the application; connections already open are served as before.

A refused connection lingers at most :data:`LINGER_S` (its client reads the 503),
and no more than :data:`MAX_LINGERING` linger at once: past that, a refused
connection is reset without an answer, so refusing can never hold many descriptors.

A request may also be refused from its headers alone (:attr:`ConnectionGuard.early_shed`,
``server/early_shed.py``): its answer is written at once, its body is skipped unread,
no ASGI task is made, and the connection stays open for the next request. While
requests are being refused, whole requests that arrive at a request boundary are
read for that without the HTTP parser (:meth:`_GuardedProtocol._refuse_whole`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import resource
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal, Protocol

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from sordino.protocol.codec import encode_error
from sordino.records import ConnectionStatistics

__all__ = [
    "LINGER_S",
    "MAX_LINGERING",
    "RECEIVED",
    "RESERVED_DESCRIPTORS",
    "ConnectionGuard",
    "default_max_connections",
    "guarded_protocol",
]

log = logging.getLogger("sordino.http")

LINGER_S = 1.0
"""How long a refused connection stays open for its client to read the 503."""
MAX_LINGERING = 256
"""Refused connections allowed to linger at once; more are reset at once."""
RESERVED_DESCRIPTORS = 256
"""Descriptors the default ``max_connections`` leaves for everything else (workers,
gRPC, the journal, model files)."""
_WARN_EVERY_S = 10.0
RECEIVED = "sordino.received"
"""ASGI scope extension: ``{"at": time.monotonic()}`` when the request's headers ended."""

Phase = Literal["header", "body"]


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
    ) -> None:
        self.max_connections = max_connections
        self.max_per_client = max_per_client
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self._open: Counter[str] = Counter()
        self._total = 0
        self.lingering: set[asyncio.Transport] = set()
        self._refused_total = self._refused_per_client = 0
        self._timeouts: Counter[Phase] = Counter()
        self._warned_at = -_WARN_EVERY_S
        self._live: set[_GuardedProtocol] = set()
        self._sweeping: asyncio.TimerHandle | None = None
        # Deadlines are checked by one sweep a few times per timeout, not by a timer per
        # request: arming a timer for every request cost the inference path ~10 % on W1.
        self.sweep_s = min(1.0, max(0.02, min(header_timeout, body_timeout) / 8))
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
            protocol.expire()
        self._sweeping = loop.call_later(self.sweep_s, self._sweep, loop) if self._live else None

    def admit(self, client: str) -> str | None:
        """Count a new connection from ``client``; or return why it is refused."""
        if self._total >= self.max_connections:
            self._refused_total += 1
            self._warn("the server holds %d connections (server.max_connections)", self._total)
            return (
                f"the server holds its limit of {self.max_connections} connections; retry "
                "later (server.max_connections)"
            )
        if self._open[client] >= self.max_per_client:
            self._refused_per_client += 1
            self._warn(
                "%s holds %d connections (server.max_connections_per_client)",
                client,
                self._open[client],
            )
            return (
                f"{client} holds its limit of {self.max_per_client} open connections; reuse "
                "them or close some (server.max_connections_per_client)"
            )
        self._open[client] += 1
        self._total += 1
        return None

    def release(self, client: str) -> None:
        """Forget a connection :meth:`admit` counted."""
        self._total -= 1
        self._open[client] -= 1
        if self._open[client] <= 0:
            del self._open[client]

    def timed_out(self, phase: Phase, client: str) -> None:
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
        self._address = ""
        self._admitted = False
        self._phase: Phase | None = None
        self._timer: asyncio.TimerHandle | None = None  # a refused connection's linger
        self.deadline: float | None = None  # when the phase being read times out
        self._request_bytes = False  # some of the current request's headers arrived
        self._shedding = False  # the current request was refused from its headers
        self._asked = False  # the request the parser reads next was admitted unparsed

    # -- the connection --------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        self._address = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        refusal = self.guard.admit(self._address)
        if refusal is not None:
            self.transport = transport
            self._refuse(transport, refusal)
            return
        self._admitted = True
        super().connection_made(transport)
        self.guard.watch(self)
        self._arm("header")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.guard.unwatch(self)
        if not self._admitted:
            self.guard.lingering.discard(self.transport)
            return
        self._admitted = False
        self.guard.release(self._address)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
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
        self._arm("body")  # on_message_complete follows at once when there is no body

    def on_body(self, body: bytes) -> None:
        if not self._shedding:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
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
        seconds = self.guard.header_timeout if phase == "header" else self.guard.body_timeout
        self._phase = phase
        self._request_bytes = False
        self.deadline = self.loop.time() + seconds

    def _disarm(self) -> None:
        self._phase = None
        self.deadline = None
        self._request_bytes = False

    def expire(self) -> None:
        """The phase being read ran past its deadline: answer 408 if due, and close."""
        phase, request_bytes = self._phase, self._request_bytes
        self._disarm()
        if phase is None or self.transport.is_closing():
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
            seconds = self.guard.body_timeout
            self._answer(408, f"the request body did not arrive within {seconds:g} s")
        self.transport.close()

    def _answer(self, status: int, message: str) -> None:
        self.transport.write(_response(status, message))

    def _refuse(self, transport: asyncio.Transport, message: str) -> None:
        if len(self.guard.lingering) >= MAX_LINGERING:
            transport.abort()
            return
        self.guard.lingering.add(transport)
        transport.write(_response(503, message, retry_after=True))
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = self.loop.call_later(LINGER_S, transport.close)


_REASONS = {408: b"Request Timeout", 503: b"Service Unavailable"}
_AS_PARSER_DOES = frozenset({b"transfer-encoding", b"expect", b"upgrade", b"connection"})
"""Headers that change how a request is framed or answered: the parser handles those."""


def _plain_head(data: bytes, end: int) -> tuple[bytes, list[tuple[bytes, bytes]], int] | None:
    """``(target, headers, content length)`` of the request whose head is ``data[:end]``,
    if it is a plain keep-alive HTTP/1.1 POST with a ``Content-Length``; else None.

    Under overload a client sends the same head over and over: the last heads read are
    kept (about 2 µs of a refusal's 40), and the headers list must not be changed."""
    return _read_head(data[:end])


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
