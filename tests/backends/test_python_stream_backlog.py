"""A decoupled model streaming to a client that does not read: the server holds at most
``server.max_stream_backlog`` of its responses (``server.max_total_stream_backlog`` over
every stream), then ends the request, tells the model it is cancelled and drops the rest.

Before the bound, a model sending 1 MB responses to a client that never read grew the
server by 3 GB (everything it sent), over HTTP Server-Sent Events and gRPC streams alike.
"""

from __future__ import annotations

import queue
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from sordino.config import RuntimeConfig
from sordino.models.repository import scan_repository
from sordino.testing import RunningServer, serve_in_thread
from tests.waiting import wait_for

CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N", data_type: TYPE_INT32, dims: [ 3 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""

# N = (responses, ms between them, tag): 64 KiB responses from a thread of their own;
# once told the request is cancelled it writes cancelled-<tag> and stops.
FLOOD = """
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        for request in requests:
            asked = pb_utils.get_input_tensor_by_name(request, "N").as_numpy()
            args = (request, request.get_response_sender(), *(int(v) for v in asked))
            threading.Thread(target=self.send, args=args, daemon=True).start()
        return None

    def send(self, request, sender, n, pause_ms, tag):
        block = np.ones(16384, np.float32)
        for _ in range(n):
            if request.is_cancelled():
                open(os.path.join(self.folder, f"cancelled-{tag}"), "w").close()
                return
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", block)]))
            if pause_ms:
                time.sleep(pause_ms / 1000)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

MiB = 1 << 20


def _serve(tmp_path_factory: pytest.TempPathFactory, **bounds: int) -> Any:
    root = tmp_path_factory.mktemp("repo")
    (root / "flood" / "1").mkdir(parents=True)
    (root / "flood" / "config.pbtxt").write_text(CONFIG)
    (root / "flood" / "1" / "model.py").write_text(FLOOD)
    config = RuntimeConfig.model_validate({"server": bounds})
    return serve_in_thread(config, scan_repository(root))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with _serve(tmp_path_factory, max_stream_backlog=4 * MiB) as running:
        yield running


def _marker(server: RunningServer, tag: int) -> Path:
    loaded = server.runtime.get("flood", None)
    return Path(loaded.source.path).parent.parent / f"cancelled-{tag}"


def _silent_sse(server: RunningServer, tag: int, n: int = 100_000) -> socket.socket:
    """A ``generate_stream`` request whose client reads nothing (a small receive buffer)."""
    port = httpx.URL(server.url).port
    assert port is not None
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    body = b'{"N": [%d, 0, %d]}' % (n, tag)
    sock.sendall(
        b"POST /v2/models/flood/generate_stream HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    return sock


def _read_to_end(sock: socket.socket) -> bytes:
    sock.settimeout(60)
    got = bytearray()
    while b"0\r\n\r\n" not in got[-16:]:  # the chunked body's end
        data = sock.recv(1 << 20)
        if not data:
            break
        got += data
    sock.close()
    return bytes(got)


def _failures(server: RunningServer) -> int:
    return int(server.runtime.get("flood", None).scheduler.statistics().failed)


def test_an_http_client_that_does_not_read_is_cut_off_at_the_bound(server: RunningServer) -> None:
    before = _failures(server)
    sock = _silent_sse(server, 1)
    wait_for(_marker(server, 1).exists, "the model to be told the request is cancelled")
    wait_for(lambda: _failures(server) == before + 1, "the request to end as a failure")
    body = _read_to_end(sock)  # what it had not read, then the error event
    assert body.startswith(b"HTTP/1.1 200")
    assert b"its client did not read its stream" in body
    assert b"server.max_stream_backlog (4194304 bytes)" in body
    # What waited (under 4 MiB) reached the client before the error, nothing after it.
    assert body.count(b'"OUT":') <= 4 * MiB // (64 << 10) + 64


def test_a_grpc_client_that_does_not_read_is_cut_off_at_the_bound(server: RunningServer) -> None:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    reading = queue.Queue[None]()
    stalls = [1]

    def stalled(result: Any, error: Any) -> None:
        answers.put((result, error))
        if stalls:
            stalls.pop()
            reading.get(timeout=120)  # the client's stream reader stops here for a while

    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=stalled)
    tensor = grpcclient.InferInput("N", [3], "INT32")
    tensor.set_data_from_numpy(np.array([100_000, 0, 2], np.int32))
    client.async_stream_infer("flood", [tensor])
    try:
        wait_for(_marker(server, 2).exists, "the model to be told the request is cancelled")
    finally:
        reading.put(None)
    while True:
        _, error = answers.get(timeout=60)
        if error is not None:
            break
    client.stop_stream()
    client.close()
    assert "its client did not read its stream" in str(error)
    assert "server.max_stream_backlog" in str(error)


def test_the_total_bound_cuts_the_stream_that_passes_it(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The server's total (6 MiB here) under a stream's own bound (64 MiB): the stream
    that passes it is cut with the total's words; what it held is given back, so the next
    silent stream again gets up to the total before it is cut."""
    with _serve(
        tmp_path_factory, max_stream_backlog=64 * MiB, max_total_stream_backlog=6 * MiB
    ) as running:
        for tag in (3, 4):
            sock = _silent_sse(running, tag)
            wait_for(_marker(running, tag).exists, f"stream {tag} to be cut off")
            body = _read_to_end(sock)
            assert b"the server's clients did not read their streams" in body
            assert b"server.max_total_stream_backlog (6291456 bytes)" in body
            behind = re.search(rb"\(its client (\d+) bytes behind\)", body)
            assert behind is not None
            assert int(behind.group(1)) > 5 * MiB  # all of the total was this stream's


def test_a_client_that_reads_as_responses_come_gets_them_all(server: RunningServer) -> None:
    """150 responses of 64 KiB (9.4 MiB, over both bounds), 10 ms apart, read as they come."""
    events = 0
    with httpx.stream(
        "POST",
        f"{server.url}/v2/models/flood/generate_stream",
        json={"N": [150, 10, 5]},
        timeout=60,
    ) as response:
        for line in response.iter_lines():
            assert "error" not in line[:40], line[:200]
            events += line.startswith("data:")
    assert events == 150
    assert not _marker(server, 5).exists()
