"""The KServe v2 HTTP endpoints against a real server: metadata, infer, extensions."""

from __future__ import annotations

import json
import struct
from typing import Any

import httpx
import numpy as np
import pytest

from sordino.testing import RunningServer
from tests.conftest import digits_pixels


@pytest.fixture
def client(server: RunningServer) -> httpx.Client:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def _infer_json(
    client: httpx.Client, model: str, inputs: list[dict[str, Any]], **extra: Any
) -> httpx.Response:
    return client.post(f"/v2/models/{model}/infer", json={"inputs": inputs, **extra})


def test_server_metadata_lists_extensions(client: httpx.Client) -> None:
    body = client.get("/v2").json()
    assert body["name"] == "sordino"
    assert {"binary_tensor_data", "statistics", "model_configuration"} <= set(body["extensions"])


def test_health_endpoints(client: httpx.Client) -> None:
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 200
    assert client.get("/v2/models/digits-classifier/ready").status_code == 200
    assert client.get("/v2/models/digits-classifier/versions/1/ready").status_code == 200


def test_model_metadata(client: httpx.Client) -> None:
    body = client.get("/v2/models/digits-classifier").json()
    assert body["name"] == "digits-classifier"
    assert body["versions"] == ["1"]
    assert body["platform"] == "onnxruntime_onnx"
    assert body["inputs"] == [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]
    assert body["outputs"] == [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}]


def test_model_config_is_triton_shaped(client: httpx.Client) -> None:
    body = client.get("/v2/models/simple/config").json()
    assert body["max_batch_size"] == 64
    # Every field Triton 2.51 writes for an input, its defaults where sordino has none.
    assert body["input"][0] == {
        "name": "INPUT0", "data_type": "TYPE_INT32", "format": "FORMAT_NONE", "dims": [16],
        "is_shape_tensor": False, "allow_ragged_batch": False, "optional": False,
        "is_non_linear_format_io": False,
    }  # fmt: skip
    assert list(body) == [
        "name", "platform", "backend", "runtime", "version_policy", "max_batch_size", "input",
        "output", "batch_input", "batch_output", "optimization", "dynamic_batching",
        "instance_group", "default_model_filename", "cc_model_filenames", "metric_tags",
        "parameters", "model_warmup",
    ]  # fmt: skip
    assert body["default_model_filename"] == "simple.onnx"  # the file it serves
    assert body["dynamic_batching"]["priority_levels"] == 3
    assert body["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 1024
    text = client.get("/v2/models/text-normalizer/config").json()
    assert text["input"][0]["data_type"] == "TYPE_STRING"


def test_infer_json_matches_onnxruntime(client: httpx.Client, reference: dict[str, Any]) -> None:
    pixels = digits_pixels(3)
    response = _infer_json(
        client,
        "digits-classifier",
        [{"name": "pixels", "shape": [3, 64], "datatype": "FP32", "data": pixels.tolist()}],
    )
    assert response.status_code == 200, response.text
    body = response.json()
    out = body["outputs"][0]
    assert out["name"] == "probabilities" and out["shape"] == [3, 10]
    expected = reference["digits-classifier"].run(None, {"pixels": pixels})[0]
    np.testing.assert_allclose(np.array(out["data"]).reshape(3, 10), expected, rtol=1e-6)
    assert body["model_name"] == "digits-classifier" and body["model_version"] == "1"


def test_infer_binary_input_and_output(client: httpx.Client, reference: dict[str, Any]) -> None:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.ones((2, 16), dtype=np.int32)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": [2, 16],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": a.nbytes},
                },
                {
                    "name": "INPUT1",
                    "shape": [2, 16],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": b.nbytes},
                },
            ],
            "outputs": [
                {"name": "OUTPUT0", "parameters": {"binary_data": True}},
                {"name": "OUTPUT1"},
            ],
        }
    ).encode()
    response = client.post(
        "/v2/models/simple/infer",
        content=header + a.tobytes() + b.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200, response.text
    length = int(response.headers["Inference-Header-Content-Length"])
    meta = json.loads(response.content[:length])
    binary = np.frombuffer(response.content[length:], dtype=np.int32).reshape(2, 16)
    np.testing.assert_array_equal(binary, a + b)
    assert [o["name"] for o in meta["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    np.testing.assert_array_equal(np.array(meta["outputs"][1]["data"]).reshape(2, 16), a - b)


def test_infer_bytes_model(client: httpx.Client) -> None:
    response = _infer_json(
        client,
        "text-normalizer",
        [{"name": "text", "shape": [3, 1], "datatype": "BYTES",
          "data": ["Hello World", "ABC", "ÉCOLE"]}],
    )  # fmt: skip
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == ["hello world", "abc", "école"]


def test_infer_bytes_binary_roundtrip(client: httpx.Client) -> None:
    words = [b"MiXeD", b"CASE"]
    raw = b"".join(struct.pack("<I", len(w)) + w for w in words)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "shape": [2, 1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    response = client.post(
        "/v2/models/text-normalizer/infer",
        content=header + raw,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200, response.text
    length = int(response.headers["Inference-Header-Content-Length"])
    tail = response.content[length:]
    assert tail == b"".join(struct.pack("<I", len(w)) + w.lower() for w in words)


def test_versioned_infer_route(client: httpx.Client) -> None:
    response = _infer_json(
        client,
        "digits-classifier/versions/1",
        [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [0.0] * 64}],
    )
    assert response.status_code == 200, response.text


def test_request_id_and_selected_output_echoed(client: httpx.Client) -> None:
    response = _infer_json(
        client,
        "simple",
        [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
        ],
        id="req-7",
        outputs=[{"name": "OUTPUT1"}],
    )
    body = response.json()
    assert body["id"] == "req-7"
    assert [o["name"] for o in body["outputs"]] == ["OUTPUT1"]


def test_statistics_count_real_work(client: httpx.Client) -> None:
    before = client.get("/v2/models/simple/stats").json()["model_stats"][0]
    for _ in range(3):
        _infer_json(
            client,
            "simple",
            [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
            ],
        )
    after = client.get("/v2/models/simple/stats").json()["model_stats"][0]
    assert (
        after["inference_stats"]["success"]["count"]
        == before["inference_stats"]["success"]["count"] + 3
    )
    assert after["inference_stats"]["success"]["ns"] > before["inference_stats"]["success"]["ns"]
    assert after["inference_count"] >= before["inference_count"] + 3
    assert after["batch_stats"]
    everything = client.get("/v2/models/stats").json()["model_stats"]
    assert {m["name"] for m in everything} == {
        "digits-classifier",
        "simple",
        "text-normalizer",
        "countdown",
        "digits-diffusion",
    }


def test_priority_and_tag_parameters_accepted(client: httpx.Client) -> None:
    inputs = [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 64}]
    assert (
        _infer_json(client, "digits-classifier", inputs, parameters={"priority": 1}).status_code
        == 200
    )
    assert (
        _infer_json(client, "digits-classifier", inputs, parameters={"priority": "low"}).status_code
        == 200
    )
    r = client.post(
        "/v2/models/digits-classifier/infer",
        json={"inputs": inputs},
        headers={"X-Sordino-Tag": "anything"},
    )
    assert r.status_code == 200


def test_metrics_exposition_after_traffic(client: httpx.Client) -> None:
    _infer_json(
        client,
        "digits-classifier",
        [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 64}],
    )
    text = client.get("/metrics").text
    for family in (
        "sordino_requests_total",
        "sordino_request_queue_seconds_bucket",
        "sordino_request_compute_seconds_bucket",
        "sordino_request_seconds_bucket",
        "sordino_batch_size_bucket",
        "sordino_queue_depth",
        "sordino_inflight_requests",
    ):
        assert family in text, family
    assert (
        'sordino_requests_total{model="digits-classifier",outcome="success",reason="ok",version="1"}'
        in text
    )


def test_accepted_connections_use_tcp_nodelay(server: RunningServer) -> None:
    import os
    import socket

    with socket.create_connection(("127.0.0.1", server.port)) as client:
        client.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert client.recv(1024).startswith(b"HTTP/1.1 200")
        local = client.getsockname()
        found = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                sock = socket.socket(fileno=os.dup(int(fd)))
            except OSError:
                continue
            with sock:
                try:
                    if sock.type == socket.SOCK_STREAM and sock.getpeername() == local:
                        found.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                except OSError:
                    pass
        assert found and all(found), found
