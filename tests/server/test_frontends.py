"""``server.frontends: 2``: two front-end processes on the port, the engine reached over its link.

One module-scoped server (the engine on a thread of this process, its two front ends real
processes); the engine reads no client connection, so every connection lands on a front
end (which process holds one is read from the kernel, psutil). What the engine would
answer itself is the ``reference``: a one-process server (``server.frontends: 1``) on
another thread, serving the same models; answers are compared with its.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import psutil
import pytest

from sordino.config import RuntimeConfig
from sordino.models.repository import builtin_sources
from sordino.server import engine_link
from sordino.testing import RunningServer, serve_in_thread
from tests.conftest import thread_isolated
from tests.metrics import counter_sum
from tests.server.frontend_helpers import (
    any_connection,
    ask,
    digits_body,
    owner,
)
from tests.server.helpers import SIMPLE_BODY, SIMPLE_REQUEST, Gate, published_backlog, stats
from tests.waiting import wait_for

LIMIT = 1 << 20  # server.max_request_size here: a 413 is cheap to provoke


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    config = RuntimeConfig.model_validate(
        {"server": {"frontends": 2, "max_request_size": LIMIT, "shutdown_timeout": 10}}
    )
    with serve_in_thread(config, thread_isolated(builtin_sources())) as running:
        yield running


@pytest.fixture(scope="module")
def reference() -> Iterator[RunningServer]:
    """One process reading its own connections: what the engine answers without front ends."""
    config = RuntimeConfig.model_validate(
        {"server": {"frontends": 1, "max_request_size": LIMIT, "shutdown_timeout": 10}}
    )
    # The same models: an error that lists them must read the same.
    with serve_in_thread(config, thread_isolated(builtin_sources())) as running:
        yield running


def test_the_front_ends_accept_every_connection_and_the_engine_none(
    server: RunningServer,
) -> None:
    assert server.frontends is not None
    fronts = set(server.frontends.pids())
    assert len(fronts) == 2
    owners = set()
    for _ in range(24):  # new connections: the kernel spreads them over the listeners
        connection = any_connection(server)
        status, _, _ = ask(connection, "POST", "/v2/models/digits-classifier/infer", digits_body())
        assert status == 200
        assert connection.sock is not None
        owners.add(owner(server, connection.sock))
        connection.close()
    assert owners == fronts  # both front ends, never the engine
    engine = psutil.Process(os.getpid()).net_connections(kind="tcp")
    ports = (server.port, server.grpc_port)
    assert not [c for c in engine if c.laddr.port in ports and c.status == psutil.CONN_LISTEN]


def test_the_engine_holds_the_ports_another_program_cannot_take_them(
    server: RunningServer,
) -> None:
    for port in (server.port, server.grpc_port):
        stranger = socket.socket()
        stranger.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with pytest.raises(OSError), stranger:
            stranger.bind(("127.0.0.1", port))


def test_an_answer_through_a_front_end_equals_the_engines_own(
    server: RunningServer, reference: RunningServer
) -> None:
    answers = []
    for running in (server, reference):
        connection = any_connection(running)
        for seed in range(3):
            status, payload, headers = ask(
                connection, "POST", "/v2/models/digits-classifier/infer", digits_body(seed)
            )
            headers.pop("date")
            answers.append((seed, status, payload, headers))
        connection.close()
    through, own = answers[:3], answers[3:]
    assert through == own
    assert {a[1] for a in through} == {200}


TOO_MUCH_JSON = json.dumps(
    {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 120_000}]}
).encode()
"""600 kB of JSON, where a request to the digits classifier holds at most 64 rows of 64
values (512 kB as JSON): a front end parsed it whole before (400, its element count)."""

ERRORS: list[tuple[str, str, bytes | None, dict[str, str]]] = [
    ("POST", "/v2/models/nope/infer", digits_body(), {}),  # 404
    ("POST", "/v2/models/digits-classifier/versions/9/infer", digits_body(), {}),  # 404
    ("POST", "/v2/models/digits-classifier/infer", b"{oops", {}),  # 400
    ("POST", "/v2/models/digits-classifier/infer", b'{"inputs": [{"name": "x"}]}', {}),  # 400
    ("GET", "/v2/models/digits-classifier/infer", None, {}),  # 405
    ("POST", "/v2/models/digits-classifier/infer", b"0" * (LIMIT + 1), {}),  # 413
    # 413: more JSON than any request to the model needs, refused before it is parsed
    ("POST", "/v2/models/digits-classifier/infer", TOO_MUCH_JSON, {}),
    # 503: the queue timeout has passed before the request is admitted
    ("POST", "/v2/models/digits-classifier/infer", digits_body(), {"X-Sordino-Timeout": "1"}),
]


@pytest.mark.parametrize("request_", ERRORS, ids=lambda r: f"{r[0]} {r[1][:30]}")
def test_errors_through_a_front_end_are_the_engines_own(
    server: RunningServer,
    reference: RunningServer,
    request_: tuple[str, str, bytes | None, dict[str, str]],
) -> None:
    answers = []
    for running in (server, reference):
        connection = any_connection(running)
        status, payload, headers = ask(connection, *request_)
        headers.pop("date", None)
        if status == 503:
            # The engine's own listener may refuse this one from its headers (early_shed:
            # no body read, its own wording), where a front end sends it on and the
            # engine's admission refuses it; the waits in the messages differ anyway.
            payload, headers = b"", {"content-type": headers["content-type"]}
        answers.append((status, payload, headers))
        connection.close()
    assert answers[0] == answers[1]
    assert answers[0][0] >= 400


def test_a_client_that_leaves_cancels_its_request_in_the_engine(server: RunningServer) -> None:
    before = stats(server, "simple")
    with Gate(server, "simple") as gate:
        held: list[int] = []
        engine = any_connection(server)
        holder = threading.Thread(
            target=lambda: held.append(
                ask(engine, "POST", "/v2/models/simple/infer", SIMPLE_BODY)[0]
            )
        )
        holder.start()
        wait_for(gate.entered.is_set, "the held batch to start")
        leaving = any_connection(server)
        assert leaving.sock is not None
        leaving.sock.sendall(SIMPLE_REQUEST)
        wait_for(lambda: stats(server, "simple").queue.depth == 1, "the request to queue")
        leaving.close()
        wait_for(
            lambda: stats(server, "simple").cancelled == before.cancelled + 1,
            "the engine to cancel the request the front end sent",
        )
        gate.release()
        holder.join(30)
        assert held == [200]
        assert gate.rows == [1]  # the cancelled request never ran


def _shed_count(server: RunningServer) -> int:
    return counter_sum(server, "sordino_rejected_requests", lambda s: s["reason"] == "shed")


def test_the_front_end_refuses_from_the_engines_load_board(server: RunningServer) -> None:
    """A backlog the engine published is refused by the front end: the 503 the engine
    would give, without the request reaching the engine's scheduler (its own count of
    refusals does not move: the front end decided alone), and counted in the engine's
    metrics as its own listener's refusal is (``sordino_rejected_requests``)."""
    model = "digits-classifier"
    answers: list[int] = []

    def send(priority: str) -> None:
        connection = any_connection(server)
        status, _, _ = ask(
            connection, "POST", f"/v2/models/{model}/infer", digits_body(),
            {"X-Sordino-Priority": priority},
        )  # fmt: skip
        answers.append(status)
        connection.close()

    warm = any_connection(server)
    for _ in range(3):  # the engine learns how long a batch takes: its expected wait
        assert ask(warm, "POST", f"/v2/models/{model}/infer", digits_body(), {})[0] == 200
    warm.close()
    with Gate(server, model) as gate:
        senders = [threading.Thread(target=send, args=("high",))]
        senders[0].start()
        wait_for(gate.entered.is_set, "the held batch to start")
        senders += [threading.Thread(target=send, args=("low",)) for _ in range(8)]
        for sender in senders[1:]:
            sender.start()
        published_backlog(server, model, 8)
        before = stats(server, model).rejected
        counted = _shed_count(server)
        front = any_connection(server)
        status, payload, headers = ask(
            front, "POST", f"/v2/models/{model}/infer", digits_body(),
            {"X-Sordino-Priority": "low", "X-Sordino-Timeout": "1"},  # 1 µs: cannot be met
        )  # fmt: skip
        front.close()
        assert status == 503
        assert f"model {model}/1 is overloaded" in json.loads(payload)["error"]
        assert int(headers["retry-after"]) >= 1
        assert stats(server, model).rejected == before  # the engine never saw it
        wait_for(
            lambda: (
                counter_sum(server, "sordino_rejected_requests", lambda s: s["reason"] == "shed")
                == counted + 1
            ),
            "the engine to count the front end's refusal",
        )
        gate.release()
        for sender in senders:
            sender.join(30)
    assert answers.count(200) == 9


def test_other_routes_move_the_connection_to_the_engine(server: RunningServer) -> None:
    connection = any_connection(server)
    status, _, _ = ask(connection, "GET", "/v2/health/ready")  # its first request
    assert status == 200
    assert connection.sock is not None
    sock = connection.sock
    # The engine serves it from now on; the front end closes its copy of the socket a
    # moment after handing it over, and until then the kernel shows it in both.
    wait_for(lambda: owner(server, sock) == os.getpid(), "the front end to let go of it")
    status, metrics, _ = ask(connection, "GET", "/metrics")
    assert status == 200 and b"sordino" in metrics
    status, metadata, _ = ask(connection, "GET", "/v2")
    assert status == 200 and json.loads(metadata)["name"]
    status, _, _ = ask(connection, "POST", "/v2/models/digits-classifier/infer", digits_body())
    assert status == 200
    connection.close()


def test_a_large_first_request_moves_with_all_its_bytes(
    server: RunningServer, reference: RunningServer
) -> None:
    # Far more than one hand-over message (32 KiB): the bytes read go in several.
    body = json.dumps({"ready": True, "padding": "x" * 300_000}).encode()
    answers = []
    for running in (server, reference):
        connection = any_connection(running)
        assert connection.sock is not None
        connection.sock.sendall(
            b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        response = http.client.HTTPResponse(connection.sock)
        response.begin()
        answers.append((response.status, json.loads(response.read())))
        connection.close()
    assert answers[0] == answers[1]
    status, index = answers[0]
    assert status == 200 and any(entry["name"] == "digits-classifier" for entry in index)


def test_a_stream_works_on_a_connection_the_front_end_accepted(server: RunningServer) -> None:
    connection = any_connection(server)
    status, _, _ = ask(connection, "POST", "/v2/models/digits-classifier/infer", digits_body())
    assert status == 200  # answered over the link; the stream below moves the connection
    status, events, headers = ask(
        connection,
        "POST",
        "/v2/models/countdown/generate_stream",
        json.dumps({"COUNT": 3, "id": "g1"}).encode(),
        {"Content-Type": "application/json"},
    )
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    data = [json.loads(line[5:]) for line in events.decode().splitlines() if line[:5] == "data:"]
    assert [event["REMAINING"] for event in data] == [2, 1, 0]
    connection.close()


def test_a_pipelined_other_request_behind_inference_gets_a_clear_503(
    server: RunningServer,
) -> None:
    connection = any_connection(server)
    assert connection.sock is not None
    body = digits_body()
    connection.sock.sendall(
        b"POST /v2/models/digits-classifier/infer HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: %d\r\n\r\n%s"
        % (len(body), body)
        + b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    answers = b""
    while answers.count(b"HTTP/1.1") < 2 or not answers.endswith(b"}"):
        chunk = connection.sock.recv(65536)
        if not chunk:
            break
        answers += chunk
    assert answers.startswith(b"HTTP/1.1 200")
    assert b"HTTP/1.1 503" in answers and b"not supported" in answers
    connection.close()


def test_an_upgrade_proposal_through_a_front_end_is_served_with_its_body(
    server: RunningServer,
) -> None:
    """``curl --http2 -d …`` proposes h2c on a POST with a body: a front end (whose
    protocol is the engine's) answers it as plain HTTP/1.1, body read, and the next
    request on the connection too (server/ignored_upgrade.py)."""
    connection = any_connection(server)
    assert connection.sock is not None
    body = digits_body()
    request = (
        b"POST /v2/models/digits-classifier/infer HTTP/1.1\r\nHost: x\r\n"
        b"%sContent-Length: %d\r\n\r\n%s"
    )
    h2c = (
        b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        b"HTTP2-Settings: AAMAAABkAAQAAP__\r\n"
    )
    connection.sock.sendall(request % (h2c, len(body), body) + request % (b"", len(body), body))
    answers = b""
    while answers.count(b"model_name") < 2:
        chunk = connection.sock.recv(65536)
        assert chunk, answers
        answers += chunk
    assert answers.startswith(b"HTTP/1.1 200") and answers.count(b"HTTP/1.1 200") == 2
    connection.close()


def _binary(header: dict[str, object], *chunks: bytes) -> tuple[bytes, dict[str, str]]:
    """A body with the binary-data extension: the JSON header, then ``chunks``."""
    text = json.dumps(header).encode()
    return text + b"".join(chunks), {"Inference-Header-Content-Length": str(len(text))}


def _bytes_tensor(*items: bytes) -> bytes:
    return b"".join(len(item).to_bytes(4, "little") + item for item in items)


_INT16 = np.arange(16, dtype="<i4").tobytes()
_PIXELS = np.arange(128, dtype="<f4").reshape(2, 64) % 17
DECODED: list[tuple[str, str, bytes, dict[str, str]]] = [
    (
        "json, id, parameters, binary output",
        "digits-classifier",
        json.dumps(
            {
                "id": "r-1",
                "parameters": {"binary_data_output": True, "tag": "t"},
                "inputs": [
                    {
                        "name": "pixels",
                        "shape": [2, 64],
                        "datatype": "FP32",
                        "data": _PIXELS.tolist(),
                    }
                ],
            }
        ).encode(),
        {},
    ),
    (
        "binary inputs, one output binary, one json",
        "simple",
        *_binary(
            {
                "inputs": [
                    {
                        "name": n,
                        "shape": [1, 16],
                        "datatype": "INT32",
                        "parameters": {"binary_data_size": 64},
                    }
                    for n in ("INPUT0", "INPUT1")
                ],
                "outputs": [
                    {"name": "OUTPUT1", "parameters": {"binary_data": True}},
                    {"name": "OUTPUT0"},
                ],
            },
            _INT16,
            _INT16[::-1],
        ),
    ),
    (
        "bytes in json",
        "text-normalizer",
        json.dumps(
            {
                "inputs": [
                    {
                        "name": "text",
                        "shape": [2, 1],
                        "datatype": "BYTES",
                        "data": ["  Hello   World ", "MiXeD"],
                    }
                ]
            }
        ).encode(),
        {},
    ),
    (
        "bytes binary both ways",
        "text-normalizer",
        *_binary(
            {
                "parameters": {"binary_data_output": True},
                "inputs": [
                    {
                        "name": "text",
                        "shape": [2, 1],
                        "datatype": "BYTES",
                        "parameters": {"binary_data_size": 17},
                    }
                ],
            },
            _bytes_tensor(b" One  ", b"Two"),
        ),
    ),
    (
        "classification",
        "digits-classifier",
        json.dumps(
            {
                "inputs": [
                    {
                        "name": "pixels",
                        "shape": [2, 64],
                        "datatype": "FP32",
                        "data": _PIXELS.reshape(-1).tolist(),
                    }
                ],
                "outputs": [{"name": "probabilities", "parameters": {"classification": 3}}],
            }
        ).encode(),
        {},
    ),
    (
        "an input the model lacks",
        "digits-classifier",
        json.dumps(
            {
                "inputs": [
                    {"name": "pixelz", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}
                ]
            }
        ).encode(),
        {},
    ),
    (
        "a batch past max_batch_size",
        "digits-classifier",
        *_binary(
            {
                "inputs": [
                    {
                        "name": "pixels",
                        "shape": [65, 64],
                        "datatype": "FP32",
                        "parameters": {"binary_data_size": 65 * 64 * 4},
                    }
                ]
            },
            bytes(65 * 64 * 4),
        ),
    ),
]


@pytest.mark.parametrize("case", DECODED, ids=lambda c: c[0])
def test_a_request_the_front_end_decodes_is_answered_byte_for_byte_as_the_engine_does(
    server: RunningServer, reference: RunningServer, case: tuple[str, str, bytes, dict[str, str]]
) -> None:
    _, model, body, headers = case
    answers = []
    for running in (server, reference):
        connection = any_connection(running)
        status, payload, got = ask(connection, "POST", f"/v2/models/{model}/infer", body, headers)
        got.pop("date", None)
        answers.append((status, payload, got))
        connection.close()
    assert answers[0] == answers[1]
    assert answers[0][0] == (400 if case[0].startswith("a") else 200), answers[0][1]


def test_only_decoded_requests_reach_the_engine_and_a_malformed_body_none(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    for name in ("begin_decoded", "answer_infer"):
        real = getattr(engine_link, name)

        def spy(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(engine_link, name, spy)
    counted: list[tuple[Any, ...]] = []
    monkeypatch.setattr(server.runtime.service, "refused_unread", lambda *a: counted.append(a))
    connection = any_connection(server)
    path = "/v2/models/digits-classifier/infer"
    status, payload, _ = ask(connection, "POST", path, b'{"inputs": 3}')
    assert status == 400 and b"inputs" in payload
    assert calls == []
    wait_for(
        lambda: counted == [("digits-classifier", None, None, "malformed_body", 1)],
        "the engine to count the front end's 400",
    )
    assert ask(connection, "POST", path, digits_body())[0] == 200
    connection.close()
    assert calls == ["begin_decoded"]


def test_system_shared_memory_works_through_the_front_end(server: RunningServer) -> None:
    shm = pytest.importorskip("tritonclient.utils.shared_memory")
    tag = f"{os.getpid()}_{id(object())}"
    inputs = shm.create_shared_memory_region("fe_in", f"/sordino_fe_in_{tag}", 128)
    outputs = shm.create_shared_memory_region("fe_out", f"/sordino_fe_out_{tag}", 128)
    try:
        first = np.arange(16, dtype=np.int32).reshape(1, 16)
        shm.set_shared_memory_region(inputs, [first, first * 3])
        connection = any_connection(server)
        for name, key in (("fe_in", f"/sordino_fe_in_{tag}"), ("fe_out", f"/sordino_fe_out_{tag}")):
            status, _, _ = ask(
                connection,
                "POST",
                f"/v2/systemsharedmemory/region/{name}/register",
                json.dumps({"key": key, "offset": 0, "byte_size": 128}).encode(),
            )
            assert status == 200
        connection.close()  # the registration moved that connection to the engine
        connection = any_connection(server)
        body = json.dumps(
            {
                "inputs": [
                    {
                        "name": n,
                        "shape": [1, 16],
                        "datatype": "INT32",
                        "parameters": {
                            "shared_memory_region": "fe_in",
                            "shared_memory_byte_size": 64,
                            "shared_memory_offset": offset,
                        },
                    }
                    for n, offset in (("INPUT0", 0), ("INPUT1", 64))
                ],
                "outputs": [
                    {
                        "name": n,
                        "parameters": {
                            "shared_memory_region": "fe_out",
                            "shared_memory_byte_size": 64,
                            "shared_memory_offset": offset,
                        },
                    }
                    for n, offset in (("OUTPUT0", 0), ("OUTPUT1", 64))
                ],
            }
        ).encode()
        status, payload, _ = ask(connection, "POST", "/v2/models/simple/infer", body)
        connection.close()
        assert status == 200, payload
        entries = json.loads(payload)["outputs"]
        assert [e["parameters"]["shared_memory_byte_size"] for e in entries] == [64, 64]
        added = shm.get_contents_as_numpy(outputs, np.int32, [1, 16], 0)
        subtracted = shm.get_contents_as_numpy(outputs, np.int32, [1, 16], 64)
        assert added.tolist() == (first * 4).tolist()
        assert subtracted.tolist() == (first - first * 3).tolist()
    finally:
        engine = any_connection(server)
        ask(engine, "POST", "/v2/systemsharedmemory/unregister", b"")
        engine.close()
        shm.destroy_shared_memory_region(inputs)
        shm.destroy_shared_memory_region(outputs)


def test_a_model_whose_result_cache_is_on_gets_the_body_through_the_front_end(
    server: RunningServer,
) -> None:
    cache = server.runtime.result_cache
    cache.enable("digits-classifier", True)
    try:
        connection = any_connection(server)
        hits = cache.hits
        answers = [
            ask(connection, "POST", "/v2/models/digits-classifier/infer", digits_body(7))[:2]
            for _ in range(2)
        ]
        connection.close()
        assert answers[0] == answers[1] and answers[0][0] == 200
        assert cache.hits == hits + 1  # the second was answered from the cache
    finally:
        cache.enable("digits-classifier", False)
