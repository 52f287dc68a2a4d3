"""A decoupled Triton Python model's requests carry their own facts, and so do its BLS calls.

As a model that is not decoupled (tests/backends/test_python_request_facts.py): each
request has its ``request_id()``, ``parameters()``, ``timeout()``, correlation ID and
sordino's priority, deadline and tenant; a BLS call made while answering it carries
the request's priority, deadline and tenant to the callee. The decoupled model here
sends, for each request, its own facts (FACTS) and those the ``echo_facts`` model saw
of the BLS call it made (CALLEE), then the final flag.
"""

from __future__ import annotations

import json
import queue
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from sordino.backends.base import BackendOptions
from sordino.backends.calls import CallAnswer, ModelCall, failed_answer
from sordino.backends.python.backend import PythonBackend
from sordino.config import RuntimeConfig
from sordino.inference import RequestFacts
from sordino.models.repository import scan_repository
from sordino.testing import RunningServer, serve_in_thread

FACTS = Path(__file__).parent.parent / "fixtures" / "triton_python_facts"

STREAMS_FACTS = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            facts = {
                "id": request.request_id(),
                "correlation_id": request.correlation_id(),
                "parameters": request.parameters(),
                "timeout": request.timeout(),
                "priority": getattr(request, "_sordino_priority", None),
                "deadline": getattr(request, "_sordino_deadline", None),
                "tenant": getattr(request, "_sordino_tenant", None),
            }
            call = pb_utils.InferenceRequest(
                model_name="echo", inputs=[pb_utils.Tensor("X", x)],
                requested_output_names=["FACTS"],
            )
            answer = call.exec()
            if answer.has_error():
                callee = answer.error().message()
            else:
                callee = pb_utils.get_output_tensor_by_name(answer, "FACTS").as_numpy()[0][0]
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("FACTS", np.array([json.dumps(facts).encode()], np.object_)),
                pb_utils.Tensor("CALLEE", np.array([callee], np.object_)),
            ]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

CONFIG = """
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "X", data_type: TYPE_INT32, dims: [ 1, 1 ] } ]
output [
  { name: "FACTS", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "CALLEE", data_type: TYPE_STRING, dims: [ 1 ] }
]
"""


def _decoupled(root: Path, name: str, yaml: str = "") -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(CONFIG)
    (root / name / "1" / "model.py").write_text(STREAMS_FACTS)
    if yaml:
        (root / name / "config.yaml").write_text(yaml)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("repo")
    shutil.copytree(FACTS / "echo_facts", root / "echo")
    _decoupled(root, "streams_facts")
    _decoupled(root, "streams_facts_thread", "backend: python\nisolation: thread\n")
    with serve_in_thread(RuntimeConfig(), scan_repository(root)) as running:
        yield running


@pytest.mark.parametrize("model", ["streams_facts", "streams_facts_thread"])
def test_a_decoupled_request_and_its_bls_call_carry_the_requests_facts(
    server: RunningServer, model: str
) -> None:
    """Over a gRPC stream: the model sees the request's id, parameters, timeout,
    priority and deadline; the BLS call it makes is queued at that priority with that
    deadline."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    before = time.time()
    try:
        tensor = grpcclient.InferInput("X", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[3]], np.int32))
        client.async_stream_infer(
            model,
            [tensor],
            request_id="d-1",
            parameters={"mode": "fast"},
            timeout=60_000_000,
        )
        result, error = answers.get(timeout=30)
        assert error is None, error
    finally:
        client.stop_stream()
        client.close()
    own = json.loads(result.as_numpy("FACTS")[0])
    assert (own["id"], own["correlation_id"], own["timeout"]) == ("d-1", 0, 60_000_000)
    assert json.loads(own["parameters"]) == {"mode": "fast"}
    assert isinstance(own["priority"], int)
    assert before + 50 < own["deadline"] < time.time() + 61
    callee = json.loads(result.as_numpy("CALLEE")[0])
    assert callee["priority"] == own["priority"]
    # The caller's deadline bounds the call (no later than it), carried apart from the
    # callee's timeout(), which shows the call's own (none here), as on Triton.
    assert before + 30 < callee["deadline"] <= own["deadline"] + 1
    assert callee["timeout"] == 0


def test_infer_decoupled_hands_each_request_its_facts_and_calls_carry_them(
    tmp_path: Path,
) -> None:
    """In-process: two requests of one decoupled batch each see their facts, and each
    BLS call carries that request's priority, deadline and tenant."""
    _decoupled(tmp_path, "streams_facts")
    calls: list[ModelCall] = []

    class Caller:
        def start(
            self, call: ModelCall, on_answer: Callable[[CallAnswer], None]
        ) -> Callable[[], None]:
            calls.append(call)
            on_answer(failed_answer("no server here", "UNAVAILABLE"))
            return lambda: None

    class Responder:
        def __init__(self) -> None:
            self.sent: dict[int, dict[str, np.ndarray]] = {}

        def respond(
            self,
            index: int,
            outputs: dict[str, np.ndarray] | None,
            final: bool,
            error: str | None = None,
            code: int = 1,
        ) -> None:
            assert error is None and final
            self.sent[index] = outputs or {}

        def cancelled(self, index: int) -> bool:
            return False

    backend = PythonBackend(BackendOptions(name="streams_facts", version="1"))
    backend.load(tmp_path / "streams_facts" / "1" / "model.py")
    backend.set_caller(Caller())
    try:
        facts = (
            RequestFacts(id="a", parameters='{"k":1}', priority=1, deadline=1e10, tenant="acme"),
            RequestFacts(id="b", correlation_id="s", priority=3, tenant="beta"),
        )
        responder = Responder()
        # Not batched (max_batch_size 0): one request per batch, each its own facts.
        for fact in facts:
            backend.infer_decoupled({"X": np.array([[1]], np.int32)}, (), responder, (fact,))
            seen = json.loads(responder.sent[0]["FACTS"][0])
            assert (seen["id"], seen["tenant"], seen["priority"]) == (
                fact.id,
                fact.tenant,
                fact.priority,
            )
            assert seen["parameters"] == fact.parameters
            assert seen["correlation_id"] == fact.correlation_id
        assert [(c.model, c.priority, c.deadline, c.tenant) for c in calls] == [
            ("echo", 1, 1e10, "acme"),
            ("echo", 3, None, "beta"),
        ]
    finally:
        backend.unload()
