"""The one load generator of ``bench_triton``: lean closed loops over HTTP/1.1 and gRPC.

Both send prebuilt request bytes and keep the raw answers; nothing is parsed or checked
while the clock runs (:func:`check` does it afterwards), so the generator's own CPU per
request stays small and is measured (``Cell.client_cpu_ms``).

- HTTP: ``concurrency`` keep-alive connections (``asyncio`` protocols, as the client of
  ``bench_overload``), one request in flight on each; a response is framed by its
  ``Content-Length`` only (every server here sends one).
- gRPC: one ``grpc.aio`` channel, ``concurrency`` callers of ``ModelInfer`` with
  pre-serialized ``ModelInferRequest`` bytes (no (de)serializer on the call).

perf_analyzer (C++) would be leaner, but the one that installs (tritonclient 2.41's
wheel) cannot drive Mosec nor hand back the answers to check; see docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import numpy as np
import orjson


@dataclass
class Answers:
    """What one closed loop got back: per request its input row, status and raw body."""

    rows: list[int] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0


def kserve_http_request(
    host: str, model: str, name: str, row: np.ndarray, shape: list[int] | None = None
) -> bytes:
    """A KServe v2 binary-tensor request (binary output asked for) as raw HTTP/1.1 bytes;
    ``shape``: the input's (``[1, row.size]`` when not given)."""
    header = orjson.dumps(
        {"inputs": [{"name": name, "shape": shape or [1, row.size], "datatype": "FP32",
                     "parameters": {"binary_data_size": row.nbytes}}],
         "parameters": {"binary_data_output": True}}
    )  # fmt: skip
    body = header + np.ascontiguousarray(row, dtype=np.float32).tobytes()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def raw_http_request(host: str, path: str, row: np.ndarray) -> bytes:
    """Raw float32 bytes POSTed to ``path`` (the Mosec server's protocol)."""
    body = np.ascontiguousarray(row, dtype=np.float32).tobytes()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def kserve_grpc_request(
    model: str, name: str, row: np.ndarray, shape: list[int] | None = None
) -> bytes:
    """A serialized ``ModelInferRequest`` with the row in ``raw_input_contents``;
    ``shape``: the input's (``[1, row.size]`` when not given)."""
    from sordino.protocol.pb import kserve_v2_pb2 as pb

    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = name, "FP32"
    tensor.shape.extend(shape or [1, row.size])
    request.raw_input_contents.append(np.ascontiguousarray(row, dtype=np.float32).tobytes())
    return bytes(request.SerializeToString())


class _Connection(asyncio.Protocol):
    """One keep-alive connection with one request in flight."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.buffer = bytearray()
        self.done: asyncio.Future[tuple[int, bytes]] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def send(self, data: bytes) -> asyncio.Future[tuple[int, bytes]]:
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.done

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end])
        # The line start matters: Inference-Header-Content-Length ends the same way.
        at = head.lower().find(b"\r\ncontent-length:")
        if at < 0:
            self._finish(-1, head)  # no length: the caller reports it
            return
        length = int(head[at + 17 :].split(b"\r\n", 1)[0])
        if len(self.buffer) < end + 4 + length:
            return
        # Keep the head too: the KServe binary answer's header length is in it.
        response = bytes(self.buffer[: end + 4 + length])
        del self.buffer[: end + 4 + length]
        self._finish(int(head[9:12]), response)

    def _finish(self, status: int, response: bytes) -> None:
        done, self.done = self.done, None
        if done is not None and not done.done():
            done.set_result((status, response))

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(0, b"")


async def http_closed_loop(
    url: str, requests: list[bytes], concurrency: int, seconds: float
) -> Answers:
    """``concurrency`` connections each sending request after request for ``seconds``."""
    parsed = urlparse(url)
    loop = asyncio.get_running_loop()
    connections = [
        (await loop.create_connection(_Connection, parsed.hostname, parsed.port))[1]
        for _ in range(concurrency)
    ]
    answers = Answers()
    count = len(requests)
    started = time.perf_counter()
    stop = started + seconds

    async def client(conn: _Connection, first: int) -> None:
        i = first
        while time.perf_counter() < stop:
            row = i % count
            sent = time.perf_counter()
            status, body = await conn.send(requests[row])
            answers.latencies.append(time.perf_counter() - sent)
            answers.rows.append(row)
            answers.statuses.append(status)
            answers.bodies.append(body)
            if status <= 0:
                return
            i += concurrency

    try:
        await asyncio.gather(*(client(c, k) for k, c in enumerate(connections)))
        answers.seconds = time.perf_counter() - started
    finally:
        for conn in connections:
            conn.transport.close()
    return answers


async def grpc_closed_loop(
    address: str, requests: list[bytes], concurrency: int, seconds: float
) -> Answers:
    """``concurrency`` callers of ``ModelInfer`` on one channel for ``seconds``."""
    import grpc

    async with grpc.aio.insecure_channel(address) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        return await grpc_callers([infer], requests, concurrency, seconds)


async def grpc_callers(
    calls: list[Any], requests: list[bytes], concurrency: int, seconds: float
) -> Answers:
    """``concurrency`` callers for ``seconds``, caller ``k`` on ``calls[k % len(calls)]`` (each
    a ``ModelInfer`` multi-callable), sending ``requests`` round robin. Every call is made once
    first, so its channel is connected before the clock starts; a failed call is answered
    with status 500 and the error's details as its body."""
    import grpc

    answers = Answers()
    count = len(requests)
    for infer in calls:
        await infer(requests[0])
    started = time.perf_counter()
    stop = started + seconds

    async def client(first: int) -> None:
        infer = calls[first % len(calls)]
        i = first
        while time.perf_counter() < stop:
            row = i % count
            sent = time.perf_counter()
            try:
                body, status = await infer(requests[row]), 200
            except grpc.aio.AioRpcError as error:
                body, status = str(error.details()).encode(), 500
            answers.latencies.append(time.perf_counter() - sent)
            answers.rows.append(row)
            answers.statuses.append(status)
            answers.bodies.append(body)
            i += concurrency

    await asyncio.gather(*(client(k) for k in range(concurrency)))
    answers.seconds = time.perf_counter() - started
    return answers


def kserve_http_output(response: bytes) -> np.ndarray:
    """The first output of a binary KServe v2 HTTP answer (head included) as FP32."""
    end = response.find(b"\r\n\r\n")
    head = response[:end].lower()
    at = head.find(b"inference-header-content-length:")
    if at < 0:
        raise ValueError(f"not a binary KServe answer: {response[:200]!r}")
    length = int(head[at + 32 :].split(b"\r\n", 1)[0])
    return np.frombuffer(response[end + 4 + length :], dtype=np.float32)


def raw_http_output(response: bytes) -> np.ndarray:
    return np.frombuffer(response[response.find(b"\r\n\r\n") + 4 :], dtype=np.float32)


def kserve_grpc_output(body: bytes) -> np.ndarray:
    from sordino.protocol.pb import kserve_v2_pb2 as pb

    return np.frombuffer(pb.ModelInferResponse.FromString(body).raw_output_contents[0], np.float32)


def check(
    answers: Answers, expected: np.ndarray, decode: Callable[[bytes], np.ndarray]
) -> tuple[int, float, str | None]:
    """(failed answers, max abs difference to ``expected`` over the good ones, first error)."""
    failed, worst, first = 0, 0.0, None
    for row, status, body in zip(answers.rows, answers.statuses, answers.bodies, strict=True):
        if status != 200:
            failed += 1
            first = first or f"status {status}: {body[-200:]!r}"
            continue
        got = decode(body)
        if got.shape != expected[row].shape:
            failed += 1
            first = first or f"answer of shape {got.shape}, expected {expected[row].shape}"
            continue
        worst = max(worst, float(np.max(np.abs(got - expected[row]))))
    return failed, worst, first
