"""Connections that hold a descriptor and give nothing are closed; past a limit, refused fast.

Raw sockets against a real server: a silent connection, headers sent byte by byte too
slowly, a body that stops halfway; then a client address at its connection limit,
and the server at its total limit, while a client already connected goes on.
"""

from __future__ import annotations

import gc
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import httpx
import orjson
import pytest

from sordino.config import RuntimeConfig
from sordino.models.repository import builtin_sources
from sordino.server.http_protocol import HttpProtocol
from sordino.testing import RunningServer, serve_in_thread
from tests.conftest import thread_isolated
from tests.waiting import wait_for

MODEL = "digits-classifier"
INFER = f"/v2/models/{MODEL}/infer"
BODY = orjson.dumps(
    {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}
)
TIMEOUT_S = 0.5


def _serve(**server: object) -> Iterator[RunningServer]:
    config = RuntimeConfig.model_validate({"server": server})
    sources = thread_isolated([s for s in builtin_sources() if s.name == MODEL])
    with serve_in_thread(config, sources) as running:
        yield running


@pytest.fixture(scope="module")
def impatient() -> Iterator[RunningServer]:
    yield from _serve(header_timeout=TIMEOUT_S, body_timeout=TIMEOUT_S)


@pytest.fixture(scope="module")
def limited() -> Iterator[RunningServer]:
    yield from _serve(max_connections_per_client=3, header_timeout="60s")


@pytest.fixture(scope="module")
def crowded() -> Iterator[RunningServer]:
    yield from _serve(max_connections=4, header_timeout="60s")


def _connect(server: RunningServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _request(path: str, body: bytes, *, length: int | None = None) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n\r\n"
    ).encode() + body


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def _infer_on(sock: socket.socket) -> bytes:
    """Send one inference request on an open connection and read its whole response."""
    sock.sendall(_request(INFER, BODY))
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
                 .split(b":")[1])  # fmt: skip
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_a_silent_connection_is_closed_after_the_header_timeout(
    impatient: RunningServer,
) -> None:
    with _connect(impatient) as sock:
        began = time.monotonic()
        assert _read_until_closed(sock) == b""  # closed without a word: nothing was asked
        assert TIMEOUT_S * 0.8 <= time.monotonic() - began < 10


def test_a_silent_grpc_connection_is_closed_after_the_header_timeout(
    impatient: RunningServer,
) -> None:
    """gRPC says GOAWAY and closes a connection that never starts HTTP/2."""
    assert impatient.grpc_port is not None
    with socket.create_connection(("127.0.0.1", impatient.grpc_port), timeout=10) as sock:
        began = time.monotonic()
        assert b"handshake" in _read_until_closed(sock)
        assert TIMEOUT_S * 0.8 <= time.monotonic() - began < 10


def test_headers_that_trickle_in_are_answered_408(impatient: RunningServer) -> None:
    with _connect(impatient) as sock:
        began = time.monotonic()
        head = iter(_request(INFER, BODY))
        while time.monotonic() - began < TIMEOUT_S * 0.8:  # slow-loris: a byte at a time
            sock.sendall(bytes([next(head)]))
            time.sleep(0.05)
        response = _read_until_closed(sock)  # a byte every 50 ms does not reset the clock
        assert time.monotonic() - began < 10
    assert _status(response) == 408 and b"connection: close" in response
    assert impatient.runtime.metrics.registry.get_sample_value(
        "sordino_http_timeouts_total", {"phase": "header"}
    )


def test_a_body_that_stops_halfway_is_answered_408_and_closed(impatient: RunningServer) -> None:
    with _connect(impatient) as sock:
        sock.sendall(_request(INFER, BODY[:20], length=len(BODY)))
        began = time.monotonic()
        response = _read_until_closed(sock)
        assert TIMEOUT_S * 0.8 <= time.monotonic() - began < 10
    assert _status(response) == 408
    assert b"the request body did not arrive within 0.5 s" in response


def test_a_refused_body_that_stops_halfway_is_closed_at_the_body_timeout(
    impatient: RunningServer,
) -> None:
    """While requests are refused from their heads, a refused request's body is dropped
    as it comes: one that stops halfway holds the connection no longer than the body
    timeout (its 503 was already written, so no 408 follows it)."""
    refused = _request(INFER, BODY).replace(
        b"Host: x\r\n", b"Host: x\r\nX-Sordino-Priority: low\r\nX-Sordino-Timeout: 1\r\n"
    )
    with _connect(impatient) as sock:
        assert _status(_infer_on(sock)) == 200  # the scheduler learns a batch's time
        sock.sendall(refused)  # refused: the server is refusing now
        assert impatient.early_shed is not None
        wait_for(impatient.early_shed.refusing, "a refusal")
        sock.sendall(refused[: len(refused) - len(BODY) // 2])
        began = time.monotonic()
        response = _read_until_closed(sock)
        assert TIMEOUT_S * 0.8 <= time.monotonic() - began < 10
    assert response.count(b"HTTP/1.1 503 ") == 2 and b" 408 " not in response


def test_a_prompt_client_is_unaffected_by_the_timeouts(impatient: RunningServer) -> None:
    """Keep-alive requests well apart in time, each sent at once, all succeed."""
    with _connect(impatient) as sock:
        for _ in range(3):
            assert _status(_infer_on(sock)) == 200
            time.sleep(TIMEOUT_S * 1.5)  # idle between requests: the keep-alive timeout rules


def test_past_the_per_client_limit_a_new_connection_is_refused_fast(
    limited: RunningServer,
) -> None:
    """3 connections from 127.0.0.1 are its limit: the 4th gets 503 at once, the 1st goes on."""
    with _connect(limited) as served, _connect(limited) as idle, _connect(limited):
        assert _status(_infer_on(served)) == 200
        with _connect(limited) as extra:
            began = time.monotonic()
            response = _read_until_closed(extra)
            assert time.monotonic() - began < 2  # long before any timeout
        assert _status(response) == 503
        assert b"retry-after: 1" in response and b"connection: close" in response
        assert b"max_connections_per_client" in response
        assert _status(_infer_on(served)) == 200
        idle.close()

        def admitted_again() -> bool:
            with _connect(limited) as again:
                return _status(_infer_on(again)) == 200

        wait_for(admitted_again, "a connection to be admitted once one closed", 10)
    stats = limited.runtime.metrics.registry.get_sample_value(
        "sordino_http_connections_refused_total", {"scope": "per_client"}
    )
    assert stats is not None and stats >= 1


def test_past_the_total_limit_a_new_connection_is_refused(crowded: RunningServer) -> None:
    """The server-wide cap (4) holds whoever connects; an httpx client gets the 503."""
    held = [_connect(crowded) for _ in range(4)]
    try:
        assert _status(_infer_on(held[0])) == 200
        response = httpx.post(crowded.url + INFER, content=BODY, timeout=10)
        assert response.status_code == 503
        assert "max_connections" in response.json()["error"]
        assert _status(_infer_on(held[0])) == 200
    finally:
        for sock in held:
            sock.close()
    refused = crowded.runtime.metrics.registry.get_sample_value(
        "sordino_http_connections_refused_total", {"scope": "total"}
    )
    assert refused is not None and refused >= 1


_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
"""HTTP/2's connection preface and an empty SETTINGS frame: a gRPC connection begun."""


def test_past_the_total_limit_a_new_grpc_connection_is_closed(crowded: RunningServer) -> None:
    """server.max_connections holds the gRPC endpoint too (before, it had no limit: 5,000
    idle connections held 5,000 descriptors); the connections open go on."""
    held = [socket.create_connection(("127.0.0.1", crowded.grpc_port), timeout=10)]
    try:
        for _ in range(3):
            held.append(socket.create_connection(("127.0.0.1", crowded.grpc_port), timeout=10))
        for sock in held:
            sock.sendall(_PREFACE)
            assert sock.recv(9)[3:4] == b"\x04"  # the server's SETTINGS: served
        with socket.create_connection(("127.0.0.1", crowded.grpc_port), timeout=10) as extra:
            extra.sendall(_PREFACE)
            assert _read_until_closed(extra) == b""  # closed at once, nothing served
        with grpc.insecure_channel(crowded.grpc_url) as channel:
            ready = channel.unary_unary("/inference.GRPCInferenceService/ServerReady")
            with pytest.raises(grpc.RpcError) as refused:
                ready(b"", timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        for sock in held:
            sock.close()
    with grpc.insecure_channel(crowded.grpc_url) as channel:
        ready = channel.unary_unary("/inference.GRPCInferenceService/ServerReady")
        wait_for(lambda: _answers(ready), "a gRPC call once the connections closed")


def _answers(call: grpc.UnaryUnaryMultiCallable) -> bool:
    try:
        call(b"", timeout=5)
    except grpc.RpcError:
        return False
    return True


@pytest.fixture(scope="module")
def bodies_capped() -> Iterator[RunningServer]:
    yield from _serve(max_connections=6, max_pending_bodies=3, body_timeout="60s")


@pytest.fixture(scope="module")
def full() -> Iterator[RunningServer]:
    yield from _serve(max_connections=2, header_timeout="60s", monitoring_connections=0)


def test_slow_bodies_past_their_budget_make_room_for_new_clients(
    bodies_capped: RunningServer,
) -> None:
    """6 half-sent bodies at a limit of 6 connections would lock everyone out for the
    60 s body timeout; with 3 pending bodies at most, the oldest are answered 408."""
    held = [_connect(bodies_capped) for _ in range(6)]
    try:
        for sock in held:
            sock.sendall(_request(INFER, BODY[:20], length=len(BODY)))
            time.sleep(0.05)  # in order: the first sent waits longest
        evicted = _read_until_closed(held[0])
        assert _status(evicted) == 408 and b"server.max_pending_bodies" in evicted
        response = httpx.post(bodies_capped.url + INFER, content=BODY, timeout=10)
        assert response.status_code == 200, response.text
    finally:
        for sock in held:
            sock.close()


def test_bodies_sent_but_for_their_end_cannot_fill_the_memory() -> None:
    """Bodies sent fast but for their last byte each stay under every per-connection
    limit: before server.max_pending_body_size, 48 of 60 MB grew the server by 2.9 GB.
    Past the bytes limit the oldest are answered 408; the newest and a new client go on."""
    size = 256 * 1024
    for server in _serve(max_request_size=size, max_pending_body_size=3 * size, body_timeout="60s"):
        held = [_connect(server) for _ in range(5)]
        try:
            for sock in held:
                sock.sendall(_request(INFER, b"x" * (size - 1), length=size))
                time.sleep(0.05)  # in order: the first sent waits longest
            for sock in held[:2]:
                evicted = _read_until_closed(sock)
                assert _status(evicted) == 408, evicted
                assert b"server.max_pending_body_size" in evicted
            assert server.http is not None
            guard = server.http.guard
            wait_for(
                lambda g=guard: g.pending_body_bytes == 3 * (size - 1), "three bodies held whole"
            )
            response = httpx.post(server.url + INFER, content=BODY, timeout=10)
            assert response.status_code == 200, response.text
            held[-1].sendall(b"x")  # the last byte: a whole body, answered (a bad one)
            answer = held[-1].recv(65536)
            assert _status(answer) == 400, answer
        finally:
            for sock in held:
                sock.close()
        wait_for(lambda g=guard: g.pending_body_bytes == 0, "the bodies given up released")


def test_pending_bodies_must_fit_the_largest_request() -> None:
    with pytest.raises(ValueError, match="raise max_pending_body_size to at least"):
        RuntimeConfig.model_validate(
            {"server": {"max_request_size": "2GB", "max_pending_body_size": "1GiB"}}
        )


def test_a_body_slower_than_the_minimum_rate_is_cut_off_after_the_grace() -> None:
    for server in _serve(body_timeout="60s", body_rate_grace="0.5s", body_min_rate="1KiB"):
        with _connect(server) as sock:
            sock.sendall(_request(INFER, BODY[:20], length=len(BODY)))
            began = time.monotonic()
            response = _read_until_closed(sock)
            assert time.monotonic() - began < 10  # not the 60 s body timeout
        assert _status(response) == 408 and b"server.body_min_rate" in response


def test_monitoring_is_answered_when_the_connection_limit_is_reached(
    crowded: RunningServer,
) -> None:
    """At max_connections, /metrics and health still answer; anything else gets the 503."""
    held = [_connect(crowded) for _ in range(4)]
    try:
        with httpx.Client(base_url=crowded.url, timeout=10) as client:
            assert client.get("/metrics").status_code == 200
            assert client.get("/v2/health/ready").status_code == 200
        refused = httpx.post(crowded.url + INFER, content=BODY, timeout=10)
        assert refused.status_code == 503 and "max_connections" in refused.json()["error"]
        with _connect(crowded) as silent:  # sends nothing: the 503 after a short wait
            assert _status(_read_until_closed(silent)) == 503
    finally:
        for sock in held:
            sock.close()


def test_a_refused_connection_is_answered_even_when_none_may_linger(
    full: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the lingering refusals, a refused connection still gets its 503, not a reset."""
    monkeypatch.setattr("sordino.server.connection_guard.MAX_LINGERING", 0)
    held = [_connect(full) for _ in range(2)]
    try:
        with _connect(full) as extra:
            response = _read_until_closed(extra)
        assert _status(response) == 503 and b"max_connections" in response
    finally:
        for sock in held:
            sock.close()


@contextmanager
def _collector_off() -> Iterator[None]:
    """The cycle collector off (after a collection), so only what is freed at once goes."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _retained(server: RunningServer) -> int:
    """The protocols of ``server``'s connections still in memory. This server's only: with
    the collector off, the connections other servers of the session close meanwhile
    (keep-alive ones time out) stay too."""
    return sum(
        1
        for o in gc.get_objects()
        if isinstance(o, HttpProtocol) and (getattr(o, "server", None) or ("", 0))[1] == server.port
    )


def test_served_connections_are_freed_without_the_cyclic_gc(limited: RunningServer) -> None:
    """A connection that was served and closed must not sit in a reference cycle (its
    protocol and its last request's cycle, which holds the protocol) until the collector
    runs: a client that opens a connection a request left a dozen objects each."""
    with _collector_off():
        for _ in range(50):
            with _connect(limited) as sock:
                assert _status(_infer_on(sock)) == 200
        wait_for(lambda: _retained(limited) == 0, "the closed connections to be freed", 10)


def test_refused_connections_are_freed_without_the_cyclic_gc(full: RunningServer) -> None:
    """A refused connection's protocol must not sit in a reference cycle (with its
    parser and transport) until a full collection: hundreds piled up under pressure."""
    held = [_connect(full) for _ in range(2)]
    try:
        with _collector_off():
            for _ in range(100):
                with _connect(full) as refused:
                    assert _status(_read_until_closed(refused)) == 503
            # The 2 held connections, and refused ones still lingering (1 s) at most.
            wait_for(lambda: _retained(full) <= 2, "the refused connections to be freed", 10)
    finally:
        for sock in held:
            sock.close()
