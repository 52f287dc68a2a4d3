"""BLS: a Triton Python model calling other models of the same sordino, checked with
Triton's clients over HTTP and gRPC.

The repositories are Triton's bls example (tests/fixtures/triton_python_examples:
bls_sync, bls_async, add_sub; the example's "pytorch" model is add_sub under that
name, no torch here) and two models written here: ``relay`` (calls the model its
TARGET input names, reports the call's error and response count) and ``gate`` (holds
its batch until the test opens it).
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sordino.backends.calls import CallAnswer, ModelCall
from sordino.backends.python import bls
from sordino.backends.python import triton_python_backend_utils as pb_utils
from sordino.config import RuntimeConfig
from sordino.execution.messages import FrameReader, ModelCallAnswer, ModelCallStart, encode
from sordino.models.repository import scan_repository, triton_example_sources
from sordino.testing import RunningServer, serve_in_thread
from tests.metrics import counter_sum
from tests.waiting import wait_for

EXAMPLES = Path(__file__).parent.parent / "fixtures" / "triton_python_examples"

RELAY = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _one(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            # Stand in for the runtime's per-request facts where it sets none yet.
            priority, tenant = int(_one(request, "PRIORITY")), _one(request, "TENANT")
            deadline_s = float(_one(request, "DEADLINE_S"))
            if priority and getattr(request, "_sordino_priority", None) is None:
                request._sordino_priority = priority
            if tenant and getattr(request, "_sordino_tenant", None) is None:
                request._sordino_tenant = tenant.decode()
            if deadline_s and getattr(request, "_sordino_deadline", None) is None:
                request._sordino_deadline = time.time() + deadline_s
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            call = pb_utils.InferenceRequest(
                model_name=_one(request, "TARGET"),
                inputs=[x, pb_utils.Tensor("INPUT1", x.as_numpy())],
                requested_output_names=["OUTPUT0"],
            )
            if _one(request, "DECOUPLED"):
                answers = list(call.exec(decoupled=True))
            else:
                answers = [call.exec()]
            errors = [a.error().message() for a in answers if a.has_error()]
            good = [a for a in answers if not a.has_error()]
            y = (
                pb_utils.get_output_tensor_by_name(good[0], "OUTPUT0").as_numpy()
                if good
                else np.zeros(4, np.float32)
            )
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUTPUT0", y),
                        pb_utils.Tensor("ERROR", np.array([errors[0] if errors else ""], object)),
                        pb_utils.Tensor("COUNT", np.array([len(answers)], np.int32)),
                    ]
                )
            )
        return responses
"""

RELAY_CONFIG = """
backend: "python"
input [
  { name: "TARGET", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "PRIORITY", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "TENANT", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "DEADLINE_S", data_type: TYPE_FP64, dims: [ 1 ] },
  { name: "DECOUPLED", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] }
]
output [
  { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] },
  { name: "ERROR", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "COUNT", data_type: TYPE_INT32, dims: [ 1 ] }
]
"""

GATE = """
import os
import time

import triton_python_backend_utils as pb_utils

FOLDER = {folder!r}


class TritonPythonModel:
    def execute(self, requests):
        open(os.path.join(FOLDER, "entered"), "w").close()
        ends = time.monotonic() + 60
        while not os.path.exists(os.path.join(FOLDER, "open")) and time.monotonic() < ends:
            time.sleep(0.01)
        x = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)])]
"""

GATE_CONFIG = """
backend: "python"
input [
  { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] },
  { name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }
]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""


CALL_ON = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            call = pb_utils.InferenceRequest(
                model_name={other!r}, inputs=[x], requested_output_names=["Y"]
            )
            answer = call.exec()
            if answer.has_error():
                error = pb_utils.TritonError(answer.error().message())
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                y = pb_utils.get_output_tensor_by_name(answer, "Y")
                responses.append(pb_utils.InferenceResponse([y]))
        return responses
"""
"""Calls the model named ``other`` with its input, answers with its output or error."""

CALL_ON_CONFIG = """
backend: "python"
input [ { name: "X", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""

WIDE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        n = int(pb_utils.get_input_tensor_by_name(requests[0], "N").as_numpy()[0])
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.ones(n, np.float32))])]
"""

WIDE_CONFIG = """
backend: "python"
input [ { name: "N", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""

WIDE_CALLER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        n = pb_utils.get_input_tensor_by_name(requests[0], "N")
        answer = pb_utils.InferenceRequest(
            model_name="wide", inputs=[n], requested_output_names=["Y"]
        ).exec()
        if answer.has_error():
            raise pb_utils.TritonModelException(answer.error().message())
        y = pb_utils.get_output_tensor_by_name(answer, "Y").as_numpy()
        total = np.array([y.size, y.sum()], dtype=np.float64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("TOTAL", total)])]
"""

WIDE_CALLER_CONFIG = """
backend: "python"
input [ { name: "N", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "TOTAL", data_type: TYPE_FP64, dims: [ 2 ] } ]
"""


REPEAT_SUM = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        values = pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()
        zeros = np.zeros(values.shape, np.uint32)
        call = pb_utils.InferenceRequest(
            model_name="repeat_int32",
            inputs=[
                pb_utils.Tensor("IN", values),
                pb_utils.Tensor("DELAY", zeros),
                pb_utils.Tensor("WAIT", np.zeros(1, np.uint32)),
            ],
            requested_output_names=["OUT"],
        )
        plain = call.exec()  # not decoupled: refused, saying how to call it
        total, count = 0, 0
        for response in call.exec(decoupled=True):
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            count += 1
            if response.output_tensors():
                total += int(pb_utils.get_output_tensor_by_name(response, "OUT").as_numpy()[0])
        error = plain.error().message() if plain.has_error() else ""
        return [
            pb_utils.InferenceResponse(
                [
                    pb_utils.Tensor("SUM", np.array([total], np.int32)),
                    pb_utils.Tensor("COUNT", np.array([count], np.int32)),
                    pb_utils.Tensor("ERROR", np.array([error], object)),
                ]
            )
        ]
"""

REPEAT_SUM_CONFIG = """
backend: "python"
input [ { name: "IN", data_type: TYPE_INT32, dims: [ -1 ] } ]
output [
  { name: "SUM", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "COUNT", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "ERROR", data_type: TYPE_STRING, dims: [ 1 ] }
]
"""


def _model(root: Path, name: str, code: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    (root / name / "1" / "model.py").write_text(code)


def _renamed_copy(source: str, root: Path, name: str) -> None:
    shutil.copytree(EXAMPLES / source, root / name)
    config = root / name / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{source}"', f'name: "{name}"'))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("repo")
    for name in ("add_sub", "bls_sync", "bls_async"):
        shutil.copytree(EXAMPLES / name, root / name)
    _renamed_copy("add_sub", root, "pytorch")  # the example's second model, numpy here
    _renamed_copy("add_sub", root, "victim")  # unloaded by a test
    shutil.copytree(EXAMPLES / "bls_sync", root / "bls_sync_thread")
    (root / "bls_sync_thread" / "config.yaml").write_text("backend: python\nisolation: thread\n")
    _model(root, "relay", RELAY, RELAY_CONFIG)
    _model(root, "wide", WIDE, WIDE_CONFIG)
    _model(root, "wide_caller", WIDE_CALLER, WIDE_CALLER_CONFIG)
    _model(root, "repeat_sum", REPEAT_SUM, REPEAT_SUM_CONFIG)
    for name, other in [("ping", "pong"), ("pong", "ping"), ("tri_a", "tri_b"),
                        ("tri_b", "tri_c"), ("tri_c", "tri_a")]:  # fmt: skip
        _model(root, name, CALL_ON.format(other=other), CALL_ON_CONFIG)
    config = RuntimeConfig.model_validate({"telemetry": {"tenant_labels": ["acme"]}})
    # Triton's decoupled repeat_int32 example (ONNX: a step model that streams).
    repeat = [s for s in triton_example_sources() if s.config.name == "repeat_int32"]
    with serve_in_thread(config, scan_repository(root) + repeat) as running:
        yield running


@pytest.fixture(params=["http", "grpc"])
def client(server: RunningServer, request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "http":
        client: Any = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    else:
        client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def _mod(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def _infer(client: Any, model: str, arrays: dict[str, np.ndarray], **kwargs: Any) -> Any:
    mod = _mod(client)
    inputs = []
    for name, array in arrays.items():
        datatype = {"f": "FP32", "d": "FP64", "i": "INT32", "O": "BYTES"}[array.dtype.char]
        tensor = mod.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return client.infer(model, inputs, **kwargs)


A = np.array([1.0, 2.5, -3.0, 4.0], dtype=np.float32)
B = np.array([0.5, 0.5, 1.0, -4.0], dtype=np.float32)


def _bls_sync(client: Any, model: str, target: str) -> Any:
    arrays = {"INPUT0": A, "INPUT1": B, "MODEL_NAME": np.array([target], dtype=object)}
    return _infer(client, model, arrays)


def _relay(
    client: Any,
    target: str,
    *,
    priority: int = 0,
    tenant: str = "",
    deadline_s: float = 0.0,
    decoupled: bool = False,
    **kwargs: Any,
) -> tuple[np.ndarray, str, int]:
    arrays = {
        "TARGET": np.array([target], dtype=object),
        "PRIORITY": np.array([priority], dtype=np.int32),
        "TENANT": np.array([tenant], dtype=object),
        "DEADLINE_S": np.array([deadline_s], dtype=np.float64),
        "DECOUPLED": np.array([int(decoupled)], dtype=np.int32),
        "INPUT0": A,
    }
    result = _infer(client, "relay", arrays, **kwargs)
    error = result.as_numpy("ERROR").reshape(-1)[0]
    return result.as_numpy("OUTPUT0"), error.decode(), int(result.as_numpy("COUNT")[0])


# -- Triton's bls example ----------------------------------------------------------


@pytest.mark.parametrize("model", ["bls_sync", "bls_sync_thread"])
@pytest.mark.parametrize("target", ["add_sub", "pytorch"])
def test_bls_sync_answers_with_the_named_models_outputs(
    client: Any, model: str, target: str
) -> None:
    """exec() from a worker process and from a thread instance: the callee's sum and difference."""
    result = _bls_sync(client, model, target)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_bls_async_gathers_two_calls_in_an_async_execute(client: Any) -> None:
    """async def execute + async_exec + asyncio.gather, as Triton's async example."""
    result = _infer(client, "bls_async", {"INPUT0": A, "INPUT1": B})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_bls_to_an_undefined_model_fails_the_request_saying_which(client: Any) -> None:
    """Triton's sync client expects an error for 'undefined_model': it names the model."""
    with pytest.raises(InferenceServerException) as caught:
        _bls_sync(client, "bls_sync", "undefined_model")
    message = str(caught.value.message())
    assert "BLS call to model 'undefined_model': it is not loaded" in message
    np.testing.assert_array_equal(
        _bls_sync(client, "bls_sync", "add_sub").as_numpy("OUTPUT0"), A + B
    )


def test_decoupled_exec_streams_a_decoupled_models_responses(client: Any) -> None:
    """bls_decoupled's shape: every response of repeat_int32 reaches the iterator, and a
    call without decoupled=True is refused, as on Triton."""
    result = _infer(client, "repeat_sum", {"IN": np.array([4, 2, 0, 1], dtype=np.int32)})
    assert int(result.as_numpy("SUM")[0]) == 7
    assert int(result.as_numpy("COUNT")[0]) >= 4
    error = result.as_numpy("ERROR").reshape(-1)[0].decode()
    assert "the model is decoupled" in error and "exec(decoupled=True)" in error


def test_a_large_answer_crosses_the_pipe_whole(client: Any) -> None:
    """16 MiB of outputs come back to the calling worker (written as its pipe takes them)."""
    n = 4 << 20
    result = _infer(client, "wide_caller", {"N": np.array([n], dtype=np.int32)})
    assert result.as_numpy("TOTAL").tolist() == [n, n]


# -- what a call carries, and its dead ends ------------------------------------------


def test_a_call_carries_the_callers_priority_and_tenant(server: RunningServer) -> None:
    """The callee's request is counted under the caller's tenant and priority level."""

    def add_sub_calls() -> int:
        return counter_sum(
            server,
            "sordino_tenant_requests",
            lambda s: (s["model"], s["tenant"], s["priority"]) == ("add_sub", "acme", "1"),
        )

    before = add_sub_calls()
    client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        # The client's own priority and tenant are the relay's: the same facts once the
        # runtime sets them on the requests execute gets.
        y, error, _ = _relay(
            client,
            "add_sub",
            priority=1,
            tenant="acme",
            headers={"X-Sordino-Tenant": "acme", "X-Sordino-Priority": "1"},
        )
    finally:
        client.close()
    assert error == ""
    np.testing.assert_array_equal(y, A + A)
    assert add_sub_calls() == before + 1


def test_a_call_past_the_callers_deadline_is_an_error_response(client: Any) -> None:
    """The calling request's deadline has passed: exec() returns has_error(), no exception."""
    _, error, count = _relay(client, "add_sub", deadline_s=-1.0)
    assert "deadline has passed" in error and count == 1


def test_a_model_calling_itself_from_its_only_instance_is_an_error_not_a_deadlock(
    client: Any,
) -> None:
    """Triton deadlocks here; sordino answers at once, saying why."""
    _, error, _ = _relay(client, "relay")
    assert "calls itself, and its only instance is the one calling" in error


@pytest.mark.parametrize(
    ("model", "cycle"),
    [("ping", "pong -> ping -> pong"), ("tri_a", "tri_c -> tri_a -> tri_b -> tri_c")],
)
def test_models_calling_each_other_in_a_circle_get_an_error_not_a_wait(
    client: Any, model: str, cycle: str
) -> None:
    """ping calls pong, which calls ping, one instance each: the last call waited until the
    request's deadline (a minute by default; Triton, forever); now it is refused at once,
    naming the circle, and the error reaches the client through both models."""
    with pytest.raises(InferenceServerException) as refused:
        _infer(client, model, {"X": A}, **_timeout(client, 30))
    message = str(refused.value)
    assert "a BLS cycle" in message and f"({cycle})" in message, message


def _timeout(client: Any, seconds: int) -> dict[str, Any]:
    """The client-side timeout keyword of ``client`` (tritonclient's two spell it apart)."""
    if isinstance(client, httpclient.InferenceServerClient):
        return {}  # (the client's network timeout is set when it is made)
    return {"client_timeout": seconds}


def test_decoupled_exec_on_a_model_that_is_not_decoupled_yields_its_one_response(
    client: Any,
) -> None:
    """exec(decoupled=True) on add_sub: an iterator of one response, as on Triton."""
    y, error, count = _relay(client, "add_sub", decoupled=True)
    assert (error, count) == ("", 1)
    np.testing.assert_array_equal(y, A + A)


def test_a_call_to_an_unloaded_model_is_an_error_response(server: RunningServer) -> None:
    """A model unloaded since: 'not loaded', and the caller serves on."""
    client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        assert _relay(client, "victim")[1] == ""
        server.call(server.runtime.unload("victim", "1"))
        _, error, _ = _relay(client, "victim")
        assert "BLS call to model 'victim': it is not loaded" in error
        assert _relay(client, "add_sub")[1] == ""
    finally:
        client.close()


# -- a call whose callee never answers; workers and servers that go away -------------


ACME_KEY = "acme-test-key"
ACME_HASH = "ebfbfd0414bb0cb52b149c7596a65b6892c759178bdc540e50a3c9b3575775e3"  # sha256 of ACME_KEY


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[RunningServer, Path]]:
    """relay, and the gates shut and held (each its folder under the one returned);
    batches are killed after 4 s (workers.execution_timeout)."""
    root = tmp_path / "repo"
    _model(root, "relay", RELAY, RELAY_CONFIG)
    for gate in ("shut", "held"):
        (tmp_path / gate).mkdir()
        _model(root, gate, GATE.format(folder=str(tmp_path / gate)), GATE_CONFIG)
    config = RuntimeConfig.model_validate(
        {
            "workers": {"execution_timeout": 4},
            "tenants": [{"name": "acme", "keys": [f"sha256:{ACME_HASH}"]}],
        }
    )
    with serve_in_thread(config, scan_repository(root)) as running:
        yield running, tmp_path


def _relay_in_thread(
    server: RunningServer, target: str = "gate"
) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def send() -> None:
        client = httpclient.InferenceServerClient(
            url=server.url.removeprefix("http://"), network_timeout=60
        )
        try:
            outcome.append(_relay(client, target))
        except Exception as exc:
            outcome.append(exc)
        finally:
            client.close()

    thread = threading.Thread(target=send)
    thread.start()
    return thread, outcome


def _pid(server: RunningServer, model: str) -> int:
    stats = server.runtime.executor.statistics()
    pid = next(w.pid for w in stats.workers if w.model == model)
    assert pid is not None
    return pid


def test_an_unanswered_call_and_a_killed_caller_never_wedge(
    gated: tuple[RunningServer, Path],
) -> None:
    """A call its callee never answers fails before the caller's batch times out (a cycle
    through other models ends so); a caller killed mid-call loses only its request; with
    tenants configured, a call is its caller's tenant's without a key."""
    server, folders = gated
    # The gate stays shut: the call answers an error before the relay's 4 s are up.
    started = time.monotonic()
    thread, outcome = _relay_in_thread(server, "shut")
    thread.join(30)
    assert not thread.is_alive()
    _, error, _ = outcome[0]
    assert "no answer before the calling request's deadline" in error
    assert time.monotonic() - started < 20
    # The relay's worker dies while its call waits at the other gate.
    held = folders / "held"
    relay_pid = _pid(server, "relay")
    thread, outcome = _relay_in_thread(server, "held")
    wait_for((held / "entered").exists, "the gate to hold the call", timeout=30)
    os.kill(relay_pid, signal.SIGKILL)
    (held / "open").touch()
    thread.join(60)
    # Lost with its worker, or answered by the batch's retry on the restarted worker.
    assert isinstance(outcome[0], InferenceServerException) or outcome[0][1] == ""

    def relay_serves() -> bool:
        client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
        try:
            return _relay(client, "held")[1] == ""
        except InferenceServerException:
            return False
        finally:
            client.close()

    wait_for(relay_serves, "the relay's new worker to call the gate", timeout=60)
    assert _pid(server, "relay") != relay_pid

    # With tenants configured, a call is served as its caller's tenant, without a key.
    def acme_calls() -> int:
        return counter_sum(
            server,
            "sordino_tenant_requests",
            lambda s: (s["model"], s["tenant"]) == ("held", "acme"),
        )

    before = acme_calls()
    client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        key = {"Authorization": f"Bearer {ACME_KEY}"}
        assert _relay(client, "held", tenant="acme", headers=key)[1] == ""
    finally:
        client.close()
    assert acme_calls() == before + 1


def test_the_server_stopping_mid_call_ends_the_call(tmp_path: Path) -> None:
    """Stopping while a call waits at the gate: the server stops, the client gets an error."""
    folder = tmp_path / "gate"
    folder.mkdir()
    root = tmp_path / "repo"
    _model(root, "relay", RELAY, RELAY_CONFIG)
    _model(root, "gate", GATE.format(folder=str(folder)), GATE_CONFIG)
    config = RuntimeConfig.model_validate({"server": {"shutdown_timeout": 2}})
    with serve_in_thread(config, scan_repository(root)) as server:
        thread, outcome = _relay_in_thread(server)
        wait_for((folder / "entered").exists, "the gate to hold the call", timeout=30)
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 30
    thread.join(30)
    assert not thread.is_alive()
    assert isinstance(outcome[0], Exception) or outcome[0][1] != ""


# -- the pieces ----------------------------------------------------------------------


class _Request:
    def __init__(self, priority: int | None, deadline: float | None, tenant: str | None) -> None:
        self._sordino_priority = priority
        self._sordino_deadline = deadline
        self._sordino_tenant = tenant


def test_a_batch_calls_with_its_strictest_request() -> None:
    """Several requests: the highest priority, the earliest deadline, that request's tenant."""
    batch = [_Request(3, 50.0, "a"), _Request(1, None, "b"), _Request(None, 20.0, None)]
    assert bls.caller_facts(batch) == (1, 20.0, "b")
    assert bls.caller_facts([object()]) == (None, None, None)


def test_a_call_from_a_thread_of_the_model_takes_the_last_batchs_facts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After execute returned (a thread the model started): its facts, not its requests."""
    monkeypatch.setattr(bls, "_LATEST", None)
    request = _Request(2, 9.0, "t")
    with bls.executing(bls.Executing("m", [request])):
        assert bls.current() is not None
    state = bls.current()
    assert state is not None and request not in state.requests
    assert bls.caller_facts(state.requests) == (2, 9.0, "t")


def test_without_a_server_exec_returns_an_error_response(monkeypatch: pytest.MonkeyPatch) -> None:
    """No caller installed (no server here): an error response, as Triton's, not a raise."""
    monkeypatch.setattr(bls, "_CALLER", None)
    monkeypatch.setattr(bls, "_LATEST", None)  # a thread instance's batch, in this process
    call = pb_utils.InferenceRequest(
        model_name="add_sub", inputs=[pb_utils.Tensor("INPUT0", A)], requested_output_names=[]
    )
    response = call.exec()
    assert response.has_error()
    assert response.error().code() == pb_utils.TritonError.UNSUPPORTED


def test_what_sordino_cannot_honour_is_refused_saying_so() -> None:
    """GPU memory for outputs, and BLS in initialize, raise TritonModelException."""
    gpu = pb_utils.InferenceRequest(
        model_name="m",
        inputs=[],
        requested_output_names=[],
        preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0),
    )
    with pytest.raises(pb_utils.TritonModelException, match="MEMORY_GPU is not supported"):
        gpu.exec()
    with bls.executing(bls.Executing("m", phase="initialize")):
        plain = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
        with pytest.raises(pb_utils.TritonModelException, match="only supported during"):
            plain.exec()


def test_call_messages_cross_the_pipe() -> None:
    """ModelCallStart and ModelCallAnswer survive the frame encoding, arrays included."""
    call = ModelCall("m", {"X": np.arange(3, dtype=np.int64)}, priority=2, tenant="t")
    answer = CallAnswer(outputs={"Y": np.array([b"a"], dtype=object)}, final=True)
    frames = encode(ModelCallStart(7, call)) + encode(ModelCallAnswer(7, answer))
    start, back = FrameReader().feed(frames)
    assert isinstance(start, ModelCallStart) and isinstance(back, ModelCallAnswer)
    assert start.call.priority == 2 and start.call.inputs["X"].tolist() == [0, 1, 2]
    assert back.answer.outputs["Y"].tolist() == [b"a"]
