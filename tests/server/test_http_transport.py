"""The HTTP protocol's per-request shortcuts keep its behaviour (server/http_protocol.py,
http_cycle.py): the lazily armed keep-alive timer and the cached response heads.

On a virtual loop (its time moves only when the test says), with a transport that keeps
what is written."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from sordino.server.connection_guard import ConnectionGuard
from sordino.server.http_cycle import InferCycle
from sordino.server.http_protocol import HttpProtocol, http_protocol

KEEP_ALIVE_S = 5.0


class _Handle:
    def __init__(self, when: float, callback: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.when, self.callback, self.args, self.cancelled = when, callback, args, False

    def cancel(self) -> None:
        self.cancelled = True

    def __lt__(self, other: _Handle) -> bool:
        return self.when < other.when


class _VirtualLoop:
    """Timers only: ``call_later`` and ``time``, run by :meth:`advance`."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[_Handle] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> _Handle:
        handle = _Handle(self.now + delay, callback, args)
        heapq.heappush(self.timers, handle)
        return handle

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while self.timers and self.timers[0].when <= end:
            handle = heapq.heappop(self.timers)
            self.now = max(self.now, handle.when)
            if not handle.cancelled:
                handle.callback(*handle.args)
        self.now = end

    def armed(self) -> int:
        return sum(not handle.cancelled for handle in self.timers)


class _Transport:
    def __init__(self) -> None:
        self.closed = False
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )


def _connection() -> tuple[HttpProtocol, _Transport, _VirtualLoop]:
    guard = ConnectionGuard(
        max_connections=8, max_per_client=8, header_timeout=30.0, body_timeout=30.0
    )
    cls = http_protocol(guard, _app, SimpleNamespace(), KEEP_ALIVE_S)  # type: ignore[arg-type]
    loop = _VirtualLoop()
    state = SimpleNamespace(total_requests=0, connections=set(), tasks=set(), default_headers=[])
    protocol = cls(server_state=state, _loop=loop)  # type: ignore[arg-type]
    transport = _Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol._disarm()  # no request is being read: only the keep-alive timer matters here
    return protocol, transport, loop


async def _app(scope: object, receive: object, send: object) -> None:
    raise AssertionError("not called")


def test_an_idle_connection_closes_when_the_keep_alive_timeout_ends() -> None:
    """Idle after an answer: closed ``keep_alive_s`` later, not before."""
    protocol, transport, loop = _connection()
    protocol._idle()
    loop.advance(KEEP_ALIVE_S - 0.5)
    assert not transport.closed
    loop.advance(0.5)
    assert transport.closed


def test_a_connection_busy_when_its_timer_fires_stays_open() -> None:
    """A request under way when the period ends: the connection is not closed, and once
    idle again it gets a whole period from then."""
    protocol, transport, loop = _connection()
    protocol._idle()
    loop.advance(1.0)
    protocol._unset_keep_alive()  # the next request began
    loop.advance(KEEP_ALIVE_S + 2.0)  # still answering it when the first timer fires
    assert not transport.closed
    protocol._idle()  # answered
    loop.advance(KEEP_ALIVE_S - 0.5)
    assert not transport.closed
    loop.advance(0.5)
    assert transport.closed


def test_the_period_runs_from_the_last_time_the_connection_went_idle() -> None:
    """Requests that come and go within a period: the timer armed for the first idle
    moment does not close the connection early; one timer serves them all."""
    protocol, transport, loop = _connection()
    for _ in range(10):  # ten requests, 0.4 s apart, answered at once
        protocol._idle()
        loop.advance(0.4)
        protocol._unset_keep_alive()
    assert loop.armed() <= 2  # the keep-alive timer (once) and the guard's sweep
    protocol._idle()
    loop.advance(KEEP_ALIVE_S - 0.1)
    assert not transport.closed
    loop.advance(0.1)
    assert transport.closed


def test_a_lost_connection_cancels_its_keep_alive_timer() -> None:
    """connection_lost leaves no timer holding the protocol."""
    protocol, _, loop = _connection()
    protocol._idle()
    protocol.connection_lost(None)
    assert protocol.keep_alive_task is None
    loop.advance(KEEP_ALIVE_S * 2)  # nothing fires on a closed connection


def _answer(keep_alive: bool, headers: dict[str, str]) -> tuple[bytes, bool]:
    """What one inference answer writes, and whether the connection closed after it."""
    protocol, transport, _ = _connection()
    cycle = InferCycle(
        protocol, "POST", keep_alive, False, model="m", version=None, path="/v2/models/m/infer",
        headers=[], client=None, received_at=0.0,
    )  # fmt: skip
    cycle.respond(200, b"{}", headers)
    [written] = transport.written
    return written, transport.closed


def test_answers_with_the_same_headers_are_written_alike_whatever_the_connection() -> None:
    """The header lines are encoded once for each kind of answer, but ``connection:
    close`` still follows each connection's own state."""
    for _ in range(2):  # the second time from the cache
        kept, closed = _answer(True, {"Content-Type": "application/json"})
        assert kept.endswith(b"content-type: application/json\r\n\r\n{}")
        assert b"connection" not in kept and not closed
        last, closed = _answer(False, {"Content-Type": "application/json"})
        assert last.endswith(b"content-type: application/json\r\nconnection: close\r\n\r\n{}")
        assert closed


def test_an_answer_that_says_close_closes_the_connection_every_time() -> None:
    """A ``Connection: close`` among an answer's headers closes a kept-alive
    connection, from the cache too, and is written once."""
    for _ in range(2):
        written, closed = _answer(True, {"Connection": "close", "Retry-After": "1"})
        assert written.count(b"connection: close") == 1 and closed
        assert b"content-type: application/json\r\n" in written


def test_a_request_target_is_read_into_what_the_cycles_need() -> None:
    """What is kept for a kind of target (``_TARGETS``): raw path, query, the unquoted
    path, and the model and version of an inference target, in either form."""
    from sordino.server import http_protocol as module

    url = b"/v2/models/m%2Dx/versions/2/infer?trace=1"
    assert module._target(url) == (b"/v2/models/m%2Dx/versions/2/infer", b"trace=1",
                                   "/v2/models/m-x/versions/2/infer", ("m-x", "2"))  # fmt: skip
    absolute = b"http://h/v2/models/m/infer"
    assert module._target(absolute)[3] == ("m", None)
    assert module._target(b"/metrics")[3] is None
