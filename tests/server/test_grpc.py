"""The KServe v2 gRPC endpoint against a real server, through the official tritonclient."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sordino.testing import RunningServer
from tests.conftest import digits_pixels
from tests.server.helpers import Gate, stats
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def server(thread_server: RunningServer) -> RunningServer:
    """Batches are held inside the backend here, so the models run on server threads."""
    return thread_server


@pytest.fixture(scope="module")
def client(server: RunningServer) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url)


def _input(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def test_health_and_server_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("simple") and client.is_model_ready("simple", "1")
    assert not client.is_model_ready("no-such-model")
    assert not client.is_model_ready("simple", "9")
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "sordino"
    assert {"model_repository", "statistics", "model_configuration"} <= set(metadata["extensions"])


def test_model_metadata_matches_http(
    client: grpcclient.InferenceServerClient, server: RunningServer
) -> None:
    via_grpc = client.get_model_metadata("digits-classifier", as_json=True)
    via_http = httpclient.InferenceServerClient(server.url[len("http://") :]).get_model_metadata(
        "digits-classifier"
    )
    assert via_grpc["name"] == via_http["name"] == "digits-classifier"
    assert via_grpc["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": ["-1", "64"]}]
    assert via_http["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]


def test_model_config(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("simple", as_json=True)["config"]
    assert config["max_batch_size"] == 64
    assert config["input"][0] == {"name": "INPUT0", "data_type": "TYPE_INT32", "dims": ["16"]}
    assert config["dynamic_batching"]["priority_levels"] == "3"
    countdown = client.get_model_config("countdown", as_json=True)["config"]
    assert countdown["model_transaction_policy"] == {"decoupled": True}


def test_infer_fp32_matches_onnxruntime(
    client: grpcclient.InferenceServerClient, reference: dict[str, Any]
) -> None:
    pixels = digits_pixels(3)
    result = client.infer("digits-classifier", [_input("pixels", pixels, "FP32")], request_id="r1")
    expected = reference["digits-classifier"].run(None, {"pixels": pixels})[0]
    np.testing.assert_allclose(result.as_numpy("probabilities"), expected, rtol=1e-6)
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == (
        "digits-classifier",
        "1",
        "r1",
    )


def test_infer_int32_with_selected_output(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    result = client.infer(
        "simple",
        [_input("INPUT0", a, "INT32"), _input("INPUT1", b, "INT32")],
        outputs=[grpcclient.InferRequestedOutput("OUTPUT1")],
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0") is None


def test_infer_bytes(client: grpcclient.InferenceServerClient) -> None:
    text = np.array([[b"Hello World"], [b"MiXeD"]], dtype=object)
    result = client.infer("text-normalizer", [_input("text", text, "BYTES")])
    assert result.as_numpy("normalized").tolist() == [[b"hello world"], [b"mixed"]]


def test_priority_and_timeout_parameters(client: grpcclient.InferenceServerClient) -> None:
    pixels = digits_pixels(1)
    result = client.infer(
        "digits-classifier", [_input("pixels", pixels, "FP32")], priority=1, timeout=5_000_000
    )
    assert result.as_numpy("probabilities").shape == (1, 10)


def test_statistics_count_grpc_requests(client: grpcclient.InferenceServerClient) -> None:
    def successes() -> int:
        model = client.get_inference_statistics("simple", as_json=True)["model_stats"][0]
        return int(model["inference_stats"]["success"].get("count", 0))

    before = successes()
    a = np.ones((1, 16), dtype=np.int32)
    for _ in range(2):
        client.infer("simple", [_input("INPUT0", a, "INT32"), _input("INPUT1", a, "INT32")])
    assert successes() == before + 2
    everything = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {m["name"] for m in everything} >= {"simple", "countdown"}


def test_stream_countdown(client: grpcclient.InferenceServerClient) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        count = np.array([[3]], dtype=np.int32)
        client.async_stream_infer("countdown", [_input("COUNT", count, "INT32")], request_id="c")
        seen = []
        for _ in range(3):
            result, error = results.get(timeout=30)
            assert error is None
            response = result.get_response()
            assert response.id == "c"
            seen.append(
                (
                    int(result.as_numpy("REMAINING")[0, 0]),
                    response.parameters["triton_final_response"].bool_param,
                )
            )
        assert seen == [(2, False), (1, False), (0, True)]
        # A model that does not stream answers a stream request once.
        a = np.ones((1, 16), dtype=np.int32)
        client.async_stream_infer(
            "simple", [_input("INPUT0", a, "INT32"), _input("INPUT1", a, "INT32")]
        )
        result, error = results.get(timeout=30)
        assert error is None and result.as_numpy("OUTPUT0").tolist() == [[2] * 16]
    finally:
        client.stop_stream()


def test_stream_empty_final_response(client: grpcclient.InferenceServerClient) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        count = np.array([[1]], dtype=np.int32)
        client.async_stream_infer(
            "countdown", [_input("COUNT", count, "INT32")], enable_empty_final_response=True
        )
        first, error = results.get(timeout=30)
        assert error is None and first.as_numpy("REMAINING").tolist() == [[0]]
        assert not first.get_response().parameters["triton_final_response"].bool_param
        last, error = results.get(timeout=30)
        assert error is None and not last.get_response().outputs
        assert last.get_response().parameters["triton_final_response"].bool_param
    finally:
        client.stop_stream()


def test_aio_client_infer_and_stream(server: RunningServer) -> None:
    async def run() -> tuple[list[int], list[int]]:
        async with aioclient.InferenceServerClient(server.grpc_url) as client:
            assert await client.is_server_ready()
            x = aioclient.InferInput("INPUT0", [1, 16], "INT32")
            x.set_data_from_numpy(np.full((1, 16), 5, dtype=np.int32))
            y = aioclient.InferInput("INPUT1", [1, 16], "INT32")
            y.set_data_from_numpy(np.full((1, 16), 2, dtype=np.int32))
            results = await asyncio.gather(*(client.infer("simple", [x, y]) for _ in range(8)))
            sums = [int(r.as_numpy("OUTPUT0")[0, 0]) for r in results]

            async def requests() -> Any:
                count = aioclient.InferInput("COUNT", [1, 1], "INT32")
                count.set_data_from_numpy(np.array([[2]], dtype=np.int32))
                yield {"model_name": "countdown", "inputs": [count], "request_id": "s"}

            streamed = []
            async for result, error in client.stream_infer(requests()):
                assert error is None
                streamed.append(int(result.as_numpy("REMAINING")[0, 0]))
                if result.get_response().parameters["triton_final_response"].bool_param:
                    break
            return sums, streamed

    sums, streamed = asyncio.run(asyncio.wait_for(run(), 60))
    assert sums == [7] * 8
    assert streamed == [1, 0]


def test_grpc_and_http_requests_share_a_batch(
    client: grpcclient.InferenceServerClient, server: RunningServer
) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    base = stats(server, "simple").accepted
    with concurrent.futures.ThreadPoolExecutor(1) as pool, Gate(server, "simple") as gate:
        # The first request holds the only instance; the next two queue behind it.
        hold = client.async_infer(
            "simple",
            [_input("INPUT0", a, "INT32"), _input("INPUT1", a, "INT32")],
            lambda result, error: None,
        )
        wait_for(gate.entered.is_set, "the first batch to start")
        grpc_done: queue.Queue[Any] = queue.Queue()
        client.async_infer(
            "simple",
            [_input("INPUT0", a, "INT32"), _input("INPUT1", a, "INT32")],
            lambda result, error: grpc_done.put((result, error)),
        )
        # On a thread of its own: tritonclient.http's async_infer only sends when gevent's
        # hub runs (a get_result), and waiting below with time.sleep never runs it.
        via_http = pool.submit(_http_infer, server, a)
        wait_for(lambda: stats(server, "simple").queue.depth == 2, "both requests to queue")
        gate.release()
        result, error = grpc_done.get(timeout=30)
        assert error is None and result.as_numpy("OUTPUT0").tolist() == [[2] * 16]
        assert via_http.result(timeout=30).tolist() == [[2] * 16]
        del hold
        assert gate.rows == [1, 2]
    assert gate.rows == [1, 2]  # the gRPC and the HTTP request ran as one batch of 2
    assert stats(server, "simple").accepted == base + 3


def _http_infer(server: RunningServer, a: np.ndarray) -> np.ndarray:
    """``simple`` on ``a`` and ``a`` through tritonclient.http, on the calling thread."""
    http = httpclient.InferenceServerClient(server.url[len("http://") :])
    h0 = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    h0.set_data_from_numpy(a)
    h1 = httpclient.InferInput("INPUT1", [1, 16], "INT32")
    h1.set_data_from_numpy(a)
    try:
        out: np.ndarray = http.infer("simple", [h0, h1]).as_numpy("OUTPUT0")
        return out
    finally:
        http.close()


def test_trace_settings_without_a_trace_file_read_as_tritons(
    client: grpcclient.InferenceServerClient,
) -> None:
    """Started with no trace file: Triton 2.51's defaults, and no tracing to switch on."""
    settings = client.get_trace_settings(as_json=True)["settings"]
    assert {name: given["value"] for name, given in settings.items()} == {
        "trace_level": ["OFF"], "trace_rate": ["1000"], "trace_count": ["-1"],
        "log_frequency": ["0"], "trace_file": [""], "trace_mode": ["triton"],
    }  # fmt: skip
    with pytest.raises(InferenceServerException) as info:
        client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "trace file name is not given" in info.value.message()
