"""sordino's own HTTP protocol (server/http_protocol.py) as uvicorn runs it.

Raw sockets against a real server: pipelined requests of both kinds answered in
order, ``Expect: 100-continue`` on inference, HEAD and chunked answers through the
ASGI bridge, a malformed request, and the server-state contract uvicorn relies on
(connections and tasks tracked, requests counted, its default headers written).
"""

from __future__ import annotations

import ast
import gc
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

import sordino.server
from sordino.config import RuntimeConfig
from sordino.models.repository import builtin_sources
from sordino.server.http_protocol import HttpProtocol
from sordino.testing import RunningServer, serve_in_thread
from tests.conftest import thread_isolated
from tests.server.helpers import Gate
from tests.waiting import wait_for

MODEL = "digits-classifier"
INFER = f"/v2/models/{MODEL}/infer"
BODY = orjson.dumps(
    {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}
)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    sources = thread_isolated([s for s in builtin_sources() if s.name == MODEL])
    with serve_in_thread(RuntimeConfig(), sources) as running:
        yield running


def _connect(server: RunningServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)


def _infer(extra: str = "") -> bytes:
    head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\n{extra}Content-Length: {len(BODY)}\r\n\r\n"
    return head.encode() + BODY


def _responses(sock: socket.socket, count: int) -> list[tuple[bytes, bytes]]:
    """The next ``count`` (head, body) on ``sock``; bodies by Content-Length or chunked."""
    data, answers = b"", []
    while len(answers) < count:
        end = data.find(b"\r\n\r\n")
        if end >= 0:
            head = data[:end].lower()
            if head.startswith(b"http/1.1 100 "):
                data = data[end + 4 :]
                continue
            rest = data[end + 4 :]
            if b"transfer-encoding: chunked" in head:
                close = rest.find(b"0\r\n\r\n")
                if close >= 0:
                    answers.append((head, rest[:close]))
                    data = rest[close + 5 :]
                    continue
            elif b"content-length:" in head:
                length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
                if len(rest) >= length:
                    answers.append((head, rest[:length]))
                    data = rest[length:]
                    continue
        chunk = sock.recv(65536)
        assert chunk, f"closed after {len(answers)} answers: {data!r}"
        data += chunk
    return answers


def _status(head: bytes) -> int:
    return int(head[9:12])


def test_pipelined_requests_of_both_kinds_are_answered_in_order(server: RunningServer) -> None:
    """Inference (answered on the protocol) and other routes (through Starlette) sent in
    one write come back in the order sent."""
    ready = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    missing = b"GET /v2/nothing HTTP/1.1\r\nHost: x\r\n\r\n"
    with _connect(server) as sock:
        sock.sendall(_infer() + ready + _infer() + missing + _infer())
        answers = _responses(sock, 5)
    assert [_status(head) for head, _ in answers] == [200, 200, 200, 404, 200]
    for head, body in (answers[0], answers[2], answers[4]):
        assert b"content-type: application/json" in head
        assert orjson.loads(body)["model_name"] == MODEL
    assert b"no endpoint /v2/nothing" in answers[3][1]


def test_inference_answers_carry_uvicorns_default_headers(server: RunningServer) -> None:
    with _connect(server) as sock:
        sock.sendall(_infer())
        [(head, _)] = _responses(sock, 1)
    assert b"\r\ndate: " in head and b"\r\nserver: uvicorn" in head


def test_expect_100_continue_on_inference_waits_for_the_body(server: RunningServer) -> None:
    """The client sends its body only after ``100 Continue``; the answer follows."""
    head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
    head += f"Content-Length: {len(BODY)}\r\n\r\n"
    with _connect(server) as sock:
        sock.sendall(head.encode())
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(BODY)
        [(answer, body)] = _responses(sock, 1)
    assert _status(answer) == 200 and orjson.loads(body)["model_name"] == MODEL


def test_a_body_over_the_limit_is_refused_before_100_continue(server: RunningServer) -> None:
    limit = server.runtime.config.server.max_request_size
    head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
    head += f"Content-Length: {limit + 1}\r\n\r\n"
    with _connect(server) as sock:
        sock.sendall(head.encode())
        [(answer, body)] = _responses(sock, 1)
    assert _status(answer) == 413 and b"max_request_size" in body


def test_other_methods_on_the_inference_path_are_405(server: RunningServer) -> None:
    with _connect(server) as sock:
        sock.sendall(f"GET {INFER} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        [(head, body)] = _responses(sock, 1)
    assert _status(head) == 405 and b"allow: post" in head and b"use POST" in body


def test_head_through_the_bridge_has_no_body(server: RunningServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"HEAD /v2 HTTP/1.1\r\nHost: x\r\n\r\n" + _infer())
        data = b""
        while data.count(b"HTTP/1.1 ") < 2 or not data.endswith(b"}"):
            data += sock.recv(65536)
    first, second = data.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200 ") and first.endswith(b"\r\n\r\n")  # head only
    assert second.startswith(b"200 ")


def test_a_chunked_request_body_is_read_for_inference(server: RunningServer) -> None:
    head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    half = len(BODY) // 2
    chunks = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (
        half,
        BODY[:half],
        len(BODY) - half,
        BODY[half:],
    )
    with _connect(server) as sock:
        sock.sendall(head + chunks)
        [(answer, body)] = _responses(sock, 1)
    assert _status(answer) == 200 and orjson.loads(body)["model_name"] == MODEL


def test_a_body_of_tiny_chunks_is_kept_in_few_pieces(server: RunningServer) -> None:
    """One-byte chunks were kept as a ``bytes`` object each (~40 times the body in
    memory, and past what ``server.max_pending_body_size`` counts); now the small
    pieces after the first are copied together."""
    head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    chunks = b"".join(b"1\r\n%s\r\n" % BODY[i : i + 1] for i in range(len(BODY)))
    assert server.http is not None
    connections = server.http._server.server_state.connections

    def reading() -> list[HttpProtocol]:
        return [c for c in connections if c.cycle is not None and c.cycle.buffered == len(BODY)]

    with _connect(server) as sock:
        sock.sendall(head + chunks)
        wait_for(lambda: reading(), "the body to be read but its last chunk")
        [protocol] = reading()
        assert protocol.cycle is not None and len(protocol.cycle.body) <= 2
        sock.sendall(b"0\r\n\r\n")
        [(answer, body)] = _responses(sock, 1)
    assert _status(answer) == 200 and orjson.loads(body)["model_name"] == MODEL


def test_a_malformed_request_is_answered_400_and_closed(server: RunningServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"POST /v2 HTTP/1.1\r\nContent-Length: x\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 400 ") and b"connection: close" in data


def test_http_1_0_is_answered_and_closed(server: RunningServer) -> None:
    head = f"POST {INFER} HTTP/1.0\r\nContent-Length: {len(BODY)}\r\n\r\n".encode()
    with _connect(server) as sock:
        sock.sendall(head + BODY)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 ") and b"connection: close" in data


def test_uvicorns_server_state_tracks_connections_and_counts_requests(
    server: RunningServer,
) -> None:
    """The contract uvicorn's graceful shutdown relies on: an open connection is in
    ``server_state.connections`` until it closes, answers count in ``total_requests``."""

    def ours() -> list[HttpProtocol]:
        return [
            o
            for o in gc.get_objects()
            if isinstance(o, HttpProtocol) and o.server and o.server[1] == server.port
        ]

    with _connect(server) as sock:
        sock.sendall(_infer())
        _responses(sock, 1)
        [protocol] = [p for p in ours() if p.transport is not None and not p.transport.is_closing()]
        state = protocol.server_state
        assert protocol in state.connections
        counted = state.total_requests
        sock.sendall(_infer() + b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
        _responses(sock, 2)
        wait_for(lambda: state.total_requests == counted + 2, "two more requests counted")
    wait_for(lambda: protocol not in state.connections, "the closed connection to be forgotten")
    wait_for(lambda: not state.tasks, "no request task left")


def test_nothing_private_of_uvicorn_is_imported() -> None:
    """The server package uses uvicorn's public ``Config``/``Server`` only."""
    package = Path(sordino.server.__file__).parent
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                if name.startswith("uvicorn"):
                    assert name == "uvicorn", f"{path.name} imports {name}"


def test_an_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout() -> None:
    """``server.keep_alive_timeout`` closes a connection idle after its answer (a
    fraction of a second is kept as given: uvicorn took whole seconds)."""
    sources = thread_isolated([s for s in builtin_sources() if s.name == MODEL])
    config = RuntimeConfig.model_validate({"server": {"keep_alive_timeout": "0.2s"}})
    with serve_in_thread(config, sources) as running, _connect(running) as sock:
        sock.sendall(_infer())
        [(head, _)] = _responses(sock, 1)
        assert _status(head) == 200 and b"connection: close" not in head
        assert sock.recv(65536) == b""  # closed by the server, not by this client


def test_once_stopping_every_answer_closes_its_connection() -> None:
    """After the listener closes, the answer being made and the next request on an idle
    kept-alive connection both say ``Connection: close``, and the server closes each
    connection after it: a client learns of the stop from an answer, never from a close
    that crosses its next request."""
    sources = thread_isolated([s for s in builtin_sources() if s.name == MODEL])
    with serve_in_thread(RuntimeConfig(), sources) as running:
        assert running.http is not None
        http = running.http
        with _connect(running) as busy, _connect(running) as idle:
            idle.sendall(_infer())
            [(head, _)] = _responses(idle, 1)
            assert _status(head) == 200 and b"connection: close" not in head
            with Gate(running, MODEL) as gate:
                busy.sendall(_infer())
                assert gate.entered.wait(30)

                async def stop_accepting() -> None:
                    http.stop_accepting()

                running.call(stop_accepting())
                gate.release()
                [(head, _)] = _responses(busy, 1)
                assert _status(head) == 200 and b"connection: close" in head
                assert busy.recv(65536) == b""
            idle.sendall(_infer())
            [(head, _)] = _responses(idle, 1)
            assert _status(head) == 200 and b"connection: close" in head
            assert idle.recv(65536) == b""


def _cancelled(server: RunningServer) -> int:
    """Requests refused because their client left before the service had them
    (``sordino_requests_total``, outcome ``rejected``, reason ``cancelled``)."""
    with _connect(server) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        [(_, body)] = _responses(sock, 1)
    return sum(
        int(float(line.rsplit(b" ", 1)[1]))
        for line in body.splitlines()
        if line.startswith(b"sordino_requests_total{")
        and b'outcome="rejected"' in line
        and b'reason="cancelled"' in line
    )


def test_a_body_that_comes_in_pieces_is_answered_once_whole(server: RunningServer) -> None:
    """The request starts when its body is whole (no task waits for it meanwhile): a
    body sent in two writes with a pause between them is answered like one sent whole."""
    request = _infer()
    split = len(request) - len(BODY) // 2
    with _connect(server) as sock:
        sock.sendall(request[:split])
        time.sleep(0.05)  # the server reads the first part alone (not needed to pass)
        sock.sendall(request[split:])
        [(head, body)] = _responses(sock, 1)
        assert _status(head) == 200 and orjson.loads(body)["outputs"]


def test_a_body_past_the_high_water_mark_is_read_by_the_task(server: RunningServer) -> None:
    """A body larger than what is buffered before reading pauses (64 KiB) is read by
    the request's task as it comes, as before, and answered."""
    document = orjson.loads(BODY)
    document["id"] = "x" * 200_000
    body = orjson.dumps(document)
    head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    with _connect(server) as sock:
        sock.sendall(head.encode() + body)
        [(answer_head, answer)] = _responses(sock, 1)
        assert _status(answer_head) == 200 and orjson.loads(answer)["id"] == document["id"]


def test_a_client_that_leaves_mid_body_is_counted_cancelled(server: RunningServer) -> None:
    """A request whose client leaves before its body is whole is counted once, refused
    as cancelled, as when a task was reading its body."""
    before = _cancelled(server)
    request = _infer()
    with _connect(server) as sock:
        sock.sendall(request[: len(request) - 10])
        time.sleep(0.05)  # the server reads the first part alone (not needed to pass)
    wait_for(lambda: _cancelled(server) == before + 1, "the request counted cancelled")


# What `curl --http2 -d @request.json http://…` sends: an h2c proposal on a POST with a body.
H2C = (
    "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
    "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
)


def _chunked_upgrade() -> bytes:
    head = f"POST {INFER} HTTP/1.1\r\nHost: x\r\n{H2C}Transfer-Encoding: chunked\r\n\r\n"
    return head.encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)


@pytest.mark.parametrize(
    "pieces",
    [
        pytest.param([_infer(H2C)], id="content-length"),
        pytest.param([_infer(H2C)[:120], _infer(H2C)[120:300], _infer(H2C)[300:]], id="pieces"),
        pytest.param([_chunked_upgrade()], id="chunked"),
    ],
)
def test_an_upgrade_proposal_is_ignored_and_its_body_read(
    server: RunningServer, pieces: list[bytes]
) -> None:
    """No protocol switch is served, so a request proposing one (h2c, as curl --http2
    sends on every request) is answered as plain HTTP/1.1 with its body — the parser
    alone ends it at its headers (server/ignored_upgrade.py)."""
    with _connect(server) as sock:
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(0.02)  # each piece in a read of its own (not needed to pass)
        [(head, body)] = _responses(sock, 1)
    assert _status(head) == 200, body
    assert orjson.loads(body)["model_name"] == MODEL


def test_requests_after_an_ignored_upgrade_are_parsed_as_before(server: RunningServer) -> None:
    """What follows an upgrade proposal on the connection — with and without a body,
    pipelined in the same write — is answered in order, nothing read as a request twice."""
    ready = f"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n{H2C}\r\n".encode()
    with _connect(server) as sock:
        sock.sendall(_infer(H2C) + _infer() + ready + _infer(H2C) + _infer())
        answers = _responses(sock, 5)
        sock.sendall(_infer())  # the connection still serves
        answers += _responses(sock, 1)
    assert [_status(head) for head, _ in answers] == [200] * 6
    assert [orjson.loads(body)["model_name"] for _, body in answers[:2] + answers[3:]] == [
        MODEL
    ] * 5


def test_a_client_that_pipelines_without_reading_is_read_no_further(
    server: RunningServer,
) -> None:
    """A client that sends request after request on one connection and reads none of the
    answers: the server stops reading it once its answers are not being read, instead of
    queueing what it sends (each answer let a whole read of requests more in, and the
    answers piled up unsent: 4 GB in 40 s against `sordino start`). When the client
    reads, every request it sent is answered, in order."""
    rows = 32
    body = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "pixels",
                    "datatype": "FP32",
                    "shape": [rows, 64],
                    "data": [0.5] * (rows * 64),
                }
            ]
        }
    )
    request = f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    request_bytes = request.encode() + body
    cap = 100 * 2**20
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect
        sock.connect(("127.0.0.1", server.port))
        sock.settimeout(3.0)
        sent = 0
        try:
            while sent * len(request_bytes) < cap:
                sock.sendall(request_bytes)
                sent += 1
        except TimeoutError:
            pass  # the server stopped reading: what it has not read fills the buffers
        # Before: the whole 100 MB went in (the server read on, whatever it could not send).
        assert sent * len(request_bytes) < cap / 2, f"{sent} requests read"
        sock.settimeout(30.0)
        answers = _responses(sock, sent)  # the last one may be partly sent: not counted
        assert [_status(head) for head, _ in answers] == [200] * sent
        assert all(
            len(orjson.loads(answer)["outputs"][0]["data"]) == rows * 10 for _, answer in answers
        )


def _head_refused(sock: socket.socket) -> bytes:
    """What the server answered a head past the limit (it may reset the connection
    after its answer, with bytes unread)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


@pytest.mark.parametrize("shape", ["many headers", "one long header", "a long url"])
def test_a_head_past_the_limit_is_answered_431_and_closed(
    server: RunningServer, shape: str
) -> None:
    """``server.max_header_size`` (64 KiB): httptools has no bound of its own, so a
    client sending headers without end grew the server until the header timeout cut it
    off (4.7 GB in those 10 s). The head is now refused as it passes the limit, whether
    it comes in one read or many, in whole lines or in one that never ends."""
    line = b"POST " + INFER.encode() + b" HTTP/1.1\r\n"
    start, piece = {
        "many headers": (line, b"x-filler: " + b"a" * 90 + b"\r\n"),
        "one long header": (line + b"x-long: ", b"a" * 100),
        "a long url": (b"GET /v2/health/ready?", b"a" * 100),
    }[shape]
    with _connect(server) as sock:
        sock.sendall(start)
        try:
            for _ in range(2000):  # 200 KB: past the limit, in reads of ~1 KB to 200 KB
                sock.sendall(piece * 10)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused and closed while this was still sending
        answer = _head_refused(sock)
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), answer[:200]
    assert b"server.max_header_size" in answer


def test_a_head_past_the_limit_in_one_read_is_answered_431(server: RunningServer) -> None:
    headers = b"".join(b"x-h%d: %s\r\n" % (i, b"b" * 200) for i in range(400))  # ~84 KB
    with _connect(server) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\n" + headers + b"\r\n")
        answer = _head_refused(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]


def test_a_large_head_under_the_limit_is_served(server: RunningServer) -> None:
    """60 KB of headers, sent in pieces and pipelined after another request: served."""
    headers = "".join(f"x-h{i}: {'c' * 100}\r\n" for i in range(550))
    with _connect(server) as sock:
        request = _infer(headers)
        sock.sendall(_infer() + request[:30_000])
        time.sleep(0.05)  # another read (not needed to pass)
        sock.sendall(request[30_000:])
        answers = _responses(sock, 2)
    assert [_status(head) for head, _ in answers] == [200, 200]
