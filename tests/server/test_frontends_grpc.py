"""``server.frontends: 2`` and gRPC: the front ends serve the gRPC port, the engine none.

One module-scoped server (the engine on a thread of this process, its two front ends
real processes): every channel's connection lands on a front end, which decodes
``ModelInfer`` and forwards the rest to the engine. What the engine answers itself is
the ``reference``, a one-process server (``server.frontends: 1``) on another thread.
Calls are made with raw bytes, so answers are compared byte for byte. Which process
accepted a connection is read from the kernel (psutil) where a test needs one.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import psutil
import pytest

from sordino.config import RuntimeConfig
from sordino.config.tenants import hash_key
from sordino.models.repository import builtin_sources
from sordino.protocol.pb import kserve_v2_pb2 as pb
from sordino.server.grpc import InferenceServicer
from sordino.server.grpc_link import StreamContext
from sordino.server.link_tensors import STREAM_WINDOW
from sordino.testing import RunningServer, serve_in_thread
from tests.conftest import thread_isolated
from tests.metrics import counter_sum
from tests.server.helpers import Gate, frontend_pid, published_backlog, stats
from tests.waiting import wait_for

SERVICE = "/inference.GRPCInferenceService/"


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    config = RuntimeConfig.model_validate({"server": {"frontends": 2, "shutdown_timeout": 10}})
    with serve_in_thread(config, thread_isolated(builtin_sources())) as running:
        yield running


@pytest.fixture(scope="module")
def reference() -> Iterator[RunningServer]:
    """One process serving its own port: what the engine answers without front ends."""
    config = RuntimeConfig.model_validate({"server": {"frontends": 1, "shutdown_timeout": 10}})
    # The same models: an error that lists them must read the same.
    with serve_in_thread(config, thread_isolated(builtin_sources())) as running:
        yield running


def _simple() -> pb.ModelInferRequest:
    """A ModelInfer of the built-in ``simple`` model (two INT32 [1, 16] inputs of ones)."""
    message = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        message.raw_input_contents.append(np.ones((1, 16), np.int32).tobytes())
    return message


def _held(server: RunningServer) -> dict[int, set[int]]:
    """Each process's connections on the gRPC port (their clients' ports)."""
    held: dict[int, set[int]] = {}
    assert server.frontends is not None
    for pid in (*server.frontends.pids(), os.getpid()):
        connections = psutil.Process(pid).net_connections(kind="tcp")
        held[pid] = {
            c.raddr.port
            for c in connections
            if c.raddr and c.laddr.port == server.grpc_port and c.status == "ESTABLISHED"
        }
    return held


def _call(channel: grpc.Channel, method: str, raw: bytes, **kwargs: object) -> bytes:
    call = channel.unary_unary(SERVICE + method)
    answer: bytes = call(raw, timeout=30, **kwargs)
    return answer


def _channel(
    server: RunningServer, pid: int, options: tuple[tuple[str, int], ...] = ()
) -> grpc.Channel:
    """A channel whose connection process ``pid`` accepted (new ones until one is)."""
    for _ in range(100):
        before = _held(server)
        channel = grpc.insecure_channel(
            server.grpc_url, options=[("grpc.use_local_subchannel_pool", 1), *options]
        )
        _call(channel, "ServerLive", b"")
        owner = None
        deadline = time.monotonic() + 10
        while owner is None and time.monotonic() < deadline:
            after = _held(server)
            new = [p for p in after if after[p] - before[p]]
            if len(new) == 1:
                owner = new[0]
            else:
                time.sleep(0.01)
        if owner == pid:
            return channel
        channel.close()
    raise AssertionError(f"no gRPC connection landed on process {pid}")


def _open(server: RunningServer) -> grpc.Channel:
    return grpc.insecure_channel(server.grpc_url, options=[("grpc.use_local_subchannel_pool", 1)])


@pytest.fixture(scope="module")
def channels(
    server: RunningServer, reference: RunningServer
) -> Iterator[tuple[grpc.Channel, grpc.Channel]]:
    """A channel through a front end, then one to the one-process reference."""
    through, own = _open(server), _open(reference)
    yield through, own
    through.close()
    own.close()


def _digits(seed: int = 0, **fields: object) -> bytes:
    pixels = np.array([[(i * 7 + seed) % 17 for i in range(64)]], dtype=np.float32)
    message = pb.ModelInferRequest(model_name="digits-classifier", id=f"r{seed}", **fields)  # type: ignore[arg-type]
    message.inputs.add(name="pixels", datatype="FP32", shape=[1, 64])
    message.raw_input_contents.append(pixels.tobytes())
    return message.SerializeToString()


def _outcome(channel: grpc.Channel, method: str, raw: bytes) -> tuple[object, ...]:
    try:
        return ("ok", _call(channel, method, raw))
    except grpc.RpcError as exc:
        trailing = tuple((k, v) for k, v in exc.trailing_metadata() or () if k == "retry-after")
        return (exc.code(), exc.details(), trailing)


def test_grpc_connections_land_on_the_front_ends_never_on_the_engine(
    server: RunningServer,
) -> None:
    assert server.frontends is not None
    owners = set()
    for _ in range(12):
        before = _held(server)
        channel = _open(server)
        answer = pb.ModelInferResponse.FromString(_call(channel, "ModelInfer", _digits()))
        assert answer.model_name == "digits-classifier"
        assert [o.name for o in answer.outputs] == ["probabilities"]
        after = _held(server)
        owners |= {pid for pid in after if after[pid] - before[pid]}
        channel.close()
    assert owners == set(server.frontends.pids())


def test_model_infer_through_the_front_end_equals_the_engines_own(
    channels: tuple[grpc.Channel, grpc.Channel],
) -> None:
    through, own = channels
    for seed in range(3):
        assert _call(through, "ModelInfer", _digits(seed)) == _call(
            own, "ModelInfer", _digits(seed)
        )
    asked = pb.ModelInferRequest.FromString(_digits(5))
    asked.outputs.add(name="probabilities")
    asked.parameters["custom"].string_param = "x"
    raw = asked.SerializeToString()
    assert _call(through, "ModelInfer", raw) == _call(own, "ModelInfer", raw)


def test_only_a_malformed_message_reaches_the_engines_servicer(
    channels: tuple[grpc.Channel, grpc.Channel], monkeypatch: pytest.MonkeyPatch
) -> None:
    through, _ = channels
    calls: list[bytes] = []
    real = InferenceServicer.ModelInfer

    async def spy(self: InferenceServicer, raw: bytes, context: Any) -> Any:
        calls.append(raw)
        return await real(self, raw, context)

    monkeypatch.setattr(InferenceServicer, "ModelInfer", spy)
    _call(through, "ModelInfer", _digits())
    assert calls == []  # decoded in the front end: facts and tensors only
    assert _outcome(through, "ModelInfer", b"\xff\xff")[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert calls == [b"\xff\xff"]  # the engine's own words for a message it refuses


def _bad_input() -> bytes:
    message = pb.ModelInferRequest.FromString(_digits())
    message.inputs[0].name = "nope"
    return message.SerializeToString()


def _too_wide() -> bytes:
    message = pb.ModelInferRequest(model_name="digits-classifier")
    message.inputs.add(name="pixels", datatype="FP32", shape=[1, 65])
    message.raw_input_contents.append(b"\0" * 4 * 65)
    return message.SerializeToString()


def _renamed(model: str) -> bytes:
    message = pb.ModelInferRequest.FromString(_digits())
    message.model_name = model
    return message.SerializeToString()


def _unknown_and_malformed() -> bytes:
    message = pb.ModelInferRequest(model_name="nope")
    message.inputs.add(name="pixels", datatype="FP32", shape=[1, 64])
    message.raw_input_contents.append(b"\0" * 3)
    return message.SerializeToString()


ERRORS: list[tuple[str, bytes]] = [
    ("unknown model", _renamed("nope")),
    ("unknown model, malformed", _unknown_and_malformed()),
    ("unknown version", _digits(model_version="9")),
    ("not protobuf", b"\xff\xff\xff"),
    ("no inputs", pb.ModelInferRequest(model_name="digits-classifier").SerializeToString()),
    ("wrong input", _bad_input()),
    ("a shape past the model's", _too_wide()),
]


@pytest.mark.parametrize(("case", "raw"), ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_are_the_same_through_either_process(
    channels: tuple[grpc.Channel, grpc.Channel], case: str, raw: bytes
) -> None:
    through, own = channels
    answer = _outcome(through, "ModelInfer", raw)
    assert answer == _outcome(own, "ModelInfer", raw)
    assert answer[0] != "ok"


@pytest.mark.parametrize(
    ("method", "raw"),
    [
        ("ServerLive", b""),
        ("ServerReady", b""),
        ("ServerMetadata", b""),
        ("ModelReady", pb.ModelReadyRequest(name="digits-classifier").SerializeToString()),
        ("ModelReady", pb.ModelReadyRequest(name="nope").SerializeToString()),
        ("ModelMetadata", pb.ModelMetadataRequest(name="digits-classifier").SerializeToString()),
        ("ModelMetadata", pb.ModelMetadataRequest(name="nope").SerializeToString()),
        ("ModelConfig", pb.ModelConfigRequest(name="simple").SerializeToString()),
        ("SystemSharedMemoryStatus", b""),
        ("RepositoryIndex", b""),
        ("ModelMetadata", b"\xff\xff"),
        ("TraceSetting", b""),
        ("LogSettings", b""),
    ],
)
def test_other_rpcs_are_answered_as_the_engine_answers_them(
    channels: tuple[grpc.Channel, grpc.Channel], method: str, raw: bytes
) -> None:
    through, own = channels
    assert _outcome(through, method, raw) == _outcome(own, method, raw)


def test_statistics_from_a_front_end_connection_count_its_requests(
    channels: tuple[grpc.Channel, grpc.Channel],
) -> None:
    through, _ = channels
    ask = pb.ModelStatisticsRequest(name="digits-classifier").SerializeToString()
    before = pb.ModelStatisticsResponse.FromString(_call(through, "ModelStatistics", ask))
    _call(through, "ModelInfer", _digits())
    after = pb.ModelStatisticsResponse.FromString(_call(through, "ModelStatistics", ask))
    counts = [s.model_stats[0].inference_stats.success.count for s in (before, after)]
    assert counts[1] == counts[0] + 1


def test_a_cancelled_call_is_cancelled_in_the_engine(
    server: RunningServer, channels: tuple[grpc.Channel, grpc.Channel]
) -> None:
    through, _ = channels
    raw = _simple().SerializeToString()
    before = stats(server, "simple")
    with Gate(server, "simple") as gate:
        held = through.unary_unary(SERVICE + "ModelInfer").future(raw, timeout=30)
        wait_for(gate.entered.is_set, "the held batch to start")
        leaving = through.unary_unary(SERVICE + "ModelInfer").future(raw, timeout=30)
        wait_for(lambda: stats(server, "simple").queue.depth == 1, "the request to queue")
        leaving.cancel()
        wait_for(
            lambda: stats(server, "simple").cancelled == before.cancelled + 1,
            "the engine to cancel the call the front end forwarded",
        )
        gate.release()
        assert pb.ModelInferResponse.FromString(held.result()).model_name == "simple"
        assert gate.rows == [1]  # the cancelled request never ran


def _with_parameters(raw: bytes, **parameters: object) -> bytes:
    message = pb.ModelInferRequest.FromString(raw)
    for name, value in parameters.items():
        if isinstance(value, str):
            message.parameters[name].string_param = value
        else:
            assert isinstance(value, int)
            message.parameters[name].int64_param = value
    return message.SerializeToString()


def test_the_front_end_refuses_a_model_infer_from_the_engines_load_board(
    server: RunningServer, channels: tuple[grpc.Channel, grpc.Channel]
) -> None:
    """A backlog the engine published is refused by the front end's gRPC too, from the
    message's parameters: the engine's status, message and retry-after, without the
    request reaching the engine's scheduler, and counted in the engine's metrics."""
    through, _ = channels
    model = "digits-classifier"
    outcomes: list[tuple[object, ...]] = []

    def send(seed: int, priority: str) -> None:
        outcomes.append(
            _outcome(through, "ModelInfer", _with_parameters(_digits(seed), priority=priority))
        )

    def shed_count() -> float:
        return counter_sum(server, "sordino_rejected_requests", lambda s: s["reason"] == "shed")

    for seed in range(3):  # the engine learns how long a batch takes: its expected wait
        _call(through, "ModelInfer", _digits(seed))
    with Gate(server, model) as gate:
        senders = [threading.Thread(target=send, args=(0, "high"))]
        senders[0].start()
        wait_for(gate.entered.is_set, "the held batch to start")
        senders += [threading.Thread(target=send, args=(i, "low")) for i in range(1, 9)]
        for sender in senders[1:]:
            sender.start()
        published_backlog(server, model, 8)
        before, counted = stats(server, model).rejected, shed_count()
        # 1 µs cannot be met behind the backlog: refused in the front end.
        code, details, trailing = _outcome(
            through, "ModelInfer", _with_parameters(_digits(20), priority="low", timeout=1)
        )
        assert code == grpc.StatusCode.UNAVAILABLE
        assert f"model {model}/1 is overloaded" in str(details)
        assert trailing and int(str(trailing[0][1])) >= 1
        assert stats(server, model).rejected == before  # the engine never saw it
        wait_for(lambda: shed_count() == counted + 1, "the engine to count the refusal")
        # A malformed priority is not the front end's to judge: the engine answers it.
        code, details, _ = _outcome(
            through, "ModelInfer", _with_parameters(_digits(21), priority="urgent", timeout=1)
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "is not a priority" in str(details)
        gate.release()
        for sender in senders:
            sender.join(30)
    assert [o[0] for o in outcomes] == ["ok"] * 9


def _countdown(count: int, ident: str) -> bytes:
    message = pb.ModelInferRequest(model_name="countdown", id=ident)
    message.inputs.add(name="COUNT", datatype="INT32", shape=[1, 1])
    message.raw_input_contents.append(np.array([[count]], np.int32).tobytes())
    return message.SerializeToString()


def test_a_stream_through_the_front_end_answers_as_the_engines_own(
    channels: tuple[grpc.Channel, grpc.Channel],
) -> None:
    sent = [_countdown(3, "c"), _renamed("nope"), b"\xff\xff", _digits(1)]
    answers = []
    for channel in channels:
        stream = channel.stream_stream(SERVICE + "ModelStreamInfer")
        # One request at a time, so that the responses' order is the same on both.
        got: list[bytes] = []
        for raw in sent:
            got += list(stream(iter([raw]), timeout=30))
        answers.append(got)
    through, own = answers
    assert through == own
    decoded = [pb.ModelStreamInferResponse.FromString(a) for a in through]
    assert [d.error_message == "" for d in decoded] == [True, True, True, False, False, True]
    assert [d.infer_response.id for d in decoded[:3]] == ["c", "c", "c"]


def test_a_stream_cancelled_through_the_front_end_is_cancelled_in_the_engine(
    server: RunningServer, channels: tuple[grpc.Channel, grpc.Channel]
) -> None:
    through, _ = channels
    raw = _simple().SerializeToString()
    before = stats(server, "simple")
    with Gate(server, "simple") as gate:
        held = through.unary_unary(SERVICE + "ModelInfer").future(raw, timeout=30)
        wait_for(gate.entered.is_set, "the held batch to start")
        stream = through.stream_stream(SERVICE + "ModelStreamInfer")(iter([raw]), timeout=30)
        wait_for(lambda: stats(server, "simple").queue.depth == 1, "the request to queue")
        stream.cancel()
        wait_for(
            lambda: stats(server, "simple").cancelled == before.cancelled + 1,
            "the engine to cancel the stream's request",
        )
        gate.release()
        assert pb.ModelInferResponse.FromString(held.result()).model_name == "simple"
        assert gate.rows == [1]


def _stream_contexts(server: RunningServer) -> list[StreamContext]:
    assert server.frontends is not None
    return [c for link in server.frontends.link.connections for c in link.grpc.streams.values()]


def test_a_slow_stream_client_holds_the_engine_back_not_the_front_ends_memory(
    server: RunningServer,
) -> None:
    # The client's HTTP/2 window stays at its first 64 KiB (no BDP probing), so a client
    # that reads nothing soon stops gRPC taking the front end's responses.
    slow = _channel(server, frontend_pid(server), (("grpc.http2.bdp_probe", 0),))
    requests, count = 64, 100
    responses = slow.stream_stream(SERVICE + "ModelStreamInfer")(
        iter([_countdown(count, f"s{i}") for i in range(requests)]), timeout=120
    )
    try:
        wait_for(lambda: len(_stream_contexts(server)) == 1, "the stream to open in the engine")
        (context,) = _stream_contexts(server)

        def held_back() -> bool:  # the engine waits for credit, twice in a row
            before = context.sent
            if not context.starved:
                return False
            time.sleep(0.2)
            return context.starved and context.sent == before

        wait_for(held_back, "the engine to wait for the front end's credit")
        assert context.sent < requests * count  # the rest waits in the model, not in memory
        # What the engine sent beyond what gRPC took for the client: at most the window.
        taken = context.granted - STREAM_WINDOW
        assert 0 < context.sent - taken <= STREAM_WINDOW
        got = [pb.ModelStreamInferResponse.FromString(raw) for raw in responses]
    finally:
        responses.cancel()
        slow.close()
    assert len(got) == requests * count
    assert all(r.error_message == "" for r in got)
    assert {r.infer_response.id for r in got} == {f"s{i}" for i in range(requests)}


def test_a_stream_client_that_sends_ahead_waits_in_grpc_not_in_the_engine() -> None:
    """The engine takes a forwarded stream's messages as its servicer reads them, and its
    servicer at most ``server.max_requests_per_stream`` at once: at most
    ``STREAM_WINDOW`` wait in the engine unread (before: every message the client sent
    was forwarded as it came and read at once; 900 MB in 20 s against `sordino start
    --frontends 2`)."""
    config = RuntimeConfig.model_validate(
        {"server": {"frontends": 2, "shutdown_timeout": 10, "max_requests_per_stream": 4}}
    )
    simple = [s for s in builtin_sources() if s.name == "simple"]
    sent = 64
    with (
        serve_in_thread(config, thread_isolated(simple)) as running,
        Gate(running, "simple") as gate,
    ):
        channel = grpc.insecure_channel(running.grpc_url)
        messages = [_simple().SerializeToString() for _ in range(sent)]
        responses = channel.stream_stream(SERVICE + "ModelStreamInfer")(iter(messages), timeout=120)
        try:
            wait_for(lambda: len(_stream_contexts(running)) == 1, "the stream to open")
            (context,) = _stream_contexts(running)
            assert gate.entered.wait(30)
            time.sleep(0.5)  # before: the rest of the 64 reached the engine in milliseconds
            # Read by the servicer (4 at most: server.max_requests_per_stream), or unread.
            taken = sum(gate.rows) + running.runtime.get("simple").scheduler.queued
            assert taken <= 4 and context.inbox.qsize() <= STREAM_WINDOW, (taken, context.inbox)
            gate.release()
            got = [pb.ModelStreamInferResponse.FromString(raw) for raw in responses]
        finally:
            responses.cancel()
            channel.close()
    assert len(got) == sent
    assert all(r.error_message == "" for r in got)


def test_a_stream_whose_servicer_fails_ends_as_the_engines_own(
    server: RunningServer,
    channels: tuple[grpc.Channel, grpc.Channel],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def broken(self: InferenceServicer, context: Any) -> None:
        raise RuntimeError("the servicer broke")

    # Both servers' servicers (the front ends' calls reach the engine's).
    monkeypatch.setattr(InferenceServicer, "ModelStreamInfer", broken)
    outcomes = []
    for channel in channels:
        with pytest.raises(grpc.RpcError) as caught:
            list(channel.stream_stream(SERVICE + "ModelStreamInfer")(iter([_digits()]), timeout=30))
        error: Any = caught.value
        outcomes.append((error.code(), error.details()))
    through, own = outcomes
    assert through == own
    assert own[0] == grpc.StatusCode.UNKNOWN


def test_a_stop_answers_the_calls_a_front_end_has_in_flight() -> None:
    config = RuntimeConfig.model_validate({"server": {"frontends": 2, "shutdown_timeout": 10}})
    simple = [s for s in builtin_sources() if s.name == "simple"]
    serving = serve_in_thread(config, thread_isolated(simple))
    server = serving.__enter__()
    frontend = psutil.Process(frontend_pid(server))
    message = _simple()
    with Gate(server, "simple") as gate:
        channel = _channel(server, frontend.pid)
        call = channel.unary_unary(SERVICE + "ModelInfer").future(
            message.SerializeToString(), timeout=60
        )
        wait_for(gate.entered.is_set, "the call to reach the model")
        stopping = threading.Thread(target=serving.__exit__, args=(None, None, None))
        stopping.start()
        wait_for(lambda: server.frontends is not None and server.frontends._stopping, "the stop")
        gate.release()
        answer = pb.ModelInferResponse.FromString(call.result())
        stopping.join(60)
    channel.close()
    assert np.frombuffer(answer.raw_output_contents[0], np.int32).tolist() == [2] * 16
    assert not frontend.is_running() or frontend.status() == psutil.STATUS_ZOMBIE


def test_system_shared_memory_works_through_the_front_end(
    channels: tuple[grpc.Channel, grpc.Channel],
) -> None:
    shm = pytest.importorskip("tritonclient.utils.shared_memory")
    through, own = channels
    tag = f"{os.getpid()}_{id(object())}"
    inputs = shm.create_shared_memory_region("g_in", f"/sordino_g_in_{tag}", 128)
    outputs = shm.create_shared_memory_region("g_out", f"/sordino_g_out_{tag}", 128)
    try:
        first = np.arange(16, dtype=np.int32).reshape(1, 16)
        shm.set_shared_memory_region(inputs, [first, first * 3])
        for name in ("g_in", "g_out"):
            register = pb.SystemSharedMemoryRegisterRequest(
                name=name, key=f"/sordino_{name}_{tag}", offset=0, byte_size=128
            )
            for channel in channels:  # the reference serves its own copy
                _call(channel, "SystemSharedMemoryRegister", register.SerializeToString())
        message = pb.ModelInferRequest(model_name="simple", id="shm")
        for name, offset in (("INPUT0", 0), ("INPUT1", 64)):
            tensor = message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
            tensor.parameters["shared_memory_region"].string_param = "g_in"
            tensor.parameters["shared_memory_byte_size"].int64_param = 64
            tensor.parameters["shared_memory_offset"].int64_param = offset
        for name, offset in (("OUTPUT0", 0), ("OUTPUT1", 64)):
            output = message.outputs.add(name=name)
            output.parameters["shared_memory_region"].string_param = "g_out"
            output.parameters["shared_memory_byte_size"].int64_param = 64
            output.parameters["shared_memory_offset"].int64_param = offset
        raw = message.SerializeToString()
        answer = _call(through, "ModelInfer", raw)
        # Byte for byte, the outputs' parameter maps included (written in key order).
        assert answer == _call(own, "ModelInfer", raw)
        added = shm.get_contents_as_numpy(outputs, np.int32, [1, 16], 0)
        subtracted = shm.get_contents_as_numpy(outputs, np.int32, [1, 16], 64)
        assert added.tolist() == (first * 4).tolist()
        assert subtracted.tolist() == (first - first * 3).tolist()
        status = pb.SystemSharedMemoryStatusResponse.FromString(
            _call(through, "SystemSharedMemoryStatus", b"")
        )
        assert set(status.regions) == {"g_in", "g_out"}
    finally:
        for channel in channels:
            _call(channel, "SystemSharedMemoryUnregister", b"")
        shm.destroy_shared_memory_region(inputs)
        shm.destroy_shared_memory_region(outputs)


def test_keys_and_tenants_hold_through_the_front_end() -> None:
    acme, small, admin = "acme-key-0123456789", "small-key-0123456789", "admin-key-0123456789"
    config = RuntimeConfig.model_validate(
        {
            "server": {"frontends": 2},
            "tenants": [
                {"name": "acme", "keys": [hash_key(acme)]},
                {"name": "small", "keys": [hash_key(small)], "rate": "1/s", "burst": 1},
            ],
            "auth": {"required": True, "admin_keys": [hash_key(admin)]},
        }
    )
    simple = [s for s in builtin_sources() if s.name == "simple"]
    message = pb.ModelInferRequest(model_name="simple", id="k")
    for name in ("INPUT0", "INPUT1"):
        message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        message.raw_input_contents.append(np.ones((1, 16), np.int32).tobytes())
    infer = message.SerializeToString()
    index = pb.RepositoryIndexRequest().SerializeToString()
    metadata = pb.ModelMetadataRequest(name="simple").SerializeToString()
    alone = config.model_copy(update={"server": config.server.model_copy(update={"frontends": 1})})
    with (
        serve_in_thread(config, thread_isolated(simple)) as server,
        serve_in_thread(alone, thread_isolated(simple)) as reference,
    ):
        through, own = _open(server), _open(reference)
        try:
            for key in (None, "wrong-key-0123456789", acme, admin):
                sent = () if key is None else (("authorization", f"Bearer {key}"),)
                for method, raw in (("ModelInfer", infer), ("ModelMetadata", metadata),
                                    ("RepositoryIndex", index)):  # fmt: skip
                    answers = []
                    for channel in (through, own):
                        try:
                            answers.append(("ok", _call(channel, method, raw, metadata=sent)))
                        except grpc.RpcError as exc:
                            answers.append((exc.code(), exc.details()))
                    assert answers[0] == answers[1], (key, method)
            # The small tenant's rate holds in the engine whichever process took the call.
            codes, retry = [], []
            for _ in range(4):
                try:
                    _call(
                        through,
                        "ModelInfer",
                        infer,
                        metadata=(("authorization", f"Bearer {small}"),),
                    )
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as exc:
                    codes.append(exc.code())
                    retry += [v for k, v in exc.trailing_metadata() or () if k == "retry-after"]
            assert codes[0] == grpc.StatusCode.OK
            assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes and retry
        finally:
            through.close()
            own.close()
