"""A client's cancellation reaches a Triton Python model that is not decoupled.

As on Triton, ``request.is_cancelled()`` turns true while ``execute`` runs when the
request's client cancels its gRPC call or drops its HTTP connection; the request ends
cancelled, and the other requests of the same batch get their responses. The model
here waits (bounded) in ``execute`` until each request with X > 0 is cancelled, and
answers each request with [its is_cancelled(), the batch's size, how many of the
batch were cancelled] (``tests/fixtures/triton_python_cancel``); it runs in a worker
process, in a thread and (its actor's methods) as the Ray executor runs it.
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

CANCEL = Path(__file__).parent.parent / "fixtures" / "triton_python_cancel"
"""waits (two requests a batch) and waits_alone: the models bench/triton_python_cancel.py
also serves on Triton itself."""
WAITS = (CANCEL / "waits" / "1" / "model.py").read_text()
CONFIG = (CANCEL / "waits" / "config.pbtxt").read_text()


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


def test_a_ray_actor_tells_execute_of_a_cancellation(tmp_path: Path) -> None:
    """The Ray executor's actor (its own methods, in this process; the cluster test is
    in tests/execution/test_ray_executor.py): a cancel call naming a request of the batch
    running turns its is_cancelled() true; one made before its batch started counts when
    it starts; one for a batch that ended is dropped."""
    from sordino.backends.base import BackendOptions
    from sordino.backends.python.backend import PythonBackend
    from sordino.execution.ray_actor import ModelActor
    from sordino.inference import RequestFacts

    (tmp_path / "waits" / "1").mkdir(parents=True)
    (tmp_path / "waits" / "config.pbtxt").write_text(CONFIG)
    (tmp_path / "waits" / "1" / "model.py").write_text(WAITS)
    backend = PythonBackend(BackendOptions(name="waits", version="1"))
    backend.load(tmp_path / "waits" / "1" / "model.py")
    actor = ModelActor()
    actor._backend = backend
    facts = (RequestFacts(id="a"), RequestFacts(id="b"))
    answers: queue.Queue[Any] = queue.Queue()
    try:
        actor.cancel(7, 1)  # before batch 7 starts (the actor's threads race)
        batch = {"X": np.array([[41], [0]], np.int32)}
        threading.Thread(
            target=lambda: answers.put(actor.infer(batch, None, None, (1, 1), facts, 7)),
            daemon=True,
        ).start()
        wait_for((tmp_path / "waits" / "running-41").exists, "the batch to run")
        actor.cancel(7, 0)
        kind, outputs = answers.get(timeout=30)
        assert kind == "ok", outputs
        assert outputs["Y"].tolist() == [[1, 2, 2], [1, 2, 2]]
        actor.cancel(7, 0)  # batch 7 ended: dropped
        kind, outputs = actor.infer(
            {"X": np.array([[0]], np.int32)}, None, None, (1,), facts[:1], 8
        )
        assert outputs["Y"].tolist() == [[0, 1, 0]]
    finally:
        backend.unload()
