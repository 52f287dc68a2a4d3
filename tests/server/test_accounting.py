"""Every request that reaches the server is counted once, refused or not, in both families.

A mix of good and bad requests over HTTP and gRPC — bad JSON, an unknown model, a
wrong shape, a body over the limit, a client gone mid-body, a server fault, a
message that is not protobuf, a bad request on a stream — and then
``sordino_requests_total`` and ``sordino_tenant_requests_total`` each equal the
client's tally, outcome by outcome.
"""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

import sordino.server.fast_infer
import sordino.server.grpc
from sordino.config import RuntimeConfig
from sordino.models.repository import builtin_sources
from sordino.protocol.pb import kserve_v2_pb2 as pb
from sordino.testing import RunningServer, serve_in_thread
from tests.conftest import thread_isolated
from tests.waiting import wait_for

MODEL = "digits-classifier"
INFER = f"/v2/models/{MODEL}/infer"
GOOD = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}
BAD_SHAPE = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 3], "data": [1.0] * 3}]}
FAULT = "fault-injected-by-the-test"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningServer]:
    """A server whose decoders raise a plain exception (a defect) for requests tagged FAULT."""
    for module in (sordino.server.fast_infer, sordino.server.grpc):
        monkeypatch.setattr(module, "decode_infer_request", _faulty(module.decode_infer_request))
    config = RuntimeConfig.model_validate({"server": {"max_request_size": "16KB"}})
    sources = thread_isolated([s for s in builtin_sources() if s.name == MODEL])
    with serve_in_thread(config, sources) as running:
        yield running


def _faulty(decode: Any) -> Any:
    def decode_or_fail(*args: Any, **kwargs: Any) -> Any:
        request = decode(*args, **kwargs)
        if request.id == FAULT:
            raise RuntimeError("a defect in decoding")
        return request

    return decode_or_fail


def _http(server: RunningServer, tally: Counter[str]) -> None:
    cases: list[tuple[str, bytes, int, str]] = [
        (INFER, orjson.dumps(GOOD), 200, "success"),
        (INFER, orjson.dumps(GOOD), 200, "success"),
        (INFER, b'{"inputs": [', 400, "rejected"),
        ("/v2/models/no-such-model/infer", orjson.dumps(GOOD), 404, "rejected"),
        (INFER, orjson.dumps(BAD_SHAPE), 400, "rejected"),
        (INFER, orjson.dumps(GOOD | {"pad": "x" * 20000}), 413, "rejected"),
        (INFER, orjson.dumps(GOOD | {"id": FAULT}), 500, "rejected"),
    ]
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for path, body, status, outcome in cases:
            response = client.post(path, content=body, headers={"x-sordino-tenant": "acme"})
            assert response.status_code == status, response.text
            assert "error" in response.json() or status == 200
            tally[outcome] += 1
    # A client that leaves halfway through its body.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            f"POST {INFER} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            'Content-Length: 1000\r\n\r\n{"inputs": ['.encode()
        )
    tally["rejected"] += 1


def _grpc(server: RunningServer, tally: Counter[str]) -> None:
    def request(model: str = MODEL, width: int = 64, id: str = "") -> bytes:
        message = pb.ModelInferRequest(model_name=model, id=id)
        tensor = message.inputs.add(name="pixels", datatype="FP32", shape=[1, width])
        tensor.contents.fp32_contents.extend([1.0] * width)
        data: bytes = message.SerializeToString()
        return data

    cases: list[tuple[bytes, grpc.StatusCode, str]] = [
        (request(), grpc.StatusCode.OK, "success"),
        (b"\xff\xff not protobuf", grpc.StatusCode.INVALID_ARGUMENT, "rejected"),
        (request(model="no-such-model"), grpc.StatusCode.NOT_FOUND, "rejected"),
        (request(width=3), grpc.StatusCode.INVALID_ARGUMENT, "rejected"),
        (request(id=FAULT), grpc.StatusCode.INTERNAL, "rejected"),
    ]
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for raw, code, outcome in cases:
            try:
                infer(raw, timeout=30)
                got = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                got = exc.code()
            assert got == code
            tally[outcome] += 1
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        answers = list(stream(iter([request(), request(width=3)]), timeout=30))
        errors = [pb.ModelStreamInferResponse.FromString(a).error_message for a in answers]
        assert sorted(bool(e) for e in errors) == [False, True]
        tally["success"] += 1
        tally["rejected"] += 1


def _by_outcome(server: RunningServer, family: str) -> Counter[str]:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    counts: Counter[str] = Counter()
    for metric in text_string_to_metric_families(text):
        if metric.name == family:
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["outcome"]] += int(sample.value)
    return counts


def test_every_request_is_counted_once_in_both_families(server: RunningServer) -> None:
    """The counters equal the client's tally, per outcome, in both families."""
    tally: Counter[str] = Counter()
    _http(server, tally)
    _grpc(server, tally)
    wait_for(
        lambda: _by_outcome(server, "sordino_requests") == tally,
        f"sordino_requests_total to reach the tally {dict(tally)}",
        10,
    )
    assert _by_outcome(server, "sordino_tenant_requests") == tally
