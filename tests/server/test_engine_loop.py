"""``server.engine_loop: thread``: the engine on its own loop, the transports on the server's.

Real servers on 127.0.0.1. The cancellation and model-control tests of the shared
loop run here again against a thread-engine server (imported: the module's fixtures
give them that server); the rest check answers, Starlette routes, a drained shutdown
and a failed start-up in that mode.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from sordino.config import RuntimeConfig, load_config
from sordino.errors import ModelLoadError
from sordino.models.repository import builtin_sources, scan_repository
from sordino.server.engine_loop import ThreadEngine
from sordino.server.lifecycle import open_server
from sordino.testing import RunningServer, serve_in_thread
from tests.conftest import digits_pixels, thread_isolated
from tests.server.test_cancellation import (  # noqa: F401 - run here against this module's server
    test_cancelled_stream_stops_between_steps,
    test_grpc_cancel_removes_queued_request,
    test_http_disconnect_removes_queued_request,
)
from tests.server.test_model_control import (  # noqa: F401 - run here against explicit below
    repo,
    test_index_load_unload_over_grpc,
    test_index_load_unload_over_http,
)
from tests.waiting import wait_for

THREAD = {"server": {"engine_loop": "thread"}}


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    """The built-in models on server threads, the engine on its own loop."""
    config = RuntimeConfig.model_validate(THREAD)
    with serve_in_thread(config, thread_isolated(builtin_sources())) as running:
        yield running


@pytest.fixture
def explicit(repo: Path) -> Iterator[RunningServer]:  # noqa: F811 - the fixture imported above
    config = load_config(
        None,
        {
            "model_repository": str(repo),
            "server.model_control_mode": "explicit",
            "server.engine_loop": "thread",
        },
    )
    with serve_in_thread(config, scan_repository(repo)) as running:
        yield running


def test_the_runtime_lives_on_another_thread(server: RunningServer) -> None:
    async def where() -> str:
        return threading.current_thread().name

    assert server.call(where()) == "sordino-engine"


def test_http_and_grpc_answers_match_onnx_runtime(
    server: RunningServer, reference: dict[str, Any]
) -> None:
    pixels = digits_pixels(4)
    expected = reference["digits-classifier"].run(None, {"pixels": pixels})[0]
    for row, want in zip(pixels, expected, strict=True):
        body = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                            "data": row.tolist()}]}  # fmt: skip
        answer = httpx.post(f"{server.url}/v2/models/digits-classifier/infer", json=body)
        assert answer.status_code == 200, answer.text
        got = np.asarray(answer.json()["outputs"][0]["data"], dtype=np.float32)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("pixels", [4, 64], "FP32")
    tensor.set_data_from_numpy(pixels)
    result = client.infer("digits-classifier", [tensor])
    np.testing.assert_allclose(result.as_numpy("probabilities"), expected, rtol=1e-5, atol=1e-6)


def test_errors_keep_their_status_on_both_transports(server: RunningServer) -> None:
    answer = httpx.post(f"{server.url}/v2/models/nope/infer", json={"inputs": []})
    assert answer.status_code == 404 and "nope" in answer.json()["error"]
    answer = httpx.post(f"{server.url}/v2/models/digits-classifier/infer", content=b"{")
    assert answer.status_code == 400
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(Exception, match="nope"):
        client.infer("nope", [grpcclient.InferInput("pixels", [1, 64], "FP32")])


def test_starlette_routes_are_answered_from_the_engine(server: RunningServer) -> None:
    meta = httpx.get(f"{server.url}/v2/models/digits-classifier")
    assert meta.status_code == 200 and meta.json()["name"] == "digits-classifier"
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    metrics = httpx.get(f"{server.url}/metrics")
    assert metrics.status_code == 200 and "sordino_requests_total" in metrics.text
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    assert grpc_client.is_model_ready("digits-classifier")


def test_shutdown_drains_a_request_in_flight() -> None:
    """The close waits for a request the engine is running, which is answered 200."""
    digits = [s for s in builtin_sources() if s.name == "digits-classifier"]
    answers: list[httpx.Response | BaseException] = []
    client: threading.Thread | None = None
    with serve_in_thread(RuntimeConfig.model_validate(THREAD), digits) as server:

        async def slow() -> None:
            server.runtime.executor.inject_fault(
                "worker:digits-classifier", "latency", latency_s=1.0
            )

        server.call(slow())

        def infer() -> None:
            body = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                                "data": [1.0] * 64}]}  # fmt: skip
            try:
                url = f"{server.url}/v2/models/digits-classifier/infer"
                answers.append(httpx.post(url, json=body, timeout=60))
            except httpx.HTTPError as exc:
                answers.append(exc)

        client = threading.Thread(target=infer)
        client.start()
        scheduler = server.runtime.get("digits-classifier", None).scheduler
        wait_for(lambda: scheduler.statistics().running_batches >= 1, "the batch to run")
    client.join(timeout=30)
    assert len(answers) == 1 and isinstance(answers[0], httpx.Response), answers
    assert answers[0].status_code == 200, answers[0].text


async def test_a_failed_start_stops_the_engine_and_frees_the_ports(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = RuntimeConfig.model_validate(
        {"server": {"engine_loop": "thread", "host": "127.0.0.1", "http_port": 0,
                    "grpc_port": port}}
    )  # fmt: skip
    digits = next(s for s in builtin_sources() if s.name == "digits-classifier")
    broken = replace(digits, path=tmp_path / "not-a-model.onnx")
    broken.path.write_bytes(b"not onnx")
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(ModelLoadError):
        async with open_server(config, [broken]):
            pass
    assert "sordino-engine" not in {t.name for t in threading.enumerate()} - before
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))  # raises if gRPC still held it


async def test_cancelling_a_call_waits_for_the_work_to_unwind() -> None:
    """As awaiting on one loop: the caller goes on only once the engine's work ended."""
    engine = ThreadEngine()
    engine.start()
    started, unwound = threading.Event(), threading.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.05)
            unwound.set()

    try:
        call = asyncio.ensure_future(engine.call(work()))
        assert await asyncio.to_thread(started.wait, 30)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert unwound.is_set()
    finally:
        engine.close()
