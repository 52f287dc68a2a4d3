"""A request the stop's grace ran out on gets a 503 and one line in the log.

uvicorn cancels the tasks still running when its graceful shutdown's bound passes (the
front-end processes do the same after their drain). Before, each such request was
logged at ERROR with its traceback and answered "500 Internal Server Error".
"""

from __future__ import annotations

import logging
import socket

import orjson
import pytest

from sordino.config import RuntimeConfig
from sordino.models.repository import builtin_sources
from sordino.testing import serve_in_thread
from tests.conftest import thread_isolated
from tests.server.helpers import Gate
from tests.waiting import wait_for

MODEL = "digits-classifier"
BODY = orjson.dumps(
    {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}
)
REQUESTS = {
    "inference": f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\n"
    f"Content-Length: {len(BODY)}\r\n\r\n".encode()
    + BODY,
    # A route of the Starlette app: the model's readiness waits for nothing, so a
    # chunked body left open keeps its task reading (the ASGI receive).
    "other": f"POST /v2/repository/models/{MODEL}/load HTTP/1.1\r\nHost: x\r\n"
    "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n".encode(),
}


@pytest.mark.parametrize("kind", REQUESTS)
def test_a_request_cancelled_at_the_stop_is_answered_503(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    sources = thread_isolated([s for s in builtin_sources() if s.name == MODEL])
    config = RuntimeConfig.model_validate({"server": {"model_control_mode": "explicit"}})
    with serve_in_thread(config, sources) as running, Gate(running, MODEL) as gate:
        assert running.http is not None
        tasks = running.http._server.server_state.tasks
        with socket.create_connection(("127.0.0.1", running.port), timeout=30) as sock:
            sock.sendall(REQUESTS[kind])
            if kind == "inference":
                assert gate.entered.wait(30)
            else:
                wait_for(lambda: len(tasks) == 1, "the request's task to be reading its body")
            caplog.clear()

            async def cancel() -> int:
                for task in list(tasks):
                    task.cancel()  # as uvicorn does when its graceful bound passes
                return len(tasks)

            assert running.call(cancel()) == 1
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        gate.release()
    assert answer.startswith(b"HTTP/1.1 503 "), answer
    assert b"the server stopped before the request was answered" in answer
    assert b"retry-after: 1" in answer.lower()
    records = [r for r in caplog.records if r.name == "sordino.http"]
    assert [r.levelno for r in records] == [logging.WARNING], records
    assert records[0].exc_info is None
