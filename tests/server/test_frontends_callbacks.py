"""Requests a front end forwards, answered by the engine by callback (no task a request:
``InferenceService.infer_soon``): the same outcomes as the engine's own listener gives."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
import numpy as np
import pytest

from sordino.config import RuntimeConfig
from sordino.config.tenants import hash_key
from sordino.inference import InferRequest
from sordino.models.repository import builtin_sources
from sordino.protocol.grpc_codec import decode_infer_request
from sordino.protocol.pb import kserve_v2_pb2 as pb
from sordino.server import engine_link, grpc_link, link_tensors
from sordino.server.connection_tally import ConnectionTally
from sordino.server.infer_soon import Soon
from sordino.server.link_pending import Forwarded
from sordino.testing import RunningServer, serve_in_thread
from tests.conftest import thread_isolated
from tests.server.frontend_helpers import any_connection, ask
from tests.server.helpers import SIMPLE_BODY, SIMPLE_REQUEST, Gate, stats
from tests.waiting import wait_for

ACME, SMALL = "acme-key-0123456789", "small-key-0123456789"


def _config(frontends: int) -> RuntimeConfig:
    return RuntimeConfig.model_validate(
        {
            "server": {"frontends": frontends, "shutdown_timeout": 10},
            "tenants": [
                {"name": "acme", "keys": [hash_key(ACME)]},
                {"name": "small", "keys": [hash_key(SMALL)], "rate": "1/s", "burst": 1},
            ],
            "auth": {"required": True},
        }
    )


SIMPLE = [s for s in builtin_sources() if s.name == "simple"]


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with serve_in_thread(_config(2), thread_isolated(SIMPLE)) as running:
        yield running


@pytest.fixture(scope="module")
def reference() -> Iterator[RunningServer]:
    """The same server in one process: what the engine answers on its own listener."""
    with serve_in_thread(_config(1), thread_isolated(SIMPLE)) as running:
        yield running


def _key(key: str | None) -> dict[str, str]:
    return {} if key is None else {"Authorization": f"Bearer {key}"}


def test_forwarded_requests_are_answered_by_callback(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[Soon] = []
    real = server.runtime.service.infer_soon

    def spy(*args: object, **kwargs: object) -> Soon | None:
        soon = real(*args, **kwargs)  # type: ignore[arg-type]
        if soon is not None:
            started.append(soon)
        return soon

    monkeypatch.setattr(server.runtime.service, "infer_soon", spy)
    connection = any_connection(server)
    status, _, _ = ask(connection, "POST", "/v2/models/simple/infer", SIMPLE_BODY, _key(ACME))
    connection.close()
    assert status == 200
    assert len(started) == 1


def test_keys_and_a_tenant_s_rate_hold_as_on_the_engine(
    server: RunningServer, reference: RunningServer
) -> None:
    for key in (None, "wrong-key-0123456789", ACME):
        answers = []
        for running in (server, reference):
            connection = any_connection(running)
            status, payload, headers = ask(
                connection, "POST", "/v2/models/simple/infer", SIMPLE_BODY, _key(key)
            )
            headers.pop("date", None)
            answers.append((status, payload, headers))
            connection.close()
        assert answers[0] == answers[1], key
        assert answers[0][0] == (200 if key == ACME else 401)
    connection = any_connection(server)
    codes = [
        ask(connection, "POST", "/v2/models/simple/infer", SIMPLE_BODY, _key(SMALL))[0]
        for _ in range(4)
    ]
    connection.close()
    assert codes[0] == 200 and 429 in codes


def test_a_client_that_leaves_while_its_request_runs_gets_it_cancelled(
    server: RunningServer,
) -> None:
    """The batch runs to its end unseen; the request is counted cancelled, its ticket
    given back (the tenant's slot: the next request is served) and nothing is sent."""
    before = stats(server, "simple")
    head, _, body = SIMPLE_REQUEST.partition(b"\r\n\r\n")
    keyed = head + f"\r\nAuthorization: Bearer {ACME}".encode() + b"\r\n\r\n" + body
    with Gate(server, "simple") as gate:
        leaving = any_connection(server)
        assert leaving.sock is not None
        leaving.sock.sendall(keyed)
        wait_for(gate.entered.is_set, "the request's batch to start")
        leaving.close()
        wait_for(
            lambda: stats(server, "simple").cancelled == before.cancelled + 1,
            "the engine to cancel the request the front end sent",
        )
        gate.release()
    connection = any_connection(server)
    status, _, _ = ask(connection, "POST", "/v2/models/simple/infer", SIMPLE_BODY, _key(ACME))
    connection.close()
    assert status == 200
    assert gate.rows[0] == 1


def test_a_request_that_must_wait_goes_through_a_task(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the service cannot answer by callback (``infer_soon`` gives None), the
    request is served as before, in a task."""

    def never(request: InferRequest, *args: object) -> None:
        return None

    served: list[int] = []
    real = engine_link._LinkConnection._serve

    async def spy(self: object, ident: int, *args: object) -> None:
        served.append(ident)
        await real(self, ident, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(server.runtime.service, "infer_soon", never)
    monkeypatch.setattr(engine_link._LinkConnection, "_serve", spy)
    connection = any_connection(server)
    status, _, _ = ask(connection, "POST", "/v2/models/simple/infer", SIMPLE_BODY, _key(ACME))
    connection.close()
    assert status == 200
    assert len(served) == 1


def test_answers_reach_every_client_of_a_busy_front_end(server: RunningServer) -> None:
    results: list[int] = []

    def client() -> None:
        connection = any_connection(server)
        for _ in range(10):
            results.append(
                ask(connection, "POST", "/v2/models/simple/infer", SIMPLE_BODY, _key(ACME))[0]
            )
        connection.close()

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == [200] * 40


MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def _grpc_simple(seed: int = 0) -> bytes:
    """A ModelInfer of ``simple`` (two INT32 [1, 16] inputs)."""
    message = pb.ModelInferRequest(model_name="simple", id=f"g{seed}")
    for name in ("INPUT0", "INPUT1"):
        message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        message.raw_input_contents.append(np.full((1, 16), seed, np.int32).tobytes())
    return message.SerializeToString()


def _grpc_outcome(running: RunningServer, raw: bytes, key: str | None) -> tuple[object, ...]:
    """A ModelInfer's answer: ("ok", its bytes) or its code, details and retry-after."""
    metadata = () if key is None else (("authorization", f"Bearer {key}"),)
    with grpc.insecure_channel(running.grpc_url) as channel:
        try:
            return ("ok", channel.unary_unary(MODEL_INFER)(raw, timeout=30, metadata=metadata))
        except grpc.RpcError as exc:
            trailing = tuple((k, v) for k, v in exc.trailing_metadata() or () if k == "retry-after")
            return (exc.code(), exc.details(), trailing)


def _grpc_tasks(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The arguments of every forwarded ModelInfer the engine answers in a task, as
    they come (the engine's own task path still runs them)."""
    tasks: list[object] = []
    real_task = grpc_link.GrpcCalls._infer

    async def task_spy(self: object, *args: object) -> None:
        tasks.append(args)
        await real_task(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(grpc_link.GrpcCalls, "_infer", task_spy)
    return tasks


def test_forwarded_model_infers_are_answered_by_callback_as_the_engine_answers(
    server: RunningServer, reference: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GRPC_INFER frame is queued as it is read and answered by callback (no task);
    its answers, errors included, are the engine's own, byte for byte."""
    started: list[Soon] = []
    real = server.runtime.service.infer_soon

    def spy(*args: object, **kwargs: object) -> Soon | None:
        soon = real(*args, **kwargs)  # type: ignore[arg-type]
        if soon is not None:
            started.append(soon)
        return soon

    monkeypatch.setattr(server.runtime.service, "infer_soon", spy)
    tasks = _grpc_tasks(monkeypatch)
    wrong_shape = pb.ModelInferRequest.FromString(_grpc_simple())
    wrong_shape.inputs[0].shape[:] = [1, 15]
    wrong_shape.raw_input_contents[0] = np.ones((1, 15), np.int32).tobytes()
    asks = [
        (_grpc_simple(3), ACME),
        (_grpc_simple(4), None),
        (pb.ModelInferRequest(model_name="nope").SerializeToString(), ACME),
        (wrong_shape.SerializeToString(), ACME),
    ]
    for raw, key in asks:
        assert _grpc_outcome(server, raw, key) == _grpc_outcome(reference, raw, key)
    assert _grpc_outcome(server, _grpc_simple(5), ACME)[0] == "ok"
    assert len(started) == 2  # the two served; the refused ones never reached the queue
    assert tasks == []


def test_a_model_infer_that_must_wait_goes_through_a_task(
    server: RunningServer, reference: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(request: InferRequest, *args: object) -> None:
        return None

    monkeypatch.setattr(server.runtime.service, "infer_soon", never)
    tasks = _grpc_tasks(monkeypatch)
    raw = _grpc_simple(6)
    assert _grpc_outcome(server, raw, ACME) == _grpc_outcome(reference, raw, ACME)
    assert len(tasks) == 1


def test_a_cancelled_model_infer_is_cancelled_in_the_scheduler(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's cancel crosses as a CANCEL frame: the queued request is taken out of
    the scheduler (counted cancelled, never run) and its ticket given back once."""
    cancels: list[Soon] = []
    real_cancel = Soon.cancel

    def spy(soon: Soon) -> None:
        cancels.append(soon)
        real_cancel(soon)

    monkeypatch.setattr(Soon, "cancel", spy)
    metadata = (("authorization", f"Bearer {ACME}"),)
    before = stats(server, "simple")
    with grpc.insecure_channel(server.grpc_url) as channel, Gate(server, "simple") as gate:
        infer = channel.unary_unary(MODEL_INFER)
        held = infer.future(_grpc_simple(1), timeout=30, metadata=metadata)
        wait_for(gate.entered.is_set, "the held batch to start")
        leaving = infer.future(_grpc_simple(2), timeout=30, metadata=metadata)
        wait_for(lambda: stats(server, "simple").queue.depth == 1, "the request to queue")
        leaving.cancel()
        wait_for(
            lambda: stats(server, "simple").cancelled == before.cancelled + 1,
            "the engine to cancel the call in the scheduler",
        )
        gate.release()
        assert pb.ModelInferResponse.FromString(held.result()).id == "g1"
    assert gate.rows == [1]  # the cancelled request never ran
    assert len(cancels) == 1
    after = stats(server, "simple")
    assert after.queue.depth == 0
    assert _grpc_outcome(server, _grpc_simple(7), ACME)[0] == "ok"


T = TypeVar("T")


def _on_loop(server: RunningServer, call: Callable[[], T]) -> T:
    async def run() -> T:
        return call()

    return asyncio.run_coroutine_threadsafe(run(), server.loop).result(30)


class _Transport:
    """What a link connection writes, kept (a stand-in for the socket's transport)."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def writelines(self, parts: list[Any]) -> None:
        self.frames.append(b"".join(parts))


def _grpc_frame(ident: int, seed: int) -> bytes:
    request = decode_infer_request(pb.ModelInferRequest.FromString(_grpc_simple(seed)))
    request.headers["authorization"] = f"Bearer {ACME}"
    parts, _ = link_tensors.encode_infer(ident, request, 0.0, kind=link_tensors.GRPC_INFER)
    return b"".join(parts)


def test_a_lost_link_cancels_its_model_infers_in_the_scheduler(server: RunningServer) -> None:
    """The front end's link ends (it died) with a ModelInfer queued: the engine cancels
    it in the scheduler (counted cancelled, never run)."""

    class Link:
        def __init__(self) -> None:
            self.runtime = server.runtime
            self.servicer = None
            self.connections: set[object] = set()
            self.tally = ConnectionTally()

    connection = engine_link._LinkConnection(Link())  # type: ignore[arg-type]
    transport = _Transport()
    connection.transport = transport  # type: ignore[assignment]
    before = stats(server, "simple")
    with Gate(server, "simple") as gate:
        _on_loop(server, lambda: connection.data_received(_grpc_frame(1, 1)))
        wait_for(gate.entered.is_set, "the held batch to start")
        _on_loop(server, lambda: connection.data_received(_grpc_frame(2, 2)))
        wait_for(lambda: stats(server, "simple").queue.depth == 1, "the request to queue")
        assert isinstance(connection.pending[2], Forwarded)
        _on_loop(server, lambda: connection.connection_lost(None))
        wait_for(
            lambda: stats(server, "simple").cancelled > before.cancelled,
            "the engine to cancel the queued call in the scheduler",
        )
        gate.release()
        wait_for(lambda: stats(server, "simple").queue.depth == 0, "the queue to empty")
    assert gate.rows == [1]  # the cancelled request never ran
    assert connection.pending == {}
