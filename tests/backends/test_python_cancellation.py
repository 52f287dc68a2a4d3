"""A client's cancellation reaches a Triton Python model that is not decoupled.

As on Triton, ``request.is_cancelled()`` turns true while ``execute`` runs when the
request's client cancels its gRPC call or drops its HTTP connection; the request ends
cancelled, and the other requests of the same batch get their responses. The model
here waits (bounded) in ``execute`` until each request with X > 0 is cancelled, and
answers each request with [its is_cancelled(), the batch's size, how many of the
batch were cancelled]; it runs in a worker process and in a thread.
"""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from sordino.config import RuntimeConfig
from sordino.models.repository import scan_repository
from sordino.testing import RunningServer, serve_in_thread
from tests.waiting import wait_for

WAITS = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]

    def execute(self, requests):
        tags = [int(pb_utils.get_input_tensor_by_name(r, "X").as_numpy()[0, 0]) for r in requests]
        for tag in tags:
            open(os.path.join(self.folder, f"running-{tag}"), "w").close()
        waiting = [r for r, tag in zip(requests, tags) if tag > 0]
        give_up = time.monotonic() + 20
        while not all(r.is_cancelled() for r in waiting) and time.monotonic() < give_up:
            time.sleep(0.005)
        seen = [r.is_cancelled() for r in requests]
        for tag, cancelled in zip(tags, seen):
            if cancelled:
                open(os.path.join(self.folder, f"cancelled-{tag}"), "w").close()
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", np.array([[int(c), len(requests), sum(seen)]], np.int32))]
            )
            for c in seen
        ]
"""

# Two requests wait (up to 5 s) for each other: one batch, as Triton's dynamic batcher.
CONFIG = """
backend: "python"
max_batch_size: 4
dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 5000000 }
input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_INT32, dims: [ 3 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("repo")
    for name, yaml in (
        ("waits", ""),
        ("waits_thread", "backend: python\nisolation: thread\n"),
        ("waits_alone", ""),
    ):
        (root / name / "1").mkdir(parents=True)
        config = CONFIG if name != "waits_alone" else CONFIG.replace("[ 2 ]", "[ 1 ]")
        (root / name / "config.pbtxt").write_text(config)
        (root / name / "1" / "model.py").write_text(WAITS)
        if yaml:
            (root / name / "config.yaml").write_text(yaml)
    config = RuntimeConfig.model_validate({"scheduler": {"mode": "manual"}})
    with serve_in_thread(config, scan_repository(root)) as running:
        yield running


def _marker(server: RunningServer, model: str, name: str) -> Path:
    return Path(server.runtime.get(model, None).source.path).parent.parent / name


def _inputs(value: int) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    return [tensor]


def _cancelled(server: RunningServer, model: str) -> int:
    return int(server.runtime.get(model, None).scheduler.statistics().cancelled)


@pytest.mark.parametrize("model", ["waits", "waits_thread"])
def test_a_grpc_cancel_reaches_is_cancelled_and_spares_the_batch(
    server: RunningServer, model: str
) -> None:
    """Two requests run as one batch; the client of one cancels its call while execute
    runs: that request's is_cancelled() turns true and it ends cancelled, the other's
    stays false and it gets its response."""
    tag = 11 if model == "waits" else 21
    before = _cancelled(server, model)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    other: queue.Queue[Any] = queue.Queue()
    try:
        call = client.async_infer(
            model, _inputs(tag), lambda result, error: answers.put((result, error))
        )
        threading.Thread(
            target=lambda: other.put(client.infer(model, _inputs(0))), daemon=True
        ).start()
        wait_for(_marker(server, model, f"running-{tag}").exists, "the batch to run")
        call.cancel()
        result = other.get(timeout=30)
        assert result.as_numpy("Y").tolist() == [[0, 2, 1]]  # not cancelled, batch of 2
        assert _marker(server, model, f"cancelled-{tag}").exists()
        _, error = answers.get(timeout=30)
        assert isinstance(error, InferenceServerException)
        assert "CANCELLED" in str(error.status())
        wait_for(lambda: _cancelled(server, model) > before, "the request counted cancelled")
    finally:
        client.close()


def test_an_http_client_leaving_reaches_is_cancelled(server: RunningServer) -> None:
    """The HTTP client drops its connection while execute runs: is_cancelled() turns
    true, the request ends cancelled, and the model serves the next request."""
    before = _cancelled(server, "waits_alone")
    host, port = server.url.removeprefix("http://").split(":")
    body = b'{"inputs":[{"name":"X","shape":[1,1],"datatype":"INT32","data":[31]}]}'
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(
            b"POST /v2/models/waits_alone/infer HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        wait_for(_marker(server, "waits_alone", "running-31").exists, "the batch to run")
    wait_for(
        _marker(server, "waits_alone", "cancelled-31").exists,
        "the model to see is_cancelled() after the client left",
    )
    wait_for(lambda: _cancelled(server, "waits_alone") > before, "the request counted cancelled")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert client.infer("waits_alone", _inputs(0)).as_numpy("Y").tolist() == [[0, 1, 0]]
    finally:
        client.close()
