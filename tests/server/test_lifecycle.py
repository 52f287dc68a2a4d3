"""open_server: both ports are bound before any model loads, and given back on failure."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from sordino.config import RuntimeConfig
from sordino.errors import ModelLoadError
from sordino.models.repository import builtin_sources
from sordino.server.lifecycle import open_server
from sordino.server.runtime import Runtime
from sordino.testing import serve_in_thread
from tests.waiting import wait_for


@contextmanager
def _taken_port() -> Iterator[int]:
    """A loopback port another program listens on while the block runs."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _config(grpc_port: int) -> RuntimeConfig:
    return RuntimeConfig.model_validate(
        {"server": {"host": "127.0.0.1", "http_port": 0, "grpc_port": grpc_port}}
    )


async def test_a_taken_grpc_port_stops_start_up_before_any_model_loads() -> None:
    prepared: list[Runtime] = []
    with _taken_port() as port, pytest.raises(OSError) as raised:
        async with open_server(_config(port), builtin_sources(), prepare=prepared.append):
            pass
    assert str(raised.value) == (
        f"cannot listen for gRPC on 127.0.0.1:{port}: Address already in use; pick another "
        "port with --grpc-port (0 picks a free one)"
    )
    assert prepared == []  # nothing got as far as loading


async def test_a_failed_start_gives_the_grpc_port_back(tmp_path: Path) -> None:
    """The gRPC port is held from before loading; a model that fails to load frees it."""
    port = _free_port()
    digits = next(s for s in builtin_sources() if s.name == "digits-classifier")
    broken = replace(digits, path=tmp_path / "not-a-model.onnx")
    broken.path.write_bytes(b"not onnx")
    with pytest.raises(ModelLoadError):
        async with open_server(_config(port), [broken]):
            pass
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))  # raises if gRPC still held it


def test_the_in_process_close_finishes_within_shutdown_timeout_with_a_batch_in_flight() -> None:
    """Issue 27 (d): serve_in_thread's close (open_server's) with a batch held in its
    worker far longer than server.shutdown_timeout: the close ends in about the timeout,
    and the request in flight is answered 503 (shutting down), not dropped."""
    config = RuntimeConfig.model_validate({"server": {"shutdown_timeout": 1.0}})
    digits = [s for s in builtin_sources() if s.name == "digits-classifier"]
    answers: list[httpx.Response | BaseException] = []
    client: threading.Thread | None = None
    with serve_in_thread(config, digits) as server:

        async def hold() -> None:
            server.runtime.executor.inject_fault(
                "worker:digits-classifier", "latency", latency_s=50.0
            )

        server.call(hold())

        def infer() -> None:
            body = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                                "data": [1.0] * 64}]}  # fmt: skip
            url = f"{server.url}/v2/models/digits-classifier/infer"
            try:
                answers.append(httpx.post(url, json=body, timeout=60))
            except httpx.HTTPError as exc:
                answers.append(exc)

        client = threading.Thread(target=infer)
        client.start()
        scheduler = server.runtime.get("digits-classifier", None).scheduler
        wait_for(lambda: scheduler.statistics().running_batches >= 1, "the batch to run")
        closing = time.monotonic()
    took = time.monotonic() - closing
    client.join(timeout=30)
    assert took < 1.0 + 12.0, f"the close took {took:.1f} s"
    assert len(answers) == 1 and isinstance(answers[0], httpx.Response), answers
    assert answers[0].status_code == 503, answers[0].text
    assert "stopping" in answers[0].json()["error"]
