"""A client that cancels or disconnects has its queued request removed, never run, and counted.

Each test holds the model's only instance with a gate, queues a second request behind
it, cancels that one, and checks the scheduler's counters and the batches that reached
the backend: the cancelled request never ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import socket
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient

from sordino.testing import RunningServer
from tests.server.helpers import SIMPLE_REQUEST, Gate, stats
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def server(thread_server: RunningServer) -> RunningServer:
    """Batches are held inside the backend here, so the models run on server threads."""
    return thread_server


ONES = np.ones((1, 16), dtype=np.int32)


def _inputs(module: Any = grpcclient) -> list[Any]:
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = module.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(ONES)
        tensors.append(tensor)
    return tensors


def _hold(server: RunningServer, client: grpcclient.InferenceServerClient) -> queue.Queue[Any]:
    """Send the request that the gate will hold; return where its result will arrive."""
    done: queue.Queue[Any] = queue.Queue()
    client.async_infer("simple", _inputs(), lambda result, error: done.put((result, error)))
    return done


def _check_held_request_finishes(done: queue.Queue[Any]) -> None:
    result, error = done.get(timeout=30)
    assert error is None and result.as_numpy("OUTPUT0").tolist() == [[2] * 16]


def test_grpc_cancel_removes_queued_request(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    before = stats(server, "simple")
    with Gate(server, "simple") as gate:
        held = _hold(server, client)
        wait_for(gate.entered.is_set, "the held batch to start")
        call = client.async_infer("simple", _inputs(), lambda result, error: None)
        wait_for(lambda: stats(server, "simple").queue.depth == 1, "the request to queue")
        call.cancel()
        wait_for(
            lambda: stats(server, "simple").cancelled == before.cancelled + 1,
            "the server to count the cancellation",
        )
        assert stats(server, "simple").queue.depth == 0
        gate.release()
        _check_held_request_finishes(held)
        assert gate.rows == [1]  # only the held request ever ran
    after = stats(server, "simple")
    assert after.accepted == before.accepted + 2
    assert after.succeeded == before.succeeded + 1 and after.failed == before.failed


def test_grpc_aio_task_cancel_removes_queued_request(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    before = stats(server, "simple")

    async def cancel_one() -> None:
        async with aioclient.InferenceServerClient(server.grpc_url) as aio:
            task = asyncio.ensure_future(aio.infer("simple", _inputs(aioclient)))
            queued = lambda: stats(server, "simple").queue.depth == 1  # noqa: E731
            await asyncio.to_thread(wait_for, queued, "the request to queue")
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    with Gate(server, "simple") as gate:
        held = _hold(server, client)
        wait_for(gate.entered.is_set, "the held batch to start")
        asyncio.run(asyncio.wait_for(cancel_one(), 30))
        wait_for(
            lambda: stats(server, "simple").cancelled == before.cancelled + 1,
            "the server to count the cancellation",
        )
        gate.release()
        _check_held_request_finishes(held)
        assert gate.rows == [1]


def test_http_disconnect_removes_queued_request(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    before = stats(server, "simple")
    with Gate(server, "simple") as gate:
        held = _hold(server, client)
        wait_for(gate.entered.is_set, "the held batch to start")
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(SIMPLE_REQUEST)
            wait_for(lambda: stats(server, "simple").queue.depth == 1, "the request to queue")
        wait_for(
            lambda: stats(server, "simple").cancelled == before.cancelled + 1,
            "the server to notice the disconnect",
        )
        gate.release()
        _check_held_request_finishes(held)
        assert gate.rows == [1]


def test_cancelled_stream_stops_between_steps(server: RunningServer) -> None:
    first = grpcclient.InferenceServerClient(server.grpc_url)
    second = grpcclient.InferenceServerClient(server.grpc_url)
    before = stats(server, "countdown")
    count = grpcclient.InferInput("COUNT", [1, 1], "INT32")
    count.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    results: queue.Queue[Any] = queue.Queue()
    with Gate(server, "countdown") as gate:
        first.start_stream(callback=lambda result, error: results.put((result, error)))
        first.async_stream_infer("countdown", [count])
        wait_for(gate.entered.is_set, "the first stream's step to start")
        second.start_stream(callback=lambda result, error: None)
        long = grpcclient.InferInput("COUNT", [1, 1], "INT32")
        long.set_data_from_numpy(np.array([[50]], dtype=np.int32))
        second.async_stream_infer("countdown", [long])
        wait_for(lambda: stats(server, "countdown").queue.depth == 1, "the second stream to queue")
        second.stop_stream(cancel_requests=True)
        wait_for(
            lambda: stats(server, "countdown").cancelled == before.cancelled + 1,
            "the server to count the cancelled stream",
        )
        gate.release()
        result, error = results.get(timeout=30)
        assert error is None and result.as_numpy("REMAINING").tolist() == [[0]]
        first.stop_stream()
        assert gate.rows == [1]  # the cancelled stream's step never ran
