"""Triton Python-backend repositories served unchanged, checked with Triton's clients.

The repositories are tests/fixtures/triton_python_examples (add_sub, auto_complete), in
worker processes as ONNX models are; answers are checked over HTTP and gRPC.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sordino.backends.base import ModelRunOptions
from sordino.backends.registry import create_backend
from sordino.config import RuntimeConfig
from sordino.errors import ModelLoadError
from sordino.models.repository import scan_repository
from sordino.testing import RunningServer, serve_in_thread
from tests.metrics import counter_sum
from tests.waiting import wait_for

EXAMPLES = Path(__file__).parent.parent / "fixtures" / "triton_python_examples"

FAULTY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
        if x[0] == 1:
            raise ValueError("one is not welcome")
        if x[0] == 2:
            return []
        if x[0] == 9:
            os._exit(3)  # the model kills its own process
        if x[0] == 3:
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("three is wrong"))]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 10)]) for _ in requests]
"""

FAULTY_CONFIG = """
backend: "python"
input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""


ALL_BUT_C = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        by_name = pb_utils.get_input_tensor_by_name
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor(n, by_name(r, "X").as_numpy()) for n in ("A", "B", "D")]
            )
            for r in requests
        ]
"""

ALL_BUT_C_CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [
  { name: "A", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "B", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "C", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "D", data_type: TYPE_INT32, dims: [ 1 ] }
]
"""


COUNTING = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            seen = np.full(x.shape, len(requests) * 100 + x.shape[0], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("N", seen)]))
        return responses
"""

COUNTING_CONFIG = """
backend: "python"
max_batch_size: 8
dynamic_batching { preferred_batch_size: [ 6 ] max_queue_delay_microseconds: 30000000 }
input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "N", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""


ANSWERS = Path(__file__).parent.parent / "fixtures" / "triton_python_answers"
"""Two models of our own, the parity bench's too (bench/triton_python_parity.py):
``error_codes`` answers ``X = -1 - code`` with that Triton error code, ``as_made``
returns outputs in other datatypes than it declares."""

# error_codes joining 3 requests a batch, as Triton's dynamic batcher would. The three
# wait for each other up to 30 s: on a loaded machine (the suite's two processes beside
# the README replay's installs) the last came more than 5 s after the first.
BATCH_OF_3 = (
    "dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 30000000 }\n"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("repo")
    for name in ("add_sub", "auto_complete", "custom_metrics"):
        shutil.copytree(EXAMPLES / name, root / name)
    # The same model in the server process: config.yaml chooses, config.pbtxt describes.
    shutil.copytree(EXAMPLES / "add_sub", root / "add_sub_thread")
    (root / "add_sub_thread" / "config.yaml").write_text("backend: python\nisolation: thread\n")
    (root / "faulty" / "1").mkdir(parents=True)
    (root / "faulty" / "config.pbtxt").write_text(FAULTY_CONFIG)
    (root / "faulty" / "1" / "model.py").write_text(FAULTY)
    (root / "all_but_c" / "1").mkdir(parents=True)
    (root / "all_but_c" / "config.pbtxt").write_text(ALL_BUT_C_CONFIG)
    (root / "all_but_c" / "1" / "model.py").write_text(ALL_BUT_C)
    (root / "counting" / "1").mkdir(parents=True)
    (root / "counting" / "config.pbtxt").write_text(COUNTING_CONFIG)
    (root / "counting" / "1" / "model.py").write_text(COUNTING)
    # The same model with no dynamic_batching in its config.pbtxt.
    (root / "alone" / "1").mkdir(parents=True)
    lines = COUNTING_CONFIG.splitlines(keepends=True)
    (root / "alone" / "config.pbtxt").write_text(
        "".join(line for line in lines if not line.startswith("dynamic_batching"))
    )
    (root / "alone" / "1" / "model.py").write_text(COUNTING)
    for name in ("answering", "answering_thread"):
        shutil.copytree(ANSWERS / "error_codes", root / name)
        config = root / name / "config.pbtxt"
        config.write_text(config.read_text() + BATCH_OF_3)
    # A config.yaml is read instead of config.pbtxt (which the model still reads for its
    # tensors): it says the batcher too, or the scheduler's default delay would join the
    # three requests only when they come within it.
    (root / "answering_thread" / "config.yaml").write_text(
        "backend: python\nisolation: thread\ndynamic_batching:\n"
        "  {preferred_batch_size: [3], max_queue_delay_microseconds: 30000000}\n"
    )
    # The same model answering each request at once (no dynamic_batching: one a batch).
    shutil.copytree(ANSWERS / "error_codes", root / "answering_now")
    shutil.copytree(ANSWERS / "as_made", root / "as_made")
    for name in ("requested_only", "requested_only_thread"):  # batches of 3, as BATCH_OF_3
        shutil.copytree(ANSWERS / "requested_only", root / name)
    (root / "requested_only_thread" / "config.yaml").write_text(
        "backend: python\nisolation: thread\n"
    )
    # manual: batches wait up to the configured delay, as Triton's dynamic batcher does.
    config = RuntimeConfig.model_validate({"scheduler": {"mode": "manual"}})
    with serve_in_thread(config, scan_repository(root)) as running:
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


def _infer(client: Any, model: str, arrays: dict[str, np.ndarray], outputs: list[str]) -> Any:
    mod = _mod(client)
    inputs = []
    for name, array in arrays.items():
        datatype = "FP32" if array.dtype == np.float32 else "INT32"
        tensor = mod.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    requested = [mod.InferRequestedOutput(name) for name in outputs]
    return client.infer(model, inputs, outputs=requested)


@pytest.mark.parametrize("model", ["add_sub", "add_sub_thread"])
def test_add_sub_answers_as_on_triton(client: Any, model: str) -> None:
    """Triton's add_sub (in a worker process, and in a thread): sum and difference."""
    a = np.array([1.0, 2.5, -3.0, 4.0], dtype=np.float32)
    b = np.array([0.5, 0.5, 1.0, -4.0], dtype=np.float32)
    result = _infer(client, model, {"INPUT0": a, "INPUT1": b}, ["OUTPUT0", "OUTPUT1"])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_the_metadata_comes_from_config_pbtxt(client: Any) -> None:
    """Inputs and outputs are config.pbtxt's (a batch dimension only with max_batch_size)."""
    meta = client.get_model_metadata("add_sub")
    inputs = (
        meta["inputs"]
        if isinstance(meta, dict)
        else [{"name": i.name, "datatype": i.datatype, "shape": list(i.shape)} for i in meta.inputs]
    )
    assert [(i["name"], i["datatype"], [int(d) for d in i["shape"]]) for i in inputs] == [
        ("INPUT0", "FP32", [4]),
        ("INPUT1", "FP32", [4]),
    ]


def test_the_config_names_the_python_backend_as_triton_does(client: Any) -> None:
    """Triton 2.51 on add_sub: metadata platform "python"; config backend "python" and
    platform "" (the config said backend onnxruntime, platform python)."""
    meta = client.get_model_metadata("add_sub")
    config = client.get_model_config("add_sub")
    if isinstance(meta, dict):
        platform = meta["platform"]
    else:
        platform, config = meta.platform, {"backend": config.config.backend,
                                           "platform": config.config.platform}  # fmt: skip
    assert (platform, config["backend"], config["platform"]) == ("python", "python", "")


def test_auto_complete_config_gives_a_batched_model(client: Any) -> None:
    """auto_complete_config's inputs, outputs and max_batch_size serve: rows of 4; its
    dynamic batcher waits 0 µs to fill a batch, as on Triton 2.51 (it waited 10 ms)."""
    config = client.get_model_config("auto_complete")
    if isinstance(config, dict):
        delay = config["dynamic_batching"]["max_queue_delay_microseconds"]
    else:
        delay = config.config.dynamic_batching.max_queue_delay_microseconds
    assert delay == 0
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), dtype=np.float32)
    result = _infer(client, "auto_complete", {"INPUT0": a, "INPUT1": b}, ["OUTPUT0", "OUTPUT1"])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (1, "execute raised ValueError('one is not welcome')"),
        (2, "execute returned 0 responses for 1 requests"),
        (3, "three is wrong"),  # a response's error: the model's words, as on Triton
    ],
)
def test_a_failing_execute_is_a_clear_error_and_the_worker_serves_on(
    client: Any, value: int, said: str
) -> None:
    """An exception, a wrong response count or a response error fails that request only."""
    with pytest.raises(InferenceServerException) as caught:
        _infer(client, "faulty", {"X": np.array([value], dtype=np.int32)}, ["Y"])
    assert said in str(caught.value.message())
    ok = _infer(client, "faulty", {"X": np.array([7], dtype=np.int32)}, ["Y"])
    assert ok.as_numpy("Y").tolist() == [70]


@pytest.mark.parametrize("model", ["answering", "answering_thread"])
def test_a_response_error_answers_its_request_alone_and_the_batch_runs_once(
    server: RunningServer, model: str
) -> None:
    """One request of a batch answered with an error: it gets that error as the model
    wrote it (Triton's status: INVALID_ARG is a 400), the others their answers from the
    same execute (a batch of 3, not run again one by one), and no worker failure is
    counted (the model answered; it did not fail)."""
    url = server.url.removeprefix("http://")

    def send(value: int) -> object:
        client = httpclient.InferenceServerClient(url=url)
        try:
            result = _infer(client, model, {"X": np.array([[value]], np.int32)}, ["N"])
            return int(result.as_numpy("N")[0, 0])
        except InferenceServerException as error:
            return (error.status(), error.message())
        finally:
            client.close()

    def failures() -> int:
        return counter_sum(server, "sordino_worker_failures", lambda x: x["model"] == model)

    before = failures()
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(send, [5, -4, 7]))  # -4: INVALID_ARG
    assert answers == [305, ("400", "no answer for -4"), 307]
    assert failures() == before
    rejected = counter_sum(
        server,
        "sordino_requests",
        lambda x: x["model"] == model and x["reason"] == "model_rejected",
    )
    assert rejected >= 1


@pytest.mark.parametrize("model", ["requested_only", "requested_only_thread"])
def test_each_request_gets_the_outputs_its_response_has(server: RunningServer, model: str) -> None:
    """A batch of 3 whose responses each hold only the outputs their request asked for
    (requested_output_names()): each request gets its own, as on Triton 2.51 (the
    parity bench compares them); an output the model never returns (C) is left out
    even when asked for, not an error."""
    url = server.url.removeprefix("http://")

    def send(value_and_outputs: tuple[int, list[str]]) -> dict[str, Any]:
        value, outputs = value_and_outputs
        client = httpclient.InferenceServerClient(url=url)
        try:
            result = _infer(client, model, {"X": np.array([[value]], np.int32)}, outputs)
            names = [output["name"] for output in result.get_response()["outputs"]]
            return {name: result.as_numpy(name).tolist() for name in names}
        finally:
            client.close()

    asked = [(1, ["A"]), (2, ["B"]), (3, ["A", "B", "C"])]
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(send, asked))
    assert answers == [{"A": [[10]]}, {"B": [[b"2"]]}, {"A": [[30]], "B": [[b"3"]]}]
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        alone = _infer(grpc, model, {"X": np.array([[4]], np.int32)}, ["C"])
        assert list(alone.get_response().outputs) == []
    finally:
        grpc.close()


def test_outputs_asked_for_are_answered_those_the_model_gave(client: Any) -> None:
    """A model that gives A, B and D of A-D, asked for A and C: A alone, not an error."""
    result = _infer(client, "all_but_c", {"X": np.array([[5]], np.int32)}, ["A", "C"])
    response = result.get_response()
    names = (
        [o["name"] for o in response["outputs"]]
        if isinstance(response, dict)
        else [o.name for o in response.outputs]
    )
    assert names == ["A"] and result.as_numpy("A").tolist() == [[5]]


# Triton 2.51's answer to a response with each error code (UNKNOWN, INTERNAL, NOT_FOUND,
# INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED), measured side by
# side with it on the same model (docs/backends.md, "Errors").
TRITON_HTTP = ["400", "500", "404", "400", "503", "501", "400", "400"]
TRITON_GRPC = [
    "UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARGUMENT", "UNAVAILABLE", "UNIMPLEMENTED",
    "ALREADY_EXISTS", "CANCELLED",
]  # fmt: skip


@pytest.mark.parametrize("code", range(8))
def test_a_response_errors_code_gives_tritons_status(client: Any, code: int) -> None:
    with pytest.raises(InferenceServerException) as caught:
        _infer(client, "answering_now", {"X": np.array([[-1 - code]], np.int32)}, ["N"])
    expected = (
        TRITON_HTTP[code] if _mod(client) is httpclient else f"StatusCode.{TRITON_GRPC[code]}"
    )
    assert caught.value.status() == expected
    assert caught.value.message() == f"no answer for {-1 - code}"


def test_outputs_are_answered_in_the_datatype_execute_gave_them(client: Any) -> None:
    """An output returned in another datatype than config.pbtxt declares is answered in
    its own, as Triton 2.51 answers it (INT64 and BYTES for FP32 here), never cast."""
    result = _infer(client, "as_made", {"X": np.array([[1]], np.int32)}, ["I", "S", "F"])
    datatypes = {}
    for name in ("I", "S", "F"):
        output = result.get_output(name)
        datatypes[name] = output["datatype"] if isinstance(output, dict) else output.datatype
    assert datatypes == {"I": "INT64", "S": "BYTES", "F": "FP32"}
    assert result.as_numpy("I").tolist() == [[1, 2]]
    assert result.as_numpy("S").tolist() == [[b"a", b"b"]]


def test_execute_gets_the_requests_the_scheduler_batched(server: RunningServer) -> None:
    """Three requests (1, 2 and 3 rows) batched together reach execute as three requests."""
    url = server.url.removeprefix("http://")

    def send(rows: int) -> list[int]:
        client = httpclient.InferenceServerClient(url=url)
        try:
            result = _infer(client, "counting", {"X": np.zeros((rows, 1), np.int32)}, ["N"])
            return [int(v) for v in result.as_numpy("N").reshape(-1)]
        finally:
            client.close()

    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(send, [1, 2, 3]))
    # preferred_batch_size 6 and a 30 s delay: the three (6 rows) form one batch.
    assert answers == [[301], [302, 302], [303, 303, 303]]


def test_without_dynamic_batching_each_request_is_executed_alone(server: RunningServer) -> None:
    """As Triton's default scheduler: a config.pbtxt with max_batch_size but no
    dynamic_batching never joins requests — concurrent requests of 1, 2 and 3 rows
    each reach execute alone (with all their rows), where sordino would batch them."""
    url = server.url.removeprefix("http://")
    gate = threading.Barrier(6)

    def send(rows: int) -> list[int]:
        client = httpclient.InferenceServerClient(url=url)
        try:
            gate.wait()
            result = _infer(client, "alone", {"X": np.zeros((rows, 1), np.int32)}, ["N"])
            return [int(v) for v in result.as_numpy("N").reshape(-1)]
        finally:
            client.close()

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(send, [1, 2, 3, 1, 2, 3]))
    assert answers == [[101], [102, 102], [103, 103, 103]] * 2


def test_custom_metrics_show_in_metrics(server: RunningServer) -> None:
    """A MetricFamily counter the model increments is in sordino's /metrics, Triton's name."""
    client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        x = np.ones(4, dtype=np.float32)
        result = _infer(client, "custom_metrics", {"INPUT0": x, "INPUT1": x}, ["OUTPUT0"])
        assert result.as_numpy("OUTPUT0").tolist() == [2.0] * 4
    finally:
        client.close()
    text = httpx.get(f"{server.url}/metrics").text
    assert "# HELP requests_process_latency_ns Cumulative time spent processing" in text
    line = next(
        line for line in text.splitlines() if line.startswith("requests_process_latency_ns{")
    )
    assert 'model="custom_metrics"' in line and 'version="1"' in line
    assert float(line.rsplit(" ", 1)[1]) > 0


def test_a_model_that_kills_its_worker_is_restarted_and_others_lose_nothing(
    server: RunningServer,
) -> None:
    """os._exit in execute: that request fails, the worker comes back, add_sub never stops."""
    client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        with pytest.raises(InferenceServerException):
            _infer(client, "faulty", {"X": np.array([9], dtype=np.int32)}, ["Y"])
        x = np.ones(4, dtype=np.float32)
        result = _infer(client, "add_sub", {"INPUT0": x, "INPUT1": x}, ["OUTPUT0"])
        assert result.as_numpy("OUTPUT0").tolist() == [2.0] * 4

        def serves_again() -> bool:
            try:
                answer = _infer(client, "faulty", {"X": np.array([5], dtype=np.int32)}, ["Y"])
            except InferenceServerException:
                return False
            return bool(answer.as_numpy("Y").tolist() == [50])

        wait_for(serves_again, "the faulty model's worker to be restarted", timeout=60)
    finally:
        client.close()


def test_auto_complete_max_batch_size_bounds_requests(client: Any) -> None:
    """max_batch_size 4 from auto_complete_config: a request of 5 rows is refused, as on Triton."""
    rows = np.zeros((5, 4), dtype=np.float32)
    with pytest.raises(InferenceServerException) as caught:
        _infer(client, "auto_complete", {"INPUT0": rows, "INPUT1": rows}, ["OUTPUT0"])
    assert "4" in str(caught.value.message())


def test_a_version_folder_without_model_py_names_the_file(tmp_path: Path) -> None:
    """backend: python and no model.py: refused at discovery, saying what is expected."""
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text('backend: "python"\n')
    with pytest.raises(ModelLoadError, match=r"no model.py file in .*m/1 \(expected model.py\)"):
        scan_repository(tmp_path)


def test_a_decoupled_model_loads_and_refuses_a_one_answer_call(tmp_path: Path) -> None:
    """model_transaction_policy { decoupled: true }: the metadata says so, and ``infer``
    (one answer per request) is a clear error; its responses are a stream."""
    version = tmp_path / "repeat" / "1"
    version.mkdir(parents=True)
    (tmp_path / "repeat" / "config.pbtxt").write_text(
        'backend: "python"\nmodel_transaction_policy { decoupled: true }\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    )
    (version / "model.py").write_text(
        "class TritonPythonModel:\n    def execute(self, requests):\n        return None\n"
    )
    backend = create_backend(
        ModelRunOptions("python"), name="repeat", version="1", providers=(), intra_op_threads=None
    )
    backend.load(version / "model.py", "cpu")
    assert backend.metadata.decoupled
    with pytest.raises(
        RuntimeError, match=r"model repeat is decoupled: its responses are a stream"
    ):
        backend.infer({"IN": np.array([1], np.int32)})
