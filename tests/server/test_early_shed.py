"""Refusing from the headers: 503 before the body is read, on a connection kept open.

A real server. A body that is not JSON tells whether it was read: refused from the
headers it is never decoded (503), read it would be a 400. The event-loop rule is
driven by swapping in a :class:`LoopLag` whose share the test sets (its interval and
idle time are an hour, so no measurement moves it during the test).
"""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest

from sordino.config import RuntimeConfig
from sordino.errors import QueueTimeout
from sordino.inference import InferRequest, InferResponse
from sordino.models.repository import builtin_sources
from sordino.server.loop_lag import LoopLag
from sordino.testing import RunningServer, serve_in_thread
from tests.conftest import thread_isolated
from tests.metrics import counter_sum
from tests.waiting import wait_for

MODEL = "digits-classifier"
INFER = f"/v2/models/{MODEL}/infer"
GOOD = orjson.dumps(
    {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}
)
NOT_JSON = b"{this is not json" + b"x" * 4000
GOOD_REQUEST = (
    f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(GOOD)}\r\n\r\n".encode() + GOOD
)


def _read_responses(sock: socket.socket, count: int) -> list[int]:
    """The statuses of the next ``count`` responses on ``sock`` (bodies by Content-Length)."""
    data, statuses = b"", []
    while len(statuses) < count:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end].lower()
            length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
            if len(data) >= head_end + 4 + length:
                statuses.append(int(head[9:12]))
                data = data[head_end + 4 + length :]
                continue
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    return statuses


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    sources = thread_isolated([s for s in builtin_sources() if s.name == MODEL])
    # The lag rule off: a busy test machine must not refuse the low-priority requests
    # these tests expect served; the test of that rule swaps in its own LoopLag.
    config = RuntimeConfig.model_validate({"server": {"shed_loop_lag": 0}})
    with serve_in_thread(config, sources) as running:
        yield running


@pytest.fixture
def conn(server: RunningServer) -> Iterator[http.client.HTTPConnection]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    # One served request first: the scheduler then knows how long a batch takes.
    connection.request("POST", INFER, GOOD, {"Content-Type": "application/json"})
    assert connection.getresponse().read() and True
    yield connection
    connection.close()


def _post(
    conn: http.client.HTTPConnection, body: bytes, **headers: str
) -> tuple[int, dict[str, str], bytes]:
    named = {k.replace("_", "-"): v for k, v in headers.items()}
    conn.request("POST", INFER, body, {"Content-Type": "application/json", **named})
    response = conn.getresponse()
    return response.status, dict(response.getheaders()), response.read()


def _rejected(server: RunningServer, reason: str) -> int:
    return counter_sum(server, "sordino_rejected_requests", lambda s: s["reason"] == reason)


def test_a_deadline_no_batch_can_meet_is_refused_before_the_body_is_read(
    server: RunningServer, conn: http.client.HTTPConnection
) -> None:
    shed_before = _rejected(server, "shed")
    status, headers, body = _post(conn, NOT_JSON, X_Sordino_Priority="low", X_Sordino_Timeout="1")
    assert status == 503
    assert int(headers["retry-after"]) >= 1
    assert "deadline" in orjson.loads(body)["error"]
    # Counted once, in both families (refusals are counted once per loop iteration).
    wait_for(lambda: _rejected(server, "shed") == shed_before + 1, "the refusal to be counted")
    # The same connection serves the next request: the skipped body did not derail it.
    status, _, body = _post(conn, GOOD, X_Sordino_Priority="low", X_Sordino_Timeout="5000000")
    assert status == 200, body


def test_many_refusals_in_one_burst_are_each_counted(server: RunningServer) -> None:
    """Refusals counted per loop iteration, by kind: a pipelined burst still counts each."""
    before = _rejected(server, "shed")
    request = (
        f"POST {INFER} HTTP/1.1\r\nHost: x\r\nX-Sordino-Priority: low\r\n"
        f"X-Sordino-Timeout: 1\r\nContent-Length: {len(NOT_JSON)}\r\n\r\n"
    ).encode() + NOT_JSON
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(GOOD_REQUEST)  # served first: the scheduler learns a batch's time
        _read_responses(sock, 1)
        sock.sendall(request * 20)
        statuses = _read_responses(sock, 20)
    assert statuses == [503] * 20
    wait_for(lambda: _rejected(server, "shed") == before + 20, "20 refusals to be counted")


def test_without_the_headers_the_body_is_read_as_before(
    conn: http.client.HTTPConnection,
) -> None:
    status, _, body = _post(conn, NOT_JSON)
    assert status == 400, body


def test_a_deadline_in_the_timeout_header_reaches_the_scheduler(
    server: RunningServer, conn: http.client.HTTPConnection
) -> None:
    """Shed from the headers and, had it been read, by the scheduler: the same rule."""
    rejected = server.runtime.get(MODEL).scheduler.statistics().rejected
    status, _, _ = _post(conn, GOOD, X_Sordino_Timeout="1")
    assert status == 503
    assert server.runtime.get(MODEL).scheduler.statistics().rejected == rejected + 1


def test_a_late_loop_refuses_lower_priorities_only(
    server: RunningServer, conn: http.client.HTTPConnection
) -> None:
    shed = server.early_shed
    assert shed is not None
    saved = shed.lag
    lag = LoopLag(0.01, interval_s=3600.0, idle_s=3600.0)
    lag.share = 0.01  # one request in a hundred below the highest priority gets in
    server.loop.call_soon_threadsafe(setattr, shed, "lag", lag)
    try:
        status, headers, body = _post(conn, NOT_JSON, X_Sordino_Priority="low")
        assert status == 503 and "event loop" in orjson.loads(body)["error"]
        assert headers["retry-after"] == "1"
        status, _, _ = _post(conn, GOOD, X_Sordino_Priority="high")
        assert status == 200
        # No priority header: the body may say high, so it is read and served.
        status, _, _ = _post(conn, GOOD)
        assert status == 200
        status, _, _ = _post(conn, GOOD, X_Sordino_Tag="batch")
        assert status == 200
    finally:
        server.loop.call_soon_threadsafe(setattr, shed, "lag", saved)


def test_a_loop_late_with_the_others_refused_cuts_the_highest_priority_too(
    server: RunningServer, conn: http.client.HTTPConnection
) -> None:
    """Past the lower priorities' floor a share of the highest priority is refused,
    and of requests whose headers give no priority (the body may say high); every
    lower one is refused."""
    shed = server.early_shed
    assert shed is not None
    saved = shed.lag
    lag = LoopLag(0.01, interval_s=3600.0, idle_s=3600.0)
    lag.share = 0.01
    lag.top_share = 0.5
    server.loop.call_soon_threadsafe(setattr, shed, "lag", lag)
    try:
        # Each request asked once, wherever it is read (fast path or parser): exactly half.
        statuses = [_post(conn, GOOD, X_Sordino_Priority="high")[0] for _ in range(4)]
        assert sorted(statuses) == [200, 200, 503, 503]
        status, headers, body = _post(conn, GOOD, X_Sordino_Priority="high")
        if status == 200:  # the credit says which one of each two: see the refusal
            status, headers, body = _post(conn, GOOD, X_Sordino_Priority="high")
        assert status == 503 and headers["retry-after"] == "1"
        assert "every lower priority refused" in orjson.loads(body)["error"]
        statuses = [_post(conn, GOOD)[0] for _ in range(4)]
        assert sorted(statuses) == [200, 200, 503, 503]
        statuses = [_post(conn, GOOD, X_Sordino_Priority="low")[0] for _ in range(4)]
        assert statuses == [503] * 4  # not even the lower floor's one in a hundred
    finally:
        server.loop.call_soon_threadsafe(setattr, shed, "lag", saved)


def test_a_refused_closing_request_sent_in_one_packet_is_answered_and_closed(
    server: RunningServer, conn: http.client.HTTPConnection
) -> None:
    """The first request on a connection, headers and body in one write, ``Connection:
    close``: the body bytes that follow the refusal in the same read are dropped, and
    the connection closes cleanly. (``conn`` has had a request served: the scheduler
    knows a batch's time.)"""
    request = (
        f"POST {INFER} HTTP/1.1\r\nHost: x\r\nX-Sordino-Priority: low\r\n"
        f"X-Sordino-Timeout: 1\r\nConnection: close\r\n"
        f"Content-Length: {len(NOT_JSON)}\r\n\r\n"
    ).encode() + NOT_JSON
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 503") and b"connection: close" in data.lower()


def test_refused_unread_keeps_a_closing_request_closing(server: RunningServer) -> None:
    """``Connection: close`` from the client: the refusal says so and the server closes."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", INFER, GOOD, {"Content-Type": "application/json"})
        conn.getresponse().read()
        status, headers, _ = _post(
            conn, NOT_JSON, X_Sordino_Priority="low", X_Sordino_Timeout="1", Connection="close"
        )
        assert status == 503
        assert headers.get("connection") == "close"
    finally:
        conn.close()


def test_the_deadline_counts_from_when_the_request_was_received(server: RunningServer) -> None:
    """A request that waited past its deadline to be read is refused, never run; one that
    waited less keeps the rest of its deadline."""
    pixels = np.full((1, 64), 1.0, dtype=np.float32)

    def request(waited_s: float) -> InferRequest:
        return InferRequest(
            model=MODEL,
            inputs={"pixels": pixels},
            parameters={"timeout": 500_000},
            received_at=time.monotonic() - waited_s,
        )

    with pytest.raises(QueueTimeout, match=r"waited .* to be read"):
        server.call(server.runtime.service.infer(request(0.6)))
    response = server.call(server.runtime.service.infer(request(0.1)))
    assert isinstance(response, InferResponse)
    response.release()


def test_the_http_path_stamps_when_the_headers_ended(
    server: RunningServer, conn: http.client.HTTPConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    stamped: list[float | None] = []
    admit = server.runtime.service.admit

    def spy(request: InferRequest, *rest: Any) -> object:
        stamped.append(request.received_at)
        return admit(request, *rest)

    monkeypatch.setattr(server.runtime.service, "admit", spy)
    before = time.monotonic()
    status, _, _ = _post(conn, GOOD)
    assert status == 200
    assert stamped and stamped[0] is not None and before <= stamped[0] <= time.monotonic()


def test_shed_loop_lag_zero_turns_the_lag_rule_off(server: RunningServer) -> None:
    assert server.early_shed is not None and server.early_shed.lag is None
    assert RuntimeConfig().server.shed_loop_lag == 0.01  # on by default, 10 ms


def _refused_request(body: bytes = NOT_JSON) -> bytes:
    return (
        f"POST {INFER} HTTP/1.1\r\nHost: x\r\nX-Sordino-Priority: low\r\n"
        f"X-Sordino-Timeout: 1\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def test_whole_refused_requests_are_answered_without_the_parser(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While requests are being refused, five refused requests in one write are
    answered from their bytes alone: the HTTP parser never calls back for them (the
    fast path), and each is counted."""
    from sordino.server.http_protocol import HttpProtocol

    parsed = []
    original = HttpProtocol.on_headers_complete

    def counting(self: HttpProtocol) -> None:
        parsed.append(self.url)
        original(self)

    before = _rejected(server, "shed")
    scheduler = server.runtime.get(MODEL).scheduler
    # Before connecting: the parser takes its callbacks from the protocol when made.
    monkeypatch.setattr(HttpProtocol, "on_headers_complete", counting)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(GOOD_REQUEST)  # served first: the scheduler learns a batch's time
        assert _read_responses(sock, 1) == [200]
        sock.sendall(_refused_request())  # refused: the server is refusing now
        assert _read_responses(sock, 1) == [503]
        assert server.early_shed is not None and server.early_shed.refusing()
        parsed_before = len(parsed)
        rejected = scheduler.statistics().rejected
        sock.sendall(_refused_request() * 5)
        assert _read_responses(sock, 5) == [503] * 5
        assert len(parsed) == parsed_before  # none of the five went through the parser
        # Decided once for the five (one read, one loop iteration), counted five times.
        assert scheduler.statistics().rejected == rejected + 5
        sock.sendall(GOOD_REQUEST)  # the connection goes on
        assert _read_responses(sock, 1) == [200]
    assert len(parsed) == parsed_before + 1
    wait_for(lambda: _rejected(server, "shed") == before + 6, "6 refusals to be counted")


def test_whole_requests_are_read_by_the_parser_when_nothing_is_being_refused(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast path is tried only while requests are being refused: otherwise a served
    request's head would be read twice."""
    from sordino.server import connection_guard

    read_fast = []
    original = connection_guard.plain_head

    def counting(data: bytes, end: int) -> object:
        read_fast.append(end)
        return original(data, end)

    monkeypatch.setattr(connection_guard, "plain_head", counting)
    assert server.early_shed is not None
    shed = server.early_shed
    # No refusal for a while (set through the loop: it is the server's state).
    server.loop.call_soon_threadsafe(setattr, shed, "_refused_at", float("-inf"))
    wait_for(lambda: not shed.refusing(), "the refusals to be forgotten")
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(GOOD_REQUEST * 3)
        assert _read_responses(sock, 3) == [200] * 3
        assert read_fast == []
        sock.sendall(_refused_request())  # refused by the parser's path: now refusing
        assert _read_responses(sock, 1) == [503]
        sock.sendall(_refused_request())  # and this one is read fast
        assert _read_responses(sock, 1) == [503]
    assert len(read_fast) == 1


def test_refused_and_served_requests_pipelined_are_answered_in_order(
    server: RunningServer,
) -> None:
    """Refused, refused, served, refused in one write: the fast path answers the first
    two, the parser takes over from the served one on, and the answers keep the order."""
    refused = _refused_request(GOOD)  # a valid body: refused before or after decoding
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(GOOD_REQUEST)
        assert _read_responses(sock, 1) == [200]
        sock.sendall(refused + refused + GOOD_REQUEST + refused)
        assert _read_responses(sock, 4) == [503, 503, 200, 503]
        sock.sendall(GOOD_REQUEST)
        assert _read_responses(sock, 1) == [200]


def test_a_refused_request_whose_body_comes_later_is_refused_all_the_same(
    server: RunningServer,
) -> None:
    """Headers and half the body in one write, the rest later: refused (by the parser,
    or from its head while refusing), its body skipped, the connection kept."""
    request = _refused_request()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(GOOD_REQUEST)
        assert _read_responses(sock, 1) == [200]
        half = len(request) - len(NOT_JSON) // 2
        sock.sendall(request[:half])
        time.sleep(0.05)
        sock.sendall(request[half:])
        assert _read_responses(sock, 1) == [503]
        sock.sendall(GOOD_REQUEST)
        assert _read_responses(sock, 1) == [200]


def test_while_refusing_a_body_that_comes_later_is_dropped_without_the_parser(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While requests are being refused, a refused request whose head is whole but
    whose body comes in later reads is answered at once and its body dropped by
    length, unparsed; a request that follows in the body's last read is served."""
    from sordino.server.http_protocol import HttpProtocol

    parsed: list[bytes] = []
    bodies: list[int] = []
    on_headers, on_body = HttpProtocol.on_headers_complete, HttpProtocol.on_body

    def counting(self: HttpProtocol) -> None:
        parsed.append(self.url)
        on_headers(self)

    def counting_body(self: HttpProtocol, body: bytes) -> None:
        bodies.append(len(body))
        on_body(self, body)

    monkeypatch.setattr(HttpProtocol, "on_headers_complete", counting)
    monkeypatch.setattr(HttpProtocol, "on_body", counting_body)
    before = _rejected(server, "shed")
    request = _refused_request()
    body_at = len(request) - len(NOT_JSON)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(GOOD_REQUEST)
        assert _read_responses(sock, 1) == [200]
        sock.sendall(request)  # refused: the server is refusing now
        assert _read_responses(sock, 1) == [503]
        assert server.early_shed is not None and server.early_shed.refusing()
        parsed.clear()
        bodies.clear()
        sock.sendall(request[: body_at + 100])
        assert _read_responses(sock, 1) == [503]  # answered before its body is here
        for start in range(body_at + 100, len(request) - 100, 1000):
            sock.sendall(request[start : min(start + 1000, len(request) - 100)])
            time.sleep(0.01)
        sock.sendall(request[-100:] + GOOD_REQUEST)  # the body's end, then a request
        assert _read_responses(sock, 1) == [200]
        assert parsed == [INFER.encode()] and sum(bodies) == len(GOOD)  # only that one
    wait_for(lambda: _rejected(server, "shed") == before + 2, "2 refusals to be counted")


@pytest.mark.parametrize(
    "header",
    ["Transfer-Encoding: chunked", "Expect: 100-continue", "Connection: keep-alive"],
)
def test_requests_the_fast_path_does_not_read_are_left_to_the_parser(
    server: RunningServer, header: str
) -> None:
    """A framing or connection header sends the request down the parser's path, whose
    answer is the same refusal (chunked bodies are framed by the parser)."""
    if header.startswith("Transfer-Encoding"):
        request = (
            f"POST {INFER} HTTP/1.1\r\nHost: x\r\nX-Sordino-Priority: low\r\n"
            f"X-Sordino-Timeout: 1\r\n{header}\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        ).encode()
    else:
        request = _refused_request().replace(b"Host: x\r\n", f"Host: x\r\n{header}\r\n".encode())
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(GOOD_REQUEST)
        assert _read_responses(sock, 1) == [200]
        sock.sendall(request)
        assert _read_responses(sock, 1) == [503]
        if not header.startswith("Expect"):  # an Expect refusal closes the connection
            sock.sendall(GOOD_REQUEST)
            assert _read_responses(sock, 1) == [200]


def test_the_model_is_looked_up_once_past_the_headers(
    server: RunningServer, conn: http.client.HTTPConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transport finds the route once and the service takes it from there; only the
    header decision before the body (this module's subject) has a lookup of its own."""
    registry = server.runtime.registry
    lookups: list[str] = []
    for name in ("get", "route"):
        real = getattr(registry, name)

        def counting(*args: Any, _real: Any = real, _name: str = name) -> Any:
            lookups.append(_name)
            return _real(*args)

        monkeypatch.setattr(registry, name, counting)
    status, _, _ = _post(conn, GOOD)
    assert status == 200
    assert lookups.count("route") == 1
    assert lookups.count("get") <= 1  # EarlyShed's, from the headers
