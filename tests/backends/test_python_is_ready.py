"""A Python model's own readiness: Triton's optional ``TritonPythonModel.is_ready()``
(python_backend's README, "is_ready"; added after Triton 2.51, so read from its source
rather than measured side by side).

When a model defines it, ``GET /v2/models/<m>/ready``, gRPC ``ModelReady`` and the
server's readiness (HTTP, gRPC and ``/health``) ask it, on a thread that is not the
batch's; a ``bool`` is its answer, anything else or an exception is "not ready"; one
check at a time per instance, and one that takes longer than five seconds is "not
ready" for that check. Inference is not refused meanwhile (Triton does not either). A model's
``pb_utils.is_model_ready`` says the same (Triton's asks the server's model readiness).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient

from sordino.execution import instance_base
from sordino.inference import ModelKey
from sordino.models.repository import scan_repository
from sordino.testing import RunningServer, serve_in_thread
from tests.waiting import wait_for

MODEL = """
import asyncio
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]  # the model's folder, as on Triton

    def _file(self, name):
        return os.path.join(self.folder, name)

    def answer(self):
        with open(self._file("calls"), "a") as calls:
            calls.write("1\\n")
        while (mode := open(self._file("mode")).read().strip()) == "hang":
            time.sleep(0.05)
        if mode == "raise":
            raise RuntimeError("the feature store is down")
        if mode == "interrupt":
            raise KeyboardInterrupt()
        return {"ready": True, "not": False, "int": 1}[mode]

IS_READY

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            time.sleep(float(x[0]))  # X seconds: a busy model
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
"""

SYNC = """    def is_ready(self):
        return self.answer()
"""
ASYNC = """    async def is_ready(self):
        await asyncio.sleep(0)
        return self.answer()
"""
NONE = ""

ASKER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        ready = [pb_utils.is_model_ready(model_name="gate"),
                 pb_utils.is_model_ready(model_name="gate", model_version="1")]
        y = np.array(ready, dtype=np.float32)[:1] * 10 + np.array(ready, dtype=np.float32)[1:]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]) for _ in requests]
"""

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]
"""


def _model(root: Path, name: str, is_ready: str, *, thread: bool = False) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(CONFIG)
    (root / name / "1" / "model.py").write_text(MODEL.replace("IS_READY", is_ready))
    if thread:
        (root / name / "config.yaml").write_text("backend: python\nisolation: thread\n")
    (root / name / "mode").write_text("ready")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("repository")


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[RunningServer]:
    _model(root, "gate", SYNC)
    _model(root, "gate_thread", SYNC, thread=True)
    _model(root, "gate_async", ASYNC)
    _model(root, "plain", NONE)
    _model(root, "asker", NONE)
    (root / "asker" / "1" / "model.py").write_text(ASKER)
    with serve_in_thread(None, scan_repository(root)) as running:
        yield running


def _set(root: Path, name: str, mode: str) -> None:
    (root / name / "mode").write_text(mode)


def _ready(server: RunningServer, name: str) -> httpx.Response:
    return httpx.get(f"{server.url}/v2/models/{name}/ready", timeout=30)


def _server_ready(server: RunningServer) -> int:
    return httpx.get(f"{server.url}/v2/health/ready", timeout=30).status_code


def _infer(server: RunningServer, name: str, seconds: float = 0.0) -> httpx.Response:
    body = {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [seconds]}]}
    return httpx.post(f"{server.url}/v2/models/{name}/infer", json=body, timeout=60)


@pytest.mark.parametrize("name", ["gate", "gate_thread"])
def test_is_ready_false_makes_the_model_and_the_server_not_ready(
    server: RunningServer, root: Path, name: str
) -> None:
    """A worker process and a thread instance alike, over HTTP, gRPC and /health; the
    model still answers its requests meanwhile; ready again once is_ready says so."""
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        assert _ready(server, name).status_code == 200 and _server_ready(server) == 200
        assert grpc.is_model_ready(name) and grpc.is_server_ready()
        _set(root, name, "not")
        try:
            answer = _ready(server, name)
            assert answer.status_code == 503
            assert "is_ready() returned False" in answer.json()["error"]
            assert _server_ready(server) == 503
            assert not grpc.is_model_ready(name) and not grpc.is_server_ready()
            health = httpx.get(f"{server.url}/health", timeout=30).json()
            assert health["ready"] is False and f"{name}/1" in health["failing"]
            # Another model is ready all along; this one still serves its requests.
            assert _ready(server, "plain").status_code == 200 and grpc.is_model_ready("plain")
            assert _infer(server, name).status_code == 200
        finally:
            _set(root, name, "ready")
        assert _ready(server, name).status_code == 200 and _server_ready(server) == 200
        assert grpc.is_model_ready(name) and grpc.is_server_ready()
    finally:
        grpc.close()


def test_only_a_model_with_is_ready_is_asked(server: RunningServer) -> None:
    """Without ``is_ready`` nothing is asked (Triton: no IPC); its worker reads the pipe
    between batches only, as before."""
    executor = server.runtime.executor
    for name, asked in (("gate", True), ("gate_async", True), ("plain", False)):
        instance = executor.instance(ModelKey(name, "1"), 0)
        assert instance is not None and instance.checks_ready is asked, name


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("int", "is_ready() must return a boolean value, not int"),
        ("raise", "is_ready() raised RuntimeError: the feature store is down"),
        ("not", "is_ready() returned False"),
    ],
)
def test_async_is_ready_and_answers_that_are_not_ready(
    server: RunningServer, root: Path, mode: str, why: str
) -> None:
    """``async def is_ready`` runs on the model's loop; a non-bool (even 1) or an exception
    is not ready, saying which."""
    assert _ready(server, "gate_async").status_code == 200
    _set(root, "gate_async", mode)
    try:
        answer = _ready(server, "gate_async")
        assert answer.status_code == 503 and why in answer.json()["error"]
    finally:
        _set(root, "gate_async", "ready")
    assert _ready(server, "gate_async").status_code == 200


def test_a_busy_model_answers_its_readiness_at_once(server: RunningServer) -> None:
    """The check does not wait for the running batch (3 s): the worker reads the pipe on
    a thread of its own and runs is_ready on another."""
    busy = threading.Thread(target=_infer, args=(server, "gate", 3.0))
    busy.start()
    try:
        time.sleep(0.5)  # the batch is running by now
        started = time.monotonic()
        assert _ready(server, "gate").status_code == 200
        assert time.monotonic() - started < 2.0  # generous: the batch has 2.5 s to go
    finally:
        busy.join(30)


def test_a_hanging_is_ready_is_asked_once_and_not_ready_meanwhile(
    server: RunningServer, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check that outlasts the bound (Triton's 5 s; 0.5 s here) is not ready; checks
    asked meanwhile wait for the same call rather than asking again."""
    monkeypatch.setattr(instance_base, "READY_CHECK_S", 0.5)
    calls = root / "gate" / "calls"
    calls.write_text("")
    _set(root, "gate", "hang")
    try:
        answers: list[httpx.Response] = []
        askers = [
            threading.Thread(target=lambda: answers.append(_ready(server, "gate")))
            for _ in range(3)
        ]
        for asker in askers:
            asker.start()
        for asker in askers:
            asker.join(30)
        assert [a.status_code for a in answers] == [503, 503, 503]
        assert all("did not answer within 0.5 s" in a.json()["error"] for a in answers)
        assert _ready(server, "gate").status_code == 503
        assert calls.read_text().count("1") == 1  # one call, still running
    finally:
        _set(root, "gate", "ready")
    wait_for(lambda: _ready(server, "gate").status_code == 200, "ready once is_ready returns")


def test_is_model_ready_from_a_model_asks_the_models_own_check(
    server: RunningServer, root: Path
) -> None:
    """BLS ``is_model_ready`` (with and without a version) is False while the model's own
    ``is_ready()`` says no, as Triton's asks the model's readiness, not only its load."""

    def asked() -> list[float]:
        answer = _infer(server, "asker")
        assert answer.status_code == 200, answer.text
        return list(answer.json()["outputs"][0]["data"])

    assert asked() == [11.0]
    _set(root, "gate", "not")
    try:
        assert asked() == [0.0]
    finally:
        _set(root, "gate", "ready")
    assert asked() == [11.0]


def test_a_server_stops_while_a_thread_instances_is_ready_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread instance's check runs on a daemon thread of its own: an ``is_ready()`` that
    never returns does not hold up the server's exit (``asyncio.run`` waits for the
    threads of the loop's default executor)."""
    monkeypatch.setattr(instance_base, "READY_CHECK_S", 0.5)
    _model(tmp_path, "stuck", SYNC, thread=True)
    (tmp_path / "stuck" / "mode").write_text("hang")
    with serve_in_thread(None, scan_repository(tmp_path)) as running:
        assert _ready(running, "stuck").status_code == 503
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 30  # (serve_in_thread gives up waiting at 60 s)


@pytest.mark.parametrize("name", ["gate", "gate_thread"])
def test_is_ready_raising_what_is_not_an_exception_is_not_ready_and_asked_again(
    server: RunningServer, root: Path, name: str
) -> None:
    """A ``KeyboardInterrupt`` out of ``is_ready`` is its answer (not ready, saying so),
    as any exception: before, it ended the thread asking, whose answer never came (every
    later check waited on it), and a worker's check ended the worker."""
    _set(root, name, "interrupt")
    try:
        answer = _ready(server, name)
        assert answer.status_code == 503
        assert "is_ready() raised KeyboardInterrupt" in answer.json()["error"]
    finally:
        _set(root, name, "ready")
    assert _ready(server, name).status_code == 200
