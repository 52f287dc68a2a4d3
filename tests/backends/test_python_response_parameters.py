"""A Python model's response parameters (``InferenceResponse(parameters=...)``, which
Tritons after 2.51 send to the client) reach the client over HTTP and gRPC, each request
of a batch its own, from a worker process and a thread, a decoupled model's stream, a
BLS caller and the response cache."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from sordino.config import RuntimeConfig
from sordino.models.repository import scan_repository
from sordino.testing import RunningServer, serve_in_thread

CONFIG = """backend: "python"
max_batch_size: 4
input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_INT32, dims: [ 1 ] } ]
dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 5000000 }
"""

MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            value = int(x.reshape(-1)[0])
            parameters = {"value": value, "batch": len(requests), "odd": bool(value % 2)}
            if value == 0:
                parameters = {}
            answers.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)], parameters=parameters)
            )
        return answers
"""

STREAM_CONFIG = """backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""

STREAM = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            sender = request.get_response_sender()
            for step in range(int(x[0])):
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("Y", np.array([step], np.int32))],
                    parameters={"step": step, "last": step == int(x[0]) - 1}))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

CALLER_CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_INT32, dims: [ 1, 1 ] } ]
output [ { name: "SEEN", data_type: TYPE_STRING, dims: [ 1 ] } ]
"""

CALLER = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            called = pb_utils.InferenceRequest(
                model_name="telling", inputs=[x], requested_output_names=["Y"]
            ).exec()
            seen = np.array([called.parameters().encode()], dtype=np.object_)
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", seen)]))
        return answers
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("repo")
    for name, config, model in (
        ("telling", CONFIG, MODEL),
        ("telling_thread", CONFIG, MODEL),
        ("caller", CALLER_CONFIG, CALLER),
        ("streaming", STREAM_CONFIG, STREAM),
        ("telling_cached", CONFIG + "response_cache { enable: true }\n", MODEL),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
        (root / name / "1" / "model.py").write_text(model)
    (root / "telling_thread" / "config.yaml").write_text("backend: python\nisolation: thread\n")
    config = RuntimeConfig.model_validate(
        {"scheduler": {"mode": "manual"}, "server": {"response_cache_size": 1 << 20}}
    )
    with serve_in_thread(config, scan_repository(root)) as running:
        yield running
    shutil.rmtree(root, ignore_errors=True)


def _http(server: RunningServer, model: str, value: int) -> dict[str, object]:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    tensor = httpclient.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    result = client.infer(model, [tensor])
    client.close()
    assert int(result.as_numpy("Y")[0, 0]) == value + 1
    return dict(result.get_response().get("parameters", {}))


@pytest.mark.parametrize("model", ["telling", "telling_thread"])
def test_each_request_of_a_batch_gets_its_responses_parameters(
    server: RunningServer, model: str
) -> None:
    with ThreadPoolExecutor(3) as pool:  # one batch, most often (its size is not asserted)
        seen = list(pool.map(lambda v: _http(server, model, v), [5, 0, 8]))
    for parameters in seen:
        parameters.pop("batch", None)
    assert seen == [{"value": 5, "odd": True}, {}, {"value": 8, "odd": False}]  # {}: none given


def test_grpc_answers_carry_them_too(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[7]], dtype=np.int32))
    response = client.infer("telling", [tensor]).get_response()
    client.close()
    parameters = response.parameters
    assert parameters["value"].int64_param == 7
    assert parameters["odd"].bool_param is True


def test_a_bls_caller_reads_them(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    tensor = httpclient.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[3]], dtype=np.int32))
    seen = client.infer("caller", [tensor]).as_numpy("SEEN")[0]
    client.close()
    assert json.loads(seen) == {"value": 3, "batch": 1, "odd": True}  # the call alone


def test_a_decoupled_models_responses_carry_theirs(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: list[object] = []
    client.start_stream(callback=lambda result, error: answers.append(error or result))
    tensor = grpcclient.InferInput("X", [1], "INT32")
    tensor.set_data_from_numpy(np.array([3], dtype=np.int32))
    client.async_stream_infer("streaming", [tensor], enable_empty_final_response=True)
    client.stop_stream()  # waits for the stream's end
    client.close()
    seen = []
    for answer in answers:
        assert not isinstance(answer, Exception), answer
        response = answer.get_response()  # type: ignore[attr-defined]
        if response.outputs:
            parameters = response.parameters
            seen.append((parameters["step"].int64_param, parameters["last"].bool_param))
    assert seen == [(0, False), (1, False), (2, True)]


def test_an_answer_from_the_response_cache_keeps_them(server: RunningServer) -> None:
    first = _http(server, "telling_cached", 9)
    again = _http(server, "telling_cached", 9)
    assert first == again and first["value"] == 9
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    stats = client.get_inference_statistics("telling_cached")["model_stats"][0]
    client.close()
    assert stats["inference_stats"]["cache_hit"]["count"] == 1
