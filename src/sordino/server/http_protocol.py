"""sordino's own HTTP/1.1 protocol on ``httptools``, run by uvicorn.

uvicorn owns the sockets, signals and graceful shutdown; it makes one protocol per
connection through its documented ``Config(http=<class>)`` hook. What uvicorn asks of
that class (nothing imported from it; ``tests/server/test_http_protocol.py`` pins it):
it is called as ``cls(config=..., server_state=..., app_state=..., _loop=...)``; a
connection adds itself to ``server_state.connections`` while open and each request
task to ``server_state.tasks`` while it runs; ``shutdown()`` closes an idle
connection or marks the one being answered to close after its answer; answers carry
``server_state.default_headers`` (``date``, ``server``) and count in
``server_state.total_requests``. That contract is uvicorn's de facto one (its own
protocols follow it) rather than a documented API: it is small, it has not moved in
years, and a change would show in that test.

Each request is parsed once. ``POST /v2/models/{m}[/versions/{v}]/infer`` is answered
by an :class:`~sordino.server.http_cycle.InferCycle` (no ASGI scope, no Starlette, one
write); anything else by an :class:`~sordino.server.asgi_bridge.AsgiCycle`. Requests
pipelined on one connection are answered in order. The guard's limits and timeouts
(``server/connection_guard.py``) are enforced here; :class:`_GuardedReads` holds the
read deadlines and the refusals.
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections import deque
from typing import Any, ClassVar, Protocol, cast

import httptools
from starlette.types import ASGIApp

from sordino.memo import Memo
from sordino.server.asgi_bridge import AsgiCycle
from sordino.server.connection_guard import (
    LARGE_READ,
    RECEIVED,
    RESERVE_WAIT_S,
    ConnectionGuard,
    monitoring,
)
from sordino.server.fast_infer import INFER_PATH
from sordino.server.guarded_reads import GuardedReads
from sordino.server.http_cycle import HIGH_WATER, STATUS_LINE, Cycle, InferCycle
from sordino.server.http_flow import HttpFlow
from sordino.server.ignored_upgrade import IgnoredUpgrade
from sordino.server.runtime import Runtime
from sordino.server.tls_accept import client_address

__all__ = ["HttpProtocol", "ServerState", "http_protocol"]

_ASGI = {"version": "3.0", "spec_version": "2.3"}
_INFER_PREFIX = "/v2/models/"


class ServerState(Protocol):
    """What the protocol reads and writes of uvicorn's ``Server.server_state``."""

    total_requests: int
    connections: set[Any]
    tasks: set[Any]
    default_headers: list[tuple[bytes, bytes]]


def http_protocol(
    guard: ConnectionGuard, app: ASGIApp, runtime: Runtime, keep_alive_s: float
) -> type[HttpProtocol]:
    """The protocol class for uvicorn's ``Config(http=...)``: ``guard``'s limits, ``app``
    for every request but inference, ``runtime`` for inference, idle connections
    closed after ``keep_alive_s``."""

    class Bound(HttpProtocol):
        pass

    Bound.guard, Bound.runtime, Bound.keep_alive_s = guard, runtime, keep_alive_s
    Bound.apps = (app,)  # in a tuple: a function as a class attribute would be bound
    return Bound


class HttpProtocol(IgnoredUpgrade, HttpFlow, GuardedReads):
    """One HTTP/1.1 connection (see the module's docstring)."""

    guard: ClassVar[ConnectionGuard]
    apps: ClassVar[tuple[ASGIApp]]
    runtime: ClassVar[Runtime]
    keep_alive_s: ClassVar[float]
    infer_cycle: ClassVar[type[InferCycle]] = InferCycle
    """The cycle of ``…/infer`` (a front-end process sends it to the engine instead)."""

    def __init__(
        self,
        config: object = None,
        server_state: ServerState | None = None,
        app_state: dict[str, Any] | None = None,
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(_loop or asyncio.get_event_loop())
        assert server_state is not None, "uvicorn passes server_state"
        self.server_state = server_state
        self.app = self.apps[0]
        self.app_state = app_state if app_state is not None else {}
        self.connections = server_state.connections
        self.tasks = server_state.tasks
        self.parser = httptools.HttpRequestParser(self)
        # Answer the first of pipelined requests even when a later one says close.
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        self.pipeline: deque[Cycle] = deque()
        self.cycle: Cycle | None = None  # the request parsed last
        self._running: Cycle | None = None  # the request being answered
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect_100_continue = False
        self.keep_alive_task: asyncio.TimerHandle | None = None
        self._idle_at: float | None = None  # loop time the connection went idle, if it is
        self.read_paused = False
        self.write_paused = False
        self._writable: asyncio.Future[None] | None = None
        self._next_after_drain = False  # an answer done while the client was not reading
        self._head_of: list[tuple[bytes, bytes]] | None = None
        self._head = b""

    # -- the connection --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass: no isinstance).
        transport = cast(asyncio.Transport, transport)
        self._made = True
        if self.admission is None:  # plain TCP; a TLS connection was admitted at accept
            self.admission = self.guard.admit(client_address(transport))
        admission = self.admission
        self._address = admission.client
        self.transport = transport
        self.server = _address(transport.get_extra_info("sockname"))
        if admission.kind == "refused":
            self._timer = self.guard.refuse(transport, admission.refusal, self.loop)
            return
        self._admitted = True
        self.connections.add(self)
        self.client = _address(transport.get_extra_info("peername"))
        self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"
        self.guard.watch(self)
        self._arm("header")
        if admission.kind == "reserve":
            self._timer = self.loop.call_later(RESERVE_WAIT_S, self._refuse_reserved)
        early, self._early = self._early, []
        for data in early:
            self.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.guard.unwatch(self)
        if self._timer is not None:
            self._timer.cancel()
        self.forget()
        if not self._made:
            self.drop()
            return  # a TLS handshake that failed
        self.guard.lingering.discard(self.transport)
        if not self._admitted:
            # The parser holds this protocol's bound methods: a refused connection left
            # that cycle (and its transport) for the cyclic GC, hundreds under pressure.
            self.drop()
            return
        self._admitted = False
        self.connections.discard(self)
        for cycle in (self._running, self.cycle):
            if cycle is not None and not cycle.response_complete and not cycle.disconnected:
                cycle.disconnect()  # a request the service has is cancelled
        self._running = None
        self.resume_writing()
        if exc is None:
            self.transport.close()
        self._unset_keep_alive()
        if self.keep_alive_task is not None:
            self.keep_alive_task.cancel()
            self.keep_alive_task = None
        self.drop()

    def drop(self) -> None:
        """Break the cycles a closed connection would leave for the collector: the
        parser's bound methods, and its last request's cycle (which holds this protocol)."""
        self.parser = None
        self.cycle = None
        self.pipeline.clear()

    def eof_received(self) -> None:
        pass

    def data_received(self, data: bytes) -> None:
        if not self._made:
            self._early.append(data)  # decrypted before start_tls returned
            return
        if not self._admitted or self._refused_late:
            return  # a refused connection: its request is not read
        if self._discard:
            data = self._drop_body(data)  # of a request refused from its head
            if not data:
                return
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
        phase, heads = self._phase, self._heads
        if phase == "header":
            self._request_bytes = True
        self._unset_keep_alive()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:  # none is served: HTTP/1.1 goes on
            self._ignore_upgrade(data, upgrade.args[0])
        except httptools.HttpParserError:
            if self.head_too_large:
                self.refuse_head()
            else:
                self._bad_request("Invalid HTTP request received.")
            return
        if self._phase == "header" and self.head_grew(len(data), phase, heads):
            return
        if self._phase == "body" and self.guard.too_many_bodies():
            self.guard.evict_bodies()

    def _bad_request(self, message: str) -> None:
        self.transport.write(
            b"".join(
                [
                    STATUS_LINE[400],
                    self.default_head(),
                    b"content-type: text/plain; charset=utf-8\r\n",
                    b"content-length: %d\r\nconnection: close\r\n\r\n" % len(message),
                    message.encode("ascii"),
                ]
            )
        )
        self.transport.close()

    # -- parser callbacks ------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self._head_bytes = self._head_seen = 0
        self.expect_100_continue = False
        self.headers = []
        # A request that follows a refusal in the same read: the idle timer the refusal
        # armed must not close the connection under it.
        self._unset_keep_alive()
        if self._phase is None:  # a later request on a kept-alive connection
            self._arm("header")
        self._request_bytes = True

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._head_seen += len(url)
        if self._head_seen > self.guard.max_header_size:
            self._head_too_large()

    def on_header(self, name: bytes, value: bytes) -> None:
        # The head's size, as parsed: a head that comes in one read (head_grew counts
        # one that comes in several). Inline: this runs for every header.
        self._head_seen += len(name) + len(value) + 4
        if self._head_seen > self.guard.max_header_size:
            self._head_too_large()
        name = name.lower()
        value = value.rstrip(b" \t")  # llhttp keeps trailing whitespace; RFC 9110 does not
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def _head_too_large(self) -> None:
        """The head passed ``server.max_header_size``: end the parse (then 431)."""
        self.head_too_large = True
        raise ValueError("the request's head is too large")  # the parser stops here

    def on_headers_complete(self) -> None:
        self._heads += 1
        self._head_bytes = self._head_seen = 0
        self._disarm()
        parser = self.parser
        method = parser.get_method()
        reserve = self.admission is not None and self.admission.kind == "reserve"
        if reserve:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if method not in (b"GET", b"HEAD") or not monitoring(self.url):
                self._refuse_reserved()
                return
        shed = self.guard.early_shed
        asked, self._asked = self._asked, False
        if (
            shed is not None
            and not asked
            and (self.cycle is None or self.cycle.response_complete)
            and not self.pipeline
            and method == b"POST"
        ):
            response = shed(self.url, self.headers)
            if response is not None:
                self._shed(response)
                return
        received = time.monotonic()  # a request's deadline counts from here
        version = parser.get_http_version()
        # A reserve slot serves one request, then is free.
        keep_alive = (
            version != "1.0"
            and parser.should_keep_alive()
            and not reserve
            and not self.guard.closing
        )
        url = self.url
        # Kept: an origin-form target says all it means.
        target = _TARGETS[url] if url[:1] == b"/" else _target(url)
        raw_path, query, path, model = target
        name = method.decode("ascii")
        cycle: Cycle
        if model is not None:
            cycle = self.infer_cycle(
                self,
                name,
                keep_alive,
                self.expect_100_continue,
                model=model[0],
                version=model[1],
                path=path,
                headers=self.headers,
                client=self.client[0] if self.client else None,
                received_at=received,
            )
        else:
            scope = {
                "type": "http",
                "asgi": _ASGI,
                "http_version": version,
                "server": self.server,
                "client": self.client,
                "scheme": self.scheme,
                "method": name,
                "root_path": "",
                "path": path,
                "raw_path": raw_path,
                "query_string": query,
                "headers": self.headers,
                "state": self.app_state.copy(),
                "extensions": {RECEIVED: {"at": received}},
            }
            cycle = AsgiCycle(self, scope, keep_alive, self.expect_100_continue)
        previous, self.cycle = self.cycle, cycle
        if previous is None or previous.response_complete:
            if cycle.defer():
                self._running = cycle  # it starts itself once its body is whole
            else:
                self.start_task(cycle)
        else:  # pipelined: answered after the ones before it
            self.pause_reading()
            self.pipeline.appendleft(cycle)
        self._arm("body")  # on_message_complete follows at once when there is no body

    def on_body(self, body: bytes) -> None:
        size = len(body)
        self._body_bytes += size
        if size >= LARGE_READ:
            self.guard.trimmer.note(self.loop, size)
        if self._shedding or self._refused_late:
            return
        self._held += size  # counted until the body is whole or given up (_disarm)
        self.guard.pending_body_bytes += size
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and cycle.feed(body) > HIGH_WATER:
            self.pause_reading()

    def on_message_complete(self) -> None:
        if self.parser.should_upgrade() and self._body_skipped():
            return  # the body is still to come (server/ignored_upgrade.py)
        self._disarm()
        if self._refused_late:
            return
        if self._shedding:
            self._shedding = False
            self.on_response_complete()  # as after any response: keep-alive, pipelining
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.end()

    # -- answers ---------------------------------------------------------------------

    def start_task(self, cycle: Cycle) -> None:
        """Run ``cycle`` (the request due now) in a task."""
        self._running = cycle
        task = self.loop.create_task(cycle.run())
        cycle.task = task
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def on_response_complete(self) -> None:
        """An answer was written whole: start the next pipelined request, or wait idle —
        once the client has read enough of its answers (see :meth:`resume_writing`)."""
        self.server_state.total_requests += 1
        self._running = None
        if self.transport.is_closing():
            return
        if self.write_paused:
            # The client is not reading its answers: read nothing more and start no
            # pipelined request until it does, so that answers cannot pile up in this
            # process (a client pipelining without reading grew it by 4 GB in 40 s).
            self.pause_reading()
            self._next_after_drain = True
            return
        self._next_request()

    def _next_request(self) -> None:
        self._unset_keep_alive()
        if self.pipeline:
            # Read on only once the requests already read are answered (the one started
            # reads the rest of its body itself): resumed here, every answer let a whole
            # read of requests more in, and the queue grew without bound.
            self.start_task(self.pipeline.pop())
        else:
            self.resume_reading()
            self._idle()

    def default_head(self) -> bytes:
        """uvicorn's default headers (``date``, ``server``) as written, kept until they change."""
        headers = self.server_state.default_headers
        if headers is not self._head_of:
            self._head_of = headers
            self._head = b"".join(b"%s: %s\r\n" % pair for pair in headers)
        return self._head

    def end_keep_alive(self) -> None:
        """The server stops: the last answer due on this connection (the one being made,
        else the last pipelined) says ``Connection: close`` and the connection closes
        after it. Requests read later are answered so too (``guard.closing``); an idle
        connection stays open to answer its client's next request the same way."""
        last = self.pipeline[0] if self.pipeline else self.cycle
        if last is not None and not last.response_complete:
            last.keep_alive = False

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: close if idle, 503 if the body is still to come
        (:meth:`stop_reading_body`), else close after the current answer."""
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()
        elif self._phase == "body" and not self.pipeline:
            self.stop_reading_body()
        else:
            self.cycle.keep_alive = False


def _address(info: object) -> tuple[str, int] | None:
    if isinstance(info, tuple) and len(info) >= 2:
        return str(info[0]), int(info[1])
    return None


def _split(parsed: Any) -> tuple[bytes, bytes]:
    return parsed.path, parsed.query or b""


_Target = tuple[bytes, bytes, str, tuple[str, str | None] | None]
"""A request target read: raw path, query, path (unquoted), and the model and version
if it is ``…/infer``."""


def _target(url: bytes) -> _Target:
    raw_path, query = (
        url.partition(b"?")[::2] if url[:1] == b"/" else _split(httptools.parse_url(url))
    )
    path = raw_path.decode("ascii")
    if "%" in path:
        path = urllib.parse.unquote(path)
    match = INFER_PATH.fullmatch(path) if path.startswith(_INFER_PREFIX) else None
    return raw_path, query, path, (match["model"], match["version"]) if match else None


_TARGETS: Memo[bytes, _Target] = Memo(_target, 256)
"""Targets read, by the bytes sent: a server sees a few kinds again and again."""
