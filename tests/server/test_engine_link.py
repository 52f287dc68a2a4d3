"""The engine link's frames, and a front end whose engine is gone (real Unix sockets)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, cast

import grpc
import numpy as np
import pytest
from pydantic import ValidationError

from sordino.config import RuntimeConfig
from sordino.config.server import ServerConfig
from sordino.inference import InferResponse
from sordino.protocol.pb import kserve_v2_pb2 as pb
from sordino.server import link_frames, link_tensors
from sordino.server.fast_infer import decode_body
from sordino.server.frontend_link import ENGINE_GONE, FrontendLink
from sordino.server.frontends import default_frontends, frontend_count
from sordino.server.grpc_link import GrpcCalls, StreamContext
from sordino.server.link_frames import FrameError, FrameReader, LinkRequest
from sordino.server.link_tensors import STREAM_WINDOW


def _request(**changes: object) -> LinkRequest:
    fields: dict[str, object] = {
        "id": 7,
        "received_at": 1234.5,
        "model": "digits-classifier",
        "version": "2",
        "path": "/v2/models/digits-classifier/versions/2/infer",
        "client": "127.0.0.1",
        "headers": [(b"x-sordino-priority", b"1"), (b"content-length", b"3")],
        "body": b"abc",
    }
    fields.update(changes)
    return LinkRequest(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "request_",
    [_request(), _request(version=None, client=None, headers=[], body=b"")],
    ids=["every-field", "nothing-optional"],
)
def test_a_request_crosses_the_link_whole(request_: LinkRequest) -> None:
    frame = b"".join(link_frames.encode_request(request_))
    ((kind, body),) = FrameReader().feed(frame)
    assert kind == link_frames.REQUEST
    assert link_frames.decode_request(body) == request_


def test_frames_split_and_joined_across_reads_come_out_whole() -> None:
    answers = [
        link_frames.Answer(i, 200 + i, b"x" * i, {"Content-Type": "application/json"})
        for i in range(5)
    ]
    wire = b"".join(
        b"".join(link_frames.encode_answer(a.id, a.status, a.payload, a.headers)) for a in answers
    )
    wire += link_frames.encode_cancel(9)
    reader = FrameReader()
    frames = []
    for at in range(0, len(wire), 7):  # reads that cut frames anywhere
        frames += reader.feed(wire[at : at + 7])
    assert [link_frames.decode_answer(body) for _, body in frames[:5]] == answers
    assert frames[5] == (link_frames.CANCEL, wire[-8:])
    assert link_frames.decode_id(frames[5][1]) == 9


def test_a_decoded_request_and_its_response_cross_the_link_whole() -> None:
    header = json.dumps(
        {
            "id": "r",
            "parameters": {"priority": 1, "binary_data_output": True},
            "inputs": [
                {"name": "a", "shape": [2, 2], "datatype": "FP16", "data": [1, 2, 3, 4]},
                {"name": "b", "shape": [1, 2], "datatype": "BYTES", "data": ["x", "yz"]},
                {
                    "name": "c",
                    "shape": [3],
                    "datatype": "BOOL",
                    "parameters": {"binary_data_size": 3},
                },
            ],
            "outputs": [{"name": "o", "parameters": {"binary_data": False}}],
        }
    ).encode()
    request = decode_body(
        header + b"\x01\x00\x01",
        "m",
        "1",
        str(len(header)).encode(),
        {"x-sordino-tag": "t"},
        client="10.0.0.1",
        received_at=5.5,
    )
    frame = b"".join(link_tensors.encode_infer(3, request, 0.25)[0])
    ((kind, body),) = FrameReader().feed(frame)
    assert kind == link_tensors.INFER
    decoded = link_tensors.decode_infer(body)
    assert (decoded.id, decoded.read_s, decoded.size) == (3, 0.25, len(body))
    again = decoded.request
    for name, array in request.inputs.items():
        assert again.inputs[name].dtype == array.dtype
        assert again.inputs[name].tolist() == array.tolist()
    assert again.inputs["a"].base is not None  # a view of the frame, not a copy
    again.inputs = request.inputs
    assert again == request

    response = InferResponse(
        "m",
        "1",
        {"o": np.arange(4, dtype=np.int64).reshape(2, 2), "s": np.array([b"p", "q"], dtype=object)},
        {"o": "INT64", "s": "BYTES"},
        id="r",
        parameters={"k": 1},
    )
    frame = b"".join(link_tensors.encode_result(4, response, True))
    ((kind, body),) = FrameReader().feed(frame)
    ident, back, close, held = link_tensors.decode_result(body)
    assert not held
    assert (ident, close, back.model, back.id, back.parameters) == (4, True, "m", "r", {"k": 1})
    assert back.outputs["o"].tolist() == [[0, 1], [2, 3]]
    assert back.outputs["s"].tolist() == [b"p", b"q"]
    with pytest.raises(FrameError):
        link_tensors.decode_infer(body)  # a result is no request


def test_a_broken_frame_is_an_error_not_a_crash() -> None:
    with pytest.raises(FrameError):
        link_frames.decode_request(b"\x01\x02")
    with pytest.raises(FrameError):
        link_frames.decode_answer(b"\x01")
    with pytest.raises(FrameError):
        link_tensors.decode_stream_credit(b"\x01")


def test_a_stream_credit_crosses_the_link_whole() -> None:
    frame = link_tensors.encode_stream_credit(9, 3)
    ((kind, body),) = list(FrameReader().feed(frame))
    assert kind == link_tensors.STREAM_CREDIT
    assert link_tensors.decode_stream_credit(body) == (9, 3)


async def test_the_messages_read_with_a_stream_s_open_reach_it() -> None:
    written: list[bytes] = []
    calls = GrpcCalls(cast(Any, None), None, {}, written.extend)
    opening = link_tensors.Call(1, "ModelStreamInfer", "ipv4:127.0.0.1:5", [], b"")
    frames = b"".join(
        [
            *link_tensors.encode_call(opening, link_tensors.STREAM_OPEN),
            *link_tensors.encode_stream_message(1, b"first"),
            link_tensors.encode_stream_end(1),
        ]
    )
    for kind, body in FrameReader().feed(frames):  # one read: no task has run yet
        calls.received(kind, body)
    inbox = calls.streams[1].inbox
    assert inbox.get_nowait() == b"first"
    for _ in range(10):
        await asyncio.sleep(0)
    ((kind, body),) = list(FrameReader().feed(b"".join(written)))
    assert link_frames.decode_answer(body).status == grpc.StatusCode.UNIMPLEMENTED.value[0]
    assert calls.streams == {}


async def test_a_forwarded_stream_sends_no_further_ahead_than_its_credit() -> None:
    sent: list[bytes] = []
    context = StreamContext("ipv4:127.0.0.1:5", [], sent.append)
    response = pb.ModelStreamInferResponse(error_message="x")

    async def produce() -> None:
        for _ in range(STREAM_WINDOW + 3):
            await context.write(response)

    producing = asyncio.get_running_loop().create_task(produce())
    for _ in range(10):  # the window goes at once; without credit nothing more does
        await asyncio.sleep(0)
    assert len(sent) == context.sent == STREAM_WINDOW and context.starved
    assert not producing.done()
    context.grant(1)
    for _ in range(10):
        await asyncio.sleep(0)
    assert len(sent) == STREAM_WINDOW + 1 and context.starved
    context.grant(2)
    await asyncio.wait_for(producing, 10)
    assert len(sent) == STREAM_WINDOW + 3 and context.starved
    waiting = asyncio.get_running_loop().create_task(context.write(response))
    await asyncio.sleep(0)
    waiting.cancel()  # the front end's client left while the engine waited for credit
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert len(sent) == STREAM_WINDOW + 3


async def test_a_front_end_whose_engine_is_gone_answers_503_at_once(tmp_path: Path) -> None:
    accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(writer)

    path = str(tmp_path / "link")
    server = await asyncio.start_unix_server(engine, path)
    link = await FrontendLink.open(path)
    waiting = link.call(_request())
    writer = await accepted.get()
    writer.close()  # the engine ends with a request outstanding
    server.close()
    answer = await asyncio.wait_for(waiting, 10)
    assert answer.status == 503 and json.loads(answer.payload) == {"error": ENGINE_GONE}
    assert answer.headers["Connection"] == "close"
    await asyncio.wait_for(link.closed.wait(), 10)
    later = await asyncio.wait_for(link.call(_request()), 1)
    assert later.status == 503


class _Writes(link_frames.BatchedWrites):
    """The link's batched writes over a real transport, keeping what reached it."""

    def __init__(self, transport: Any) -> None:
        self.real, self.out, self.parts = transport, [], []
        self.transport = cast(asyncio.Transport, self)

    def is_closing(self) -> bool:
        return bool(self.real.is_closing())

    def writelines(self, parts: list[bytes]) -> None:
        self.parts += parts
        self.real.writelines(parts)


async def test_a_frame_with_an_empty_part_is_written_whole_and_the_link_still_ends(
    tmp_path: Path,
) -> None:
    """A request without a body encodes an empty part. asyncio's own transport keeps an
    empty part of ``writelines`` in its buffer for ever on Python 3.12 and 3.13: the
    link then never shut its writing down (an engine ending a link left the front end
    waiting for the end) and polled to write on every turn of the loop."""
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def reader_end(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await received.put(await reader.read())  # everything, up to the end
        writer.close()

    path = str(tmp_path / "link")
    server = await asyncio.start_unix_server(reader_end, path)
    transport, _ = await asyncio.get_running_loop().create_unix_connection(asyncio.Protocol, path)
    writes = _Writes(transport)
    parts = link_frames.encode_request(_request(body=b""))
    assert b"" in parts  # what this test is about
    writes._write(parts)
    await asyncio.sleep(0)  # the turn's writes go out at its end
    assert writes.parts and all(writes.parts)  # whatever the Python: no empty part
    cast(asyncio.WriteTransport, transport).write_eof()
    assert await asyncio.wait_for(received.get(), 10) == b"".join(parts)
    transport.close()
    server.close()


@pytest.mark.parametrize("value", [0, -1, "two"])
def test_a_bad_frontends_value_is_a_clear_error(value: object) -> None:
    with pytest.raises(ValidationError, match="frontends"):
        RuntimeConfig.model_validate({"server": {"frontends": value}})


def test_several_front_ends_with_tls_are_not_supported(tmp_path: Path) -> None:
    tls = {"cert": str(tmp_path / "c.pem"), "key": str(tmp_path / "k.pem")}
    with pytest.raises(ValidationError, match="not supported"):
        RuntimeConfig.model_validate({"server": {"frontends": 2, "tls": tls}})
    RuntimeConfig.model_validate({"server": {"frontends": 1, "tls": tls}})


def test_the_default_is_one_front_end_on_small_machines() -> None:
    assert [default_frontends(cores) for cores in (None, 1, 2, 4)] == [1, 1, 1, 1]
    assert [default_frontends(cores) for cores in (8, 12, 16, 64)] == [2, 3, 4, 4]


def test_one_front_end_is_one_process() -> None:
    assert frontend_count(ServerConfig(frontends=1)) == 1
    assert frontend_count(ServerConfig()) == default_frontends(os.cpu_count())


def test_the_default_is_one_where_more_cannot_work(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Left unset, the count never asks for what start-up would refuse: more than one
    front end with TLS, or off Linux (on a machine with many cores)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert frontend_count(ServerConfig()) == 4
    tls = {"cert": str(tmp_path / "c.pem"), "key": str(tmp_path / "k.pem")}
    assert frontend_count(ServerConfig.model_validate({"tls": tls})) == 1
    monkeypatch.setattr(sys, "platform", "darwin")
    assert frontend_count(ServerConfig()) == 1
