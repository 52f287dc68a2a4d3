"""Triton's iterative sequences: a Python model runs a request again in a later batch
(``set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)``) when its configuration
has ``sequence_batching { iterative_sequence: true }``. Triton 2.51 answers the fixtures
``iterative`` and ``iterative_stream`` as these tests expect (``bench/triton_python_parity.py``
compares them side by side)."""

from __future__ import annotations

import json
import queue
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sordino.config import load_config
from sordino.errors import ModelLoadError
from sordino.models.repository import scan_repository
from sordino.testing import RunningServer, serve_in_thread
from tests.waiting import wait_for

ANSWERS = Path(__file__).parent.parent / "fixtures" / "triton_python_answers"

AGAIN_UNTIL = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = {}  # by X: each run's START control and flags()

    def execute(self, requests):
        responses = []
        for request in requests:
            x = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy().reshape(-1)[0])
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)
            seen = self.seen.setdefault(x, [])
            seen.append([int(start[0]), request.flags(), str(request.correlation_id())])
            if x < 0 or len(seen) < x:  # X < 0: again forever (until the client leaves)
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(RESPONSE_WHEN_AGAIN)
                continue
            del self.seen[x]
            y = np.array([json.dumps(seen).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return responses
"""

AGAIN_CONFIG = """
backend: "python"
max_batch_size: 0
ITERATIVE
input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] },
        { name: "START", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_STRING, dims: [ 1 ] } ]
"""

SEQUENCES = """sequence_batching {
  iterative_sequence: true
  control_input [ { name: "START"
                    control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
}"""


def _again_model(root: Path, name: str, *, iterative: bool = True, returns: str = "None") -> None:
    (root / name / "1").mkdir(parents=True)
    # (Without sequence batching START is an ordinary input: the client sends it.)
    config = AGAIN_CONFIG.replace("ITERATIVE", SEQUENCES if iterative else "")
    (root / name / "config.pbtxt").write_text(config)
    (root / name / "1" / "model.py").write_text(AGAIN_UNTIL.replace("RESPONSE_WHEN_AGAIN", returns))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("repository")
    for name in ("iterative", "iterative_stream", "iterative_controls"):
        shutil.copytree(ANSWERS / name, root / name)
    # The same controls on a sequence model that is not iterative: a client's sequences.
    shutil.copytree(ANSWERS / "iterative_controls", root / "controls")
    config = root / "controls" / "config.pbtxt"
    config.write_text(config.read_text().replace("iterative_sequence: true", "direct { }"))
    _again_model(root, "again")
    _again_model(root, "not_iterative", iterative=False)
    _again_model(root, "answers_too", returns="pb_utils.InferenceResponse([])")
    with serve_in_thread(None, scan_repository(root)) as running:
        yield running


def _ask(server: RunningServer, x: int, protocol: str = "http", **options: Any) -> Any:
    if protocol == "http":
        client: Any = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        mod: Any = httpclient
    else:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        mod = grpcclient
    tensor = mod.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[x]], np.int32))
    try:
        return client.infer("iterative", [tensor], **options).as_numpy("Y").tolist()
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requests_run_again_until_the_model_answers_them(
    server: RunningServer, protocol: str
) -> None:
    """Four at once (their runs again join the others' batches), then one alone: each is
    run X times and answered once, its last run's flags 0 (START only on its first)."""
    answers: dict[int, Any] = {}

    def ask(x: int) -> None:
        answers[x] = _ask(server, x, protocol)

    threads = [threading.Thread(target=ask, args=(x,)) for x in (3, 1, 2, 4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert answers == {3: [[3, 3, 0]], 1: [[1, 1, 1]], 2: [[2, 2, 0]], 4: [[4, 4, 0]]}
    assert _ask(server, 2, protocol) == [[2, 2, 0]]
    stats = server.runtime.registry.loaded("iterative", "1").scheduler.statistics()
    assert stats.in_flight == 0 and stats.failed == 0


def test_a_request_naming_its_sequence_runs_again_as_well(server: RunningServer) -> None:
    answer = _ask(server, 2, sequence_id=42, sequence_start=True, sequence_end=True)
    assert answer == [[2, 2, 0]]


def test_the_controls_say_start_on_the_first_run_only(server: RunningServer) -> None:
    """A request without a correlation ID gets the model's next (1, 2, ...): START and
    flags() 1 on its first run, 0 on the runs again; the ID stays."""
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    tensor = httpclient.InferInput("X", [1], "INT32")
    tensor.set_data_from_numpy(np.array([3], np.int32))
    first = json.loads(client.infer("again", [tensor]).as_numpy("Y")[0])
    second = json.loads(client.infer("again", [tensor]).as_numpy("Y")[0])
    client.close()
    assert first == [[1, 1, "1"], [0, 0, "1"], [0, 0, "1"]]
    assert second == [[1, 1, "2"], [0, 0, "2"], [0, 0, "2"]]


def _controls(server: RunningServer, model: str, x: int, **options: Any) -> list[int]:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    tensor = httpclient.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[x]], np.int32))
    try:
        answer: list[int] = client.infer(model, [tensor], **options).as_numpy("Y")[0].tolist()
        return answer
    finally:
        client.close()


def test_control_inputs_a_python_model_does_not_declare_are_filled(
    server: RunningServer,
) -> None:
    """As Triton hands them: START, END (FP32), READY (BOOL) and CORRID (UINT64) reach
    the model without being in its ``input``; each run's [START, END, READY, CORRID,
    flags(), correlation_id()]. Clients neither see them in the metadata and
    configuration nor may send them."""
    first = _controls(server, "iterative_controls", 2)
    corrid = first[3]
    assert corrid >= 1 and first == [1, 0, 1, corrid, 1, corrid, 0, 0, 1, corrid, 0, corrid]
    assert _controls(server, "iterative_controls", 1, sequence_id=77, sequence_start=True) == [
        1, 0, 1, 77, 1, 77
    ]  # fmt: skip
    # A sequence model that is not iterative: the client's start and end.
    ones = {"sequence_id": 5}
    assert _controls(server, "controls", 1, **ones, sequence_start=True) == [1, 0, 1, 5, 1, 5]
    assert _controls(server, "controls", 1, **ones) == [0, 0, 1, 5, 0, 5]
    assert _controls(server, "controls", 1, **ones, sequence_end=True) == [0, 1, 1, 5, 2, 5]
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    assert [i["name"] for i in client.get_model_metadata("controls")["inputs"]] == ["X"]
    assert [i["name"] for i in client.get_model_config("controls")["input"]] == ["X"]
    x = httpclient.InferInput("X", [1, 1], "INT32")
    x.set_data_from_numpy(np.array([[1]], np.int32))
    start = httpclient.InferInput("START", [1, 1], "INT32")
    start.set_data_from_numpy(np.array([[1]], np.int32))
    with pytest.raises(InferenceServerException, match="filled in by the sequence batcher"):
        client.infer("controls", [x, start], sequence_id=6, sequence_start=True)
    client.close()


def test_a_decoupled_model_streams_across_its_runs(server: RunningServer) -> None:
    """The python_backend README's example: one response a run, the last flagged final."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[3]], np.int32))
    client.async_stream_infer("iterative_stream", [tensor], enable_empty_final_response=True)
    got = []
    try:
        while not got or not got[-1][1]:
            result, error = answers.get(timeout=30)
            assert error is None
            final = result.get_response().parameters["triton_final_response"].bool_param
            got.append((result.as_numpy("OUT").tolist(), final))
    finally:
        client.stop_stream()
        client.close()
    assert got == [([[2]], False), ([[1]], False), ([[0]], True)]
    with pytest.raises(InferenceServerException, match="decoupled"):
        http = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        http.infer("iterative_stream", [_http_in(3)])


def _http_in(n: int) -> Any:
    tensor = httpclient.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[n]], np.int32))
    return tensor


def test_a_model_not_configured_for_it_gets_an_error_not_a_hang(server: RunningServer) -> None:
    """Triton logs "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    while the model is not configured to handle such a flag" and never answers; sordino
    answers the request with that, saying what to configure, and goes on serving."""
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    x = httpclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([2], np.int32))
    start = httpclient.InferInput("START", [1], "INT32")
    start.set_data_from_numpy(np.array([1], np.int32))
    with pytest.raises(InferenceServerException, match="iterative_sequence: true") as raised:
        client.infer("not_iterative", [x, start])
    assert raised.value.status() == "500"
    x.set_data_from_numpy(np.array([1], np.int32))  # answered at once
    assert json.loads(client.infer("not_iterative", [x, start]).as_numpy("Y")[0]) == [[1, 0, "0"]]
    client.close()


def test_a_response_in_a_rescheduled_requests_place_is_refused(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    x = httpclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([2], np.int32))
    with pytest.raises(InferenceServerException, match="Expected a None object"):
        client.infer("answers_too", [x])
    client.close()


def test_a_client_that_leaves_while_its_request_runs_again_loses_nothing(
    server: RunningServer,
) -> None:
    """A request run again and again (X < 0) ends cancelled when its client leaves; its
    inputs go back to the arena, and the model serves the next requests."""
    scheduler = server.runtime.registry.loaded("again", "1").scheduler
    cancelled = scheduler.statistics().cancelled
    arena = server.runtime.memory.statistics().arena
    assert arena is not None
    before = arena.in_use_bytes
    leaving = httpclient.InferenceServerClient(
        server.url.removeprefix("http://"), network_timeout=0.5, connection_timeout=0.5
    )
    tensor = httpclient.InferInput("X", [1], "INT32")
    tensor.set_data_from_numpy(np.array([-1], np.int32))
    with pytest.raises(Exception):  # noqa: B017 (the client's own timeout, whatever its type)
        leaving.infer("again", [tensor])
    leaving.close()

    def settled() -> bool:
        stats = scheduler.statistics()
        arena_now = server.runtime.memory.statistics().arena
        return stats.in_flight == 0 and arena_now is not None and arena_now.in_use_bytes == before

    wait_for(settled, "the request's end and its inputs back in the arena")
    assert scheduler.statistics().cancelled == cancelled + 1
    assert _ask(server, 2) == [[2, 2, 0]]


def test_iterative_sequences_are_refused_where_sordino_cannot_serve_them(
    tmp_path: Path,
) -> None:
    """A decoupled model's sequences of requests (without iterative_sequence) would be
    answered as one response: refused at load, saying why."""
    shutil.copytree(ANSWERS / "iterative_stream", tmp_path / "stream")
    config = tmp_path / "stream" / "config.pbtxt"
    config.write_text(config.read_text().replace("iterative_sequence: true", "direct { }"))
    settings = load_config(None, {"server.model_control_mode": "explicit"})
    refused = "supported only with iterative_sequence"
    with serve_in_thread(settings, []) as running, pytest.raises(ModelLoadError, match=refused):
        running.call(running.runtime.load(scan_repository(tmp_path)[0]), timeout=120)


def test_the_configuration_shows_the_sequence_batcher(server: RunningServer) -> None:
    """As Triton shows a sequence model: its ``sequence_batching`` (over HTTP and gRPC),
    no ``dynamic_batching``, and only the inputs its configuration declares."""
    http = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    config = http.get_model_config("iterative_controls")
    http.close()
    assert "dynamic_batching" not in config
    section = config["sequence_batching"]
    assert section["iterative_sequence"] is True
    assert [c["name"] for c in section["control_input"]] == ["START", "END", "READY", "CORRID"]
    assert [i["name"] for i in config["input"]] == ["X"]
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    shown = grpc.get_model_config("controls", as_json=True)["config"]["sequence_batching"]
    grpc.close()
    assert shown["direct"] == {} and "iterative_sequence" not in shown  # (defaults: not shown)
    assert shown["control_input"][3]["control"][0]["data_type"] == "TYPE_UINT64"
