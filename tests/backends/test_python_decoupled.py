"""Decoupled Triton Python models served unchanged: streams, cancellation, failures.

The repositories are Triton's decoupled examples (repeat_int32, square_int32, in
tests/fixtures/triton_python_examples) and small models written here: one that sends
until it is cancelled, one that never sends its final flag, one that kills its worker
mid-stream. They run in worker processes, driven with Triton's own clients over gRPC
``ModelStreamInfer`` and over HTTP Server-Sent Events (``generate_stream``).
"""

from __future__ import annotations

import json
import queue
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from sordino.config import RuntimeConfig
from sordino.models.repository import scan_repository
from sordino.testing import RunningServer, serve_in_thread
from tests.waiting import wait_for

EXAMPLES = Path(__file__).parent.parent / "fixtures" / "triton_python_examples"
ANSWERS = Path(__file__).parent.parent / "fixtures" / "triton_python_answers"

ONE_IN = """
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""

# Sends a response every 20 ms until its client cancels; then notes it and stops.
UNTIL_CANCELLED = """
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
            sender = request.get_response_sender()
            tag = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            threading.Thread(target=self.send, args=(request, sender, tag), daemon=True).start()
        return None

    def send(self, request, sender, tag):
        for count in range(3000):
            if request.is_cancelled() and sender.is_cancelled():
                open(os.path.join(self.folder, f"cancelled-{tag}"), "w").close()
                return
            y = pb_utils.Tensor("Y", np.array([count], np.int32))
            sender.send(pb_utils.InferenceResponse([y]))
            time.sleep(0.02)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# One response, then never the final flag (its senders kept, as a model that streams on).
NEVER_FINAL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.kept = []

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([1], np.int32))]))
            self.kept.append(sender)
        return None
"""

# One response, then the sender let go of without the final flag.
DROPPED = NEVER_FINAL.replace("self.kept.append(sender)", "del sender")

# X = 1: one response, then the worker dies from the response thread. Else: X back, final.
CRASHING = """
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            threading.Thread(target=self.send, args=(sender, int(x[0])), daemon=True).start()
        return None

    def send(self, sender, x):
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([x], np.int32))]))
        if x == 1:
            time.sleep(0.2)
            os._exit(3)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# The sender's rules: a second final, a bad flag, and a return value from execute.
RULES = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        request = requests[0]
        x = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
        sender = request.get_response_sender()
        if x == 1:
            return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([1], np.int32))])]
        said = []
        try:
            sender.send(flags=5)
        except pb_utils.TritonModelException as exc:
            said.append(str(exc))
        try:
            sender.send()
        except pb_utils.TritonModelException as exc:
            said.append(str(exc))
        for tensor in (pb_utils.Tensor("Z", np.ones(1, np.int32)),
                       pb_utils.Tensor("Y", np.ones(1, np.int64))):
            try:
                sender.send(pb_utils.InferenceResponse([tensor]))
            except pb_utils.TritonModelException as exc:
                said.append(str(exc))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        try:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except pb_utils.TritonModelException as exc:
            said.append(str(exc))
        pb_utils.Logger.log_info("RULES " + " | ".join(said))
        if said != [
            "Unable to send response. Unsupported flag provided.",
            "Inference Response object must be provided when the response flags is set to zero.",
            "model rules: output 'Z' is not among its configured outputs (Y)",
            "model rules: output 'Y' is INT64 (int64), but the configuration says INT32",
            "Unable to send response. Response sender has been closed.",
        ]:
            raise RuntimeError(said)
        return None
"""

# Not decoupled, answered through the response sender (Triton 24.10 allows one response).
SENDER_ONE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            sender = request.get_response_sender()
            sender.send(
                pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 3)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None
"""


# Batched: each request of a batch gets X responses of [[X, len(requests)]], from one thread.
BATCHED = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        work = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            work.append((request.get_response_sender(), int(x[0, 0])))
        threading.Thread(target=self.send, args=(work, len(requests)), daemon=True).start()
        return None

    def send(self, work, size):
        for sender, x in work:
            for _ in range(x):
                y = pb_utils.Tensor("Y", np.array([[x, size]], np.int32))
                sender.send(pb_utils.InferenceResponse([y]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

BATCHED_CONFIG = """
backend: "python"
max_batch_size: 8
model_transaction_policy { decoupled: true }
dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 30000000 }
input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_INT32, dims: [ 2 ] } ]
"""


def _model(root: Path, name: str, config: str, code: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    (root / name / "1" / "model.py").write_text(code)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("repo")
    for name in ("repeat_int32", "square_int32"):
        shutil.copytree(EXAMPLES / name, root / name)
    shutil.copytree(EXAMPLES / "square_int32", root / "square_thread")
    (root / "square_thread" / "config.yaml").write_text("backend: python\nisolation: thread\n")
    _model(root, "until_cancelled", ONE_IN, UNTIL_CANCELLED)
    # The same, sending from execute itself: the cancellation must reach a running execute.
    in_execute = UNTIL_CANCELLED.replace(
        "threading.Thread(target=self.send, args=(request, sender, tag), daemon=True).start()",
        "self.send(request, sender, tag)",
    )
    assert in_execute != UNTIL_CANCELLED
    _model(root, "cancelled_in_execute", ONE_IN, in_execute)
    _model(root, "never_final", ONE_IN, NEVER_FINAL)
    _model(root, "dropped", ONE_IN, DROPPED)
    _model(root, "dropped_thread", ONE_IN, DROPPED)
    (root / "dropped_thread" / "config.yaml").write_text("backend: python\nisolation: thread\n")
    _model(root, "crashing", ONE_IN, CRASHING)
    _model(root, "rules", ONE_IN, RULES)
    _model(root, "sender_one", ONE_IN.replace("model_transaction_policy", "#"), SENDER_ONE)
    _model(root, "batched", BATCHED_CONFIG, BATCHED)
    # Error responses within a stream (bench.triton_python_parity's, measured on Triton),
    # in a worker process and on a thread, and a model that calls it through BLS.
    for name in ("stream_errors", "stream_errors_bls"):
        shutil.copytree(ANSWERS / name, root / name)
    shutil.copytree(ANSWERS / "stream_errors", root / "stream_errors_thread")
    (root / "stream_errors_thread" / "config.yaml").write_text(
        "backend: python\nisolation: thread\n"
    )
    # manual: the batch waits (up to 30 s) for the three requests, as Triton's batcher
    # does. A config.yaml is read instead of config.pbtxt (which the model still reads for
    # its tensors), so it says the batcher too: the scheduler's default delay (10 ms)
    # would join the three only when they come within it.
    (root / "batched" / "config.yaml").write_text(
        "backend: python\nscheduler_mode: manual\ndynamic_batching:\n"
        "  {preferred_batch_size: [3], max_queue_delay_microseconds: 30000000}\n"
    )
    # A short execution timeout bounds a stream that never ends (never_final).
    config = RuntimeConfig.model_validate({"workers": {"execution_timeout": 3}})
    with serve_in_thread(config, scan_repository(root)) as running:
        yield running


class _Stream:
    """A tritonclient gRPC stream whose callback results land in a queue."""

    def __init__(self, server: RunningServer) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def send(self, model: str, arrays: dict[str, np.ndarray], **kwargs: Any) -> None:
        inputs = []
        for name, array in arrays.items():
            datatype = {np.int32: "INT32", np.uint32: "UINT32"}[array.dtype.type]
            tensor = grpcclient.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        self.client.async_stream_infer(model, inputs, **kwargs)

    def until_final(self, request_id: str = "") -> list[Any]:
        """Responses until the one flagged final (the client asks for the empty final)."""
        got = []
        while True:
            result, error = self.answers.get(timeout=30)
            if error is not None:
                raise error
            if request_id and result.get_response().id != request_id:
                continue
            got.append(result)
            if result.get_response().parameters["triton_final_response"].bool_param:
                return got

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


@pytest.fixture
def stream(server: RunningServer) -> Iterator[_Stream]:
    opened = _Stream(server)
    yield opened
    opened.close()


def _repeat(values: list[int], delays: list[int], wait: int) -> dict[str, np.ndarray]:
    return {
        "IN": np.array(values, np.int32),
        "DELAY": np.array(delays, np.uint32),
        "WAIT": np.array([wait], np.uint32),
    }


def test_repeat_sends_one_response_per_element_over_grpc(stream: _Stream) -> None:
    """Triton's repeat_client: IN [4, 2, 0, 1] gets four responses in order, IDX 0..3,
    sent by a thread after execute returned (WAIT 5 ms < the delays)."""
    stream.send(
        "repeat_int32",
        _repeat([4, 2, 0, 1], [1, 2, 3, 4], 5),
        request_id="0",
        enable_empty_final_response=True,
    )
    got = stream.until_final("0")
    assert [r.get_response().id for r in got] == ["0"] * 5
    assert [int(r.as_numpy("OUT")[0]) for r in got[:4]] == [4, 2, 0, 1]
    assert [int(r.as_numpy("IDX")[0]) for r in got[:4]] == [0, 1, 2, 3]
    assert not got[4].get_response().outputs  # the final flag alone, as the client asked


def test_requests_of_one_stream_interleave_and_each_ends(stream: _Stream) -> None:
    """Two repeat requests and an empty one on one stream: each gets its own responses."""
    stream.send("repeat_int32", _repeat([1, 2, 3], [30, 30, 30], 0), request_id="a",
                enable_empty_final_response=True)  # fmt: skip
    stream.send("repeat_int32", _repeat([7], [0], 0), request_id="b",
                enable_empty_final_response=True)  # fmt: skip
    stream.send("repeat_int32", _repeat([], [], 0), request_id="c",
                enable_empty_final_response=True)  # fmt: skip
    by_id: dict[str, list[int]] = {"a": [], "b": [], "c": []}
    finals = 0
    while finals < 3:
        result, error = stream.answers.get(timeout=30)
        assert error is None, error
        response = result.get_response()
        if response.parameters["triton_final_response"].bool_param:
            finals += 1
        if response.outputs:
            by_id[response.id].append(int(result.as_numpy("OUT")[0]))
    assert by_id == {"a": [1, 2, 3], "b": [7], "c": []}


@pytest.mark.parametrize("model", ["square_int32", "square_thread"])
def test_square_sends_n_responses(stream: _Stream, model: str) -> None:
    """Triton's square_client: IN [n] gets n responses of OUT [n] (in a worker process and
    in a thread of the server); IN [0] gets only the final flag."""
    for n in (3, 0, 1):
        stream.send(model, {"IN": np.array([n], np.int32)}, request_id=str(n),
                    enable_empty_final_response=True)  # fmt: skip
        got = stream.until_final(str(n))
        assert [int(r.as_numpy("OUT")[0]) for r in got[:-1]] == [n] * n


def test_without_the_empty_final_the_last_response_is_flagged(stream: _Stream) -> None:
    """Not asking for the empty final response: the stream ends at the last real one."""
    stream.send("square_int32", {"IN": np.array([2], np.int32)}, request_id="s")
    flags = []
    for _ in range(2):
        result, error = stream.answers.get(timeout=30)
        assert error is None, error
        flags.append(result.get_response().parameters["triton_final_response"].bool_param)
    assert flags == [False, False]  # the model's final flag came alone, after them


def test_repeat_streams_over_http_server_sent_events(server: RunningServer) -> None:
    """POST generate_stream: one event per response, JSON as Triton's generate extension."""
    body = {"IN": [3, 5], "DELAY": [1, 1], "WAIT": [0]}
    events = []
    with httpx.stream(
        "POST", f"{server.url}/v2/models/repeat_int32/generate_stream", json=body, timeout=30
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[len("data:") :]))
    # One-element outputs are scalars in generate JSON, as on Triton.
    assert [(e["OUT"], e["IDX"]) for e in events] == [(3, 0), (5, 1)]
    # No response at all (only the final flag): an empty stream, as on Triton.
    empty = httpx.post(
        f"{server.url}/v2/models/repeat_int32/generate_stream",
        json={"IN": [], "DELAY": [], "WAIT": [0]},
        timeout=30,
    )
    assert empty.status_code == 200 and "data:" not in empty.text


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_unary_infer_on_a_decoupled_model_is_refused(
    server: RunningServer, protocol: str
) -> None:
    """As Triton: the one-response endpoints refuse a decoupled model, naming the streams."""
    mod: Any = httpclient if protocol == "http" else grpcclient
    client: Any = (
        httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
        if protocol == "http"
        else grpcclient.InferenceServerClient(server.grpc_url)
    )
    tensor = mod.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([2], np.int32))
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.infer("square_int32", [tensor])
    finally:
        client.close()
    message = str(caught.value.message())
    assert "decoupled" in message and "ModelStreamInfer" in message
    assert "generate_stream" in message


def test_the_config_says_decoupled(server: RunningServer) -> None:
    config = httpx.get(f"{server.url}/v2/models/square_int32/config").json()
    assert config["model_transaction_policy"] == {"decoupled": True}


def _cancelled_marker(server: RunningServer, tag: int, model: str = "until_cancelled") -> Path:
    loaded = server.runtime.get(model, None)
    return Path(loaded.source.path).parent.parent / f"cancelled-{tag}"


@pytest.mark.parametrize("model", ["until_cancelled", "cancelled_in_execute"])
def test_cancelling_the_grpc_stream_reaches_is_cancelled(server: RunningServer, model: str) -> None:
    """The client cancels its stream mid-way: the model sees is_cancelled() and stops,
    whether it sends from a thread of its own or from a still-running execute."""
    opened = _Stream(server)
    opened.send(model, {"X": np.array([1], np.int32)})
    for _ in range(3):  # it is streaming
        _, error = opened.answers.get(timeout=30)
        assert error is None, error
    opened.client.stop_stream(cancel_requests=True)
    opened.client.close()
    marker = _cancelled_marker(server, 1, model)
    wait_for(marker.exists, "the model to see is_cancelled() after the stream was cancelled")
    wait_for(
        lambda: server.runtime.get(model, None).scheduler.statistics().cancelled >= 1,
        "the request to be counted as cancelled",
    )


def test_an_http_client_leaving_reaches_is_cancelled(server: RunningServer) -> None:
    """The SSE client disconnects: the model sees is_cancelled() and stops."""
    with httpx.stream(
        "POST",
        f"{server.url}/v2/models/until_cancelled/generate_stream",
        json={"X": [2]},
        timeout=30,
    ) as response:
        lines = response.iter_lines()
        seen = 0
        for line in lines:
            seen += line.startswith("data:")
            if seen == 3:
                break
    marker = _cancelled_marker(server, 2)
    wait_for(marker.exists, "the model to see is_cancelled() after the client left")


def test_a_model_that_never_finishes_is_ended_by_the_execution_timeout(stream: _Stream) -> None:
    """No final flag: after workers.execution_timeout the request ends with an error
    naming the model; the worker serves on."""
    stream.send("never_final", {"X": np.array([1], np.int32)})
    result, error = stream.answers.get(timeout=30)
    assert error is None and int(result.as_numpy("Y")[0]) == 1
    _, error = stream.answers.get(timeout=30)
    assert error is not None
    text = str(error)
    assert "never_final" in text and "TRITONSERVER_RESPONSE_COMPLETE_FINAL" in text
    assert "execution timeout of 3 s" in text
    stream.send("never_final", {"X": np.array([1], np.int32)})
    result, error = stream.answers.get(timeout=30)
    assert error is None and int(result.as_numpy("Y")[0]) == 1  # the same worker answers


@pytest.mark.parametrize("model", ["dropped", "dropped_thread"])
def test_a_sender_let_go_of_before_its_final_flag_ends_the_request_at_once(
    stream: _Stream, model: str
) -> None:
    """It stayed open until workers.execution_timeout (in a worker process; for ever on a
    thread, as on Triton): it now ends with an error saying why, and the model serves on."""
    for _ in range(2):
        stream.send(model, {"X": np.array([1], np.int32)})
        result, error = stream.answers.get(timeout=30)
        assert error is None and int(result.as_numpy("Y")[0]) == 1
        _, error = stream.answers.get(timeout=30)
        assert error is not None  # this error, not the execution timeout's (3 s here)
        assert "let go of this request's response sender without sending the final flag" in (
            str(error)
        )
        assert "execution timeout" not in str(error)


def test_a_worker_lost_mid_stream_ends_the_stream_with_an_error(
    server: RunningServer, stream: _Stream
) -> None:
    """The model's process dies after one response: that request ends with an error naming
    the loss; the worker is restarted and serves the next request."""
    stream.send("crashing", {"X": np.array([1], np.int32)})
    result, error = stream.answers.get(timeout=30)
    assert error is None and int(result.as_numpy("Y")[0]) == 1
    _, error = stream.answers.get(timeout=30)
    assert error is not None and "lost while the model was still sending" in str(error)
    assert "exited with code 3" in str(error)

    def serves_again() -> bool:
        again = _Stream(server)
        try:
            again.send("crashing", {"X": np.array([5], np.int32)}, enable_empty_final_response=True)
            return [int(r.as_numpy("Y")[0]) for r in again.until_final()[:-1]] == [5]
        except InferenceServerException:
            return False
        finally:
            again.close()

    wait_for(serves_again, "the crashing model's worker to be restarted", timeout=60)


def test_the_sender_keeps_tritons_rules(stream: _Stream) -> None:
    """A bad flag, a response-less send and a second final raise Triton's messages (an
    undeclared output or datatype raises too); a decoupled execute that returns
    responses fails the request with Triton's message."""
    stream.send("rules", {"X": np.array([0], np.int32)}, enable_empty_final_response=True)
    assert len(stream.until_final()) == 1  # the model checked the messages, then ended
    stream.send("rules", {"X": np.array([1], np.int32)})
    _, error = stream.answers.get(timeout=30)
    assert error is not None
    assert "is using the decoupled mode and the execute function must return None" in str(error)


def test_a_model_that_is_not_decoupled_may_answer_through_its_sender(
    server: RunningServer,
) -> None:
    """Triton 24.10: a non-decoupled model sends its one response through the sender."""
    client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    tensor = httpclient.InferInput("X", [1], "INT32")
    tensor.set_data_from_numpy(np.array([4], np.int32))
    try:
        assert client.infer("sender_one", [tensor]).as_numpy("Y").tolist() == [12]
    finally:
        client.close()


def test_a_batched_decoupled_model_answers_each_request_of_the_batch(stream: _Stream) -> None:
    """Three requests batched into one execute: each gets its own X responses."""
    for x in (2, 1, 3):
        stream.send("batched", {"X": np.array([[x]], np.int32)}, request_id=str(x),
                    enable_empty_final_response=True)  # fmt: skip
    got: dict[str, list[list[int]]] = {"1": [], "2": [], "3": []}
    finals = 0
    while finals < 3:
        result, error = stream.answers.get(timeout=30)
        assert error is None, error
        response = result.get_response()
        if response.parameters["triton_final_response"].bool_param:
            finals += 1
        if response.outputs:
            got[response.id] += result.as_numpy("Y").tolist()
    assert got == {"1": [[1, 3]], "2": [[2, 3]] * 2, "3": [[3, 3]] * 3}


def _answers(stream: _Stream, quiet_s: float = 1.0) -> list[Any]:
    """Every answer of the stream until none comes for ``quiet_s``: ``("N", value,
    final)`` for a response, ``("error", message)`` for an error."""
    got: list[Any] = []
    while True:
        try:
            result, error = stream.answers.get(timeout=quiet_s if got else 30)
        except queue.Empty:
            return got
        if error is not None:
            got.append(("error", error.message()))
            continue
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        n = result.as_numpy("N").tolist() if response.outputs else None
        got.append(("N", n, final))


@pytest.mark.parametrize("model", ["stream_errors", "stream_errors_thread"])
def test_an_error_response_is_one_response_of_the_stream(stream: _Stream, model: str) -> None:
    """As on Triton 2.51: the model's error response reaches the client as it wrote it,
    and its stream goes on to the next response and the final flag; an error response
    with the final flag is the request's last (the stream serves the next request)."""
    stream.send(model, {"X": np.array([3], np.int32)}, enable_empty_final_response=True)
    assert _answers(stream) == [
        ("N", [1], False),
        ("error", "step 2 of 3"),
        ("N", [3], False),
        ("N", None, True),
    ]
    stream.send(model, {"X": np.array([-1], np.int32)}, enable_empty_final_response=True)
    assert _answers(stream) == [("N", [1], False), ("error", "step 2 of -1")]
    stream.send(model, {"X": np.array([0], np.int32)})
    # Without the empty final response the bare final flag sends nothing (as on Triton).
    assert _answers(stream) == [("N", [1], False), ("error", "step 2 of 0"), ("N", [3], False)]


def test_an_error_response_is_one_event_of_the_http_stream(server: RunningServer) -> None:
    """generate_stream: the error is an event and the events go on, as on Triton."""
    events = []
    with httpx.stream(
        "POST", f"{server.url}/v2/models/stream_errors/generate_stream", json={"X": [5]}, timeout=30
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[len("data:") :]))
    assert [e.get("N", e.get("error")) for e in events] == [1, "step 2 of 5", 3]


def test_a_bls_caller_sees_the_error_response_and_the_rest_of_the_stream(
    server: RunningServer,
) -> None:
    """The callee's error response is one response of the call's iterator, with its code;
    with the final flag it is the last (Triton 2.51 drops the first and never ends the
    second: docs/backends.md)."""
    client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    where = "BLS call to model 'stream_errors'"
    try:
        seen = {}
        for x in (3, -1):
            tensor = httpclient.InferInput("X", [1], "INT32")
            tensor.set_data_from_numpy(np.array([x], np.int32))
            result = client.infer("stream_errors_bls", [tensor])
            seen[x] = [s.decode() for s in result.as_numpy("SEEN").tolist()]
    finally:
        client.close()
    assert seen == {
        3: ["N 1", f"error 3: {where}: step 2 of 3", "N 3", "end"],
        -1: ["N 1", f"error 1: {where}: step 2 of -1"],
    }


def test_a_streams_outcome_is_its_last_response(server: RunningServer) -> None:
    """An error within the stream does not fail the request; a last error does, counted
    by its code as a unary error response is (the client's kind, or the model's)."""

    def count(reason: str) -> float:
        text = httpx.get(f"{server.url}/metrics").text
        for family in text_string_to_metric_families(text):
            if family.name == "sordino_requests":
                return sum(
                    s.value
                    for s in family.samples
                    if s.name.endswith("_total")
                    and s.labels["model"] == "stream_errors"
                    and s.labels["reason"] == reason
                )
        return 0.0

    before = {reason: count(reason) for reason in ("ok", "model_rejected", "model_response_error")}
    for x in (0, -3, -4):  # the last error's code: 3 INVALID_ARG, 4 UNAVAILABLE
        with httpx.stream(
            "POST",
            f"{server.url}/v2/models/stream_errors/generate_stream",
            json={"X": [x]},
            timeout=30,
        ) as response:
            response.read()
    wait_for(
        lambda: (
            {reason: count(reason) - before[reason] for reason in before}
            == {"ok": 1, "model_rejected": 1, "model_response_error": 1}
        ),
        "one stream counted under each reason",
    )
