"""Outputs that cross the engine link as arena descriptors, and the bytes they fall back to.

The frames alone (a real arena, mapped read-only as a front end maps it), then a real
server with ``server.frontends: 2`` and worker processes (outputs in the arena): the
answers through the front end, the holds released by ``RELEASE``, by a link that drops,
and kept while the engine closes a link whose front end may still read them.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sordino.config import ModelConfig, RuntimeConfig
from sordino.inference import InferResponse
from sordino.memory import Arena, TensorRef, Tensors, TensorsBuilder
from sordino.memory.grant import Grant, GrantSpace
from sordino.memory.peer_view import ArenaView
from sordino.models.repository import sources_for
from sordino.server import link_arena, link_tensors
from sordino.server.fast_infer import decode_body
from sordino.server.link_frames import FrameError, FrameReader, frame_head
from sordino.testing import RunningServer, serve_in_thread
from tests.models import identity_model
from tests.server.frontend_helpers import any_connection
from tests.waiting import wait_for

WIDE = 8192  # FP32 columns: 32 KiB a row, above INLINE_MAX
NARROW = 3


def _frame(parts: list[object]) -> bytes:
    frame = b"".join(parts)  # type: ignore[arg-type]
    ((kind, body),) = FrameReader().feed(frame)
    assert kind == link_tensors.RESULT
    return body


def _placed(arena: Arena, **arrays: np.ndarray) -> Tensors:
    builder = TensorsBuilder(arena)
    for name, array in arrays.items():
        builder.put(name, array)
    return builder.finish()


def test_an_arena_output_crosses_as_a_descriptor_and_is_read_in_place() -> None:
    arena = Arena(1 << 20)
    try:
        wide = np.arange(2 * WIDE, dtype=np.float32).reshape(2, WIDE)
        outputs = _placed(arena, wide=wide, narrow=np.ones((2, NARROW), np.float32))
        response = InferResponse("m", "1", outputs, {"wide": "FP32", "narrow": "FP32"}, id="r")
        parts, held = link_tensors.encode_result_held(4, response, False, arena)
        body = _frame(parts)
        assert held
        assert len(body) < wide.nbytes  # the wide output is not in the frame
        ident, back, close, is_held = link_tensors.decode_result(body, ArenaView())
        assert (ident, close, is_held, back.id) == (4, False, True, "r")
        np.testing.assert_array_equal(back.outputs["wide"], wide)
        assert not back.outputs["wide"].flags.writeable  # mapped read-only
        np.testing.assert_array_equal(back.outputs["narrow"], np.ones((2, NARROW)))
        with pytest.raises(FrameError):
            link_tensors.decode_result(body)  # an end with no view of the arena
        # Held, the block is pinned: no resize, and defragmentation leaves it in place.
        offset = outputs.ref("wide").offset
        assert not arena.quiet()
        assert arena.resize(2 << 20) is None
        arena.defragment()
        assert outputs.ref("wide").offset == offset
        np.testing.assert_array_equal(back.outputs["wide"], wide)
        response.release()
        assert arena.statistics().in_use_bytes == 0
    finally:
        arena.close()


def _at(arena: Arena, array: np.ndarray, view: str = "") -> Tensors:
    """``array`` written into a block of ``arena``, seen as ``view`` asks."""
    block = arena.acquire_nowait(array.nbytes)
    placed = np.ndarray(array.shape, array.dtype, arena.buffer, block.offset)
    placed[...] = array
    if view == "strided":
        placed = placed[:, ::2]
    return Tensors({"y": TensorRef(placed, block.offset)})


FALLBACKS = ["heap", "strings", "small", "strided", "big-endian", "other segment", "no arena"]


@pytest.mark.parametrize("case", FALLBACKS)
def test_what_cannot_go_by_descriptor_goes_as_bytes(case: str) -> None:
    arena, other = Arena(1 << 20), Arena(1 << 20)
    try:
        wide = np.arange(4 * WIDE, dtype=np.float32).reshape(4, WIDE)
        datatype = "FP32"
        outputs: dict[str, np.ndarray] | Tensors
        if case == "heap":
            outputs = {"y": wide}
        elif case == "strings":
            outputs, datatype = {"y": np.array([b"x" * 2000] * 2, dtype=object)}, "BYTES"
        elif case == "small":
            outputs = _at(arena, wide[:1, : link_arena.INLINE_MAX // 4])
        elif case == "big-endian":
            outputs = _at(arena, wide.astype(">f4"))
        elif case == "other segment":
            outputs = _at(other, wide)
        else:
            outputs = _at(arena, wide, case)
        response = InferResponse("m", "1", outputs, {"y": datatype})
        where = None if case == "no arena" else arena
        parts, held = link_tensors.encode_result_held(1, response, False, where)
        _, back, _, is_held = link_tensors.decode_result(_frame(parts))
        assert (held, is_held) == (False, False)
        assert back.outputs["y"].tolist() == np.asarray(outputs["y"]).tolist()
    finally:
        arena.close()
        other.close()


def test_a_release_frame_carries_every_id() -> None:
    frame = link_arena.encode_ids(link_arena.RELEASE, [3, 1 << 40, 7])
    ((kind, body),) = FrameReader().feed(frame)
    assert kind == link_arena.RELEASE
    assert link_arena.decode_ids(body) == (3, 1 << 40, 7)
    with pytest.raises(FrameError):
        link_arena.decode_ids(b"\x01\x02")


def _sources(root: Path) -> list[Any]:
    """Worker processes (outputs in the arena): a wide, a narrow and a strings model."""
    sources = []
    for name, datatype, width in (
        ("wide", "FP32", WIDE),
        ("narrow", "FP32", NARROW),
        ("words", "BYTES", NARROW),
    ):
        path = identity_model(root / f"{name}.onnx", datatype, width)
        sources += sources_for(ModelConfig(name=name, path=path, max_batch_size=8))
    return sources


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("descriptors")


@pytest.fixture(scope="module")
def server(models: Path) -> Iterator[RunningServer]:
    """Two front-end processes: every client connection lands on one of them."""
    config = RuntimeConfig.model_validate({"server": {"frontends": 2, "shutdown_timeout": 10}})
    with serve_in_thread(config, _sources(models)) as running:
        yield running


@pytest.fixture(scope="module")
def reference(models: Path) -> Iterator[RunningServer]:
    """One process reading its own connections: what the engine answers without front ends."""
    config = RuntimeConfig.model_validate({"server": {"frontends": 1}})
    with serve_in_thread(config, _sources(models)) as running:
        yield running


def _on_loop(server: RunningServer, call: object) -> object:
    async def run() -> object:
        return call()  # type: ignore[operator]

    return asyncio.run_coroutine_threadsafe(run(), server.loop).result(10)


def _in_use(server: RunningServer) -> int:
    """Arena bytes in use, less the front ends' grants (held for as long as they live)."""
    assert server.frontends is not None
    link = server.frontends.link

    def read() -> int:
        stats = server.runtime.memory.owner.statistics()
        grants = sum(c.grant.block.size for c in link.connections if c.grant is not None)
        return 0 if stats is None else stats.in_use_bytes - grants

    return int(_on_loop(server, read))  # type: ignore[call-overload]


def _held(server: RunningServer) -> int:
    assert server.frontends is not None
    link = server.frontends.link
    return int(_on_loop(server, lambda: sum(len(c.held) for c in link.connections)))  # type: ignore[call-overload]


def _lent(server: RunningServer) -> int:
    """Ranges of the front ends' grants lent to requests now."""
    assert server.frontends is not None
    link = server.frontends.link
    grants = [c.grant for c in link.connections if c.grant is not None]
    return int(_on_loop(server, lambda: sum(g.lent for g in grants)))  # type: ignore[call-overload]


def _body(model: str, rows: int, binary: bool) -> tuple[bytes, dict[str, str], np.ndarray]:
    width = WIDE if model == "wide" else NARROW
    data = np.arange(rows * width, dtype=np.float32).reshape(rows, width) / 7
    header = json.dumps(
        {
            "inputs": [{"name": "x", "shape": [rows, width], "datatype": "FP32",
                        "data": data.ravel().tolist()}],
            "outputs": [{"name": "y", "parameters": {"binary_data": binary}}],
        }
    ).encode()  # fmt: skip
    return header, {"Content-Type": "application/json"}, data


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("model", ["wide", "narrow"])
def test_answers_through_a_front_end_equal_the_engines_own_and_no_hold_stays(
    server: RunningServer,
    reference: RunningServer,
    model: str,
    binary: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    encode = link_tensors.encode_result_held
    sent: list[bool] = []

    def counted(*args: Any) -> tuple[list[Any], bool]:
        parts, held = encode(*args)
        sent.append(held)
        return parts, held

    monkeypatch.setattr(link_tensors, "encode_result_held", counted)
    answers = []
    for running in (server, reference):
        connection = any_connection(running)
        for rows in (1, 3):
            body, headers, _ = _body(model, rows, binary)
            connection.request("POST", f"/v2/models/{model}/infer", body, headers)
            response = connection.getresponse()
            answers.append((rows, response.status, response.read()))
        connection.close()
    assert answers[:2] == answers[2:]
    assert {status for _, status, _ in answers} == {200}
    assert sent == [model == "wide"] * 2  # through a front end: wide ones by descriptor
    wait_for(lambda: _held(server) == 0, "every hold released", timeout=10)
    wait_for(lambda: _in_use(server) == 0, "the arena empty", timeout=10)


def test_strings_go_as_bytes_through_the_front_end(server: RunningServer) -> None:
    connection = any_connection(server)
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "BYTES", "data": ["a", "", "é"]}]}
    ).encode()
    connection.request("POST", "/v2/models/words/infer", body)
    response = connection.getresponse()
    assert response.status == 200
    assert json.loads(response.read())["outputs"][0]["data"] == ["a", "", "é"]
    connection.close()


def _infer_frame(ident: int, rows: int) -> bytes:
    body = _body("wide", rows, True)[0]
    request = decode_body(body, "wide", None, None, {}, client=None, received_at=None)
    return b"".join(link_tensors.encode_infer(ident, request, 0.0)[0])


def _read_result(sock: socket.socket, reader: FrameReader) -> bytes:
    while True:
        data = sock.recv(1 << 20)
        assert data, "the engine closed the link"
        for kind, body in reader.feed(data):
            assert kind == link_tensors.RESULT
            return body


def _fake_front_end(server: RunningServer) -> socket.socket:
    """A raw link connection, as a front end makes one (no HELLO: not supervised)."""
    assert server.frontends is not None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(server.frontends.link.link_path)
    return sock


def test_a_link_that_drops_releases_what_it_held(server: RunningServer) -> None:
    wait_for(lambda: _in_use(server) == 0, "the arena empty", timeout=10)
    sock = _fake_front_end(server)
    reader = FrameReader()
    view = ArenaView()
    sock.sendall(_infer_frame(1, 2))
    ident, response, _, held = link_tensors.decode_result(_read_result(sock, reader), view)
    assert (ident, held) == (1, True)
    np.testing.assert_allclose(response.outputs["y"], _body("wide", 2, True)[2])
    assert _in_use(server) > 0  # held for this end until it says RELEASE
    sock.sendall(link_arena.encode_ids(link_arena.RELEASE, [1]))
    wait_for(lambda: _in_use(server) == 0, "the arena empty", timeout=10)
    sock.sendall(_infer_frame(2, 1))
    assert link_tensors.decode_result(_read_result(sock, reader), view)[3]
    assert _in_use(server) > 0
    sock.close()  # as a front end that dies: no RELEASE, the link ends
    wait_for(lambda: _in_use(server) == 0, "the arena empty", timeout=10)


def test_an_engine_that_ends_a_link_keeps_its_holds_until_the_front_end_closes(
    server: RunningServer,
) -> None:
    wait_for(lambda: _in_use(server) == 0, "the arena empty", timeout=10)
    sock = _fake_front_end(server)
    sock.sendall(_infer_frame(1, 1))
    assert link_tensors.decode_result(_read_result(sock, FrameReader()), ArenaView())[3]
    sock.sendall(frame_head(0, 99))  # a broken frame: the engine ends the link
    assert sock.recv(1) == b""  # its end is closed (EOF) ...
    assert _in_use(server) > 0  # ... but what this end may still read stays held
    sock.close()
    wait_for(lambda: _in_use(server) == 0, "the arena empty", timeout=10)


def _decoded_request(model: str, rows: int, words: bool = False) -> Any:
    body, _, _ = _body(model, rows, True)
    request = decode_body(body, model, None, None, {}, client=None, received_at=None)
    if words:
        request.inputs = {**request.inputs, "w": np.array([b"ab", b"c"], dtype=object)}
        request.input_datatypes["w"] = "BYTES"
    return request


def test_inputs_laid_into_a_grant_are_read_in_place_and_freed_back() -> None:
    arena = Arena(1 << 22)
    freed: list[int] = []
    try:
        grant = Grant(arena, 1 << 20, freed.append)
        space = GrantSpace(arena.name, grant.block.offset, grant.block.size)
        request = _decoded_request("wide", 3, words=True)
        parts, placed = link_tensors.encode_infer(5, request, 0.1, space=space)
        frame = b"".join(parts)
        assert len(placed) == 1 and len(frame) < request.inputs["x"].nbytes  # "w" inline
        ((_, body),) = FrameReader().feed(frame)
        decoded = link_tensors.decode_infer(body, grant)
        inputs = decoded.request.inputs
        assert isinstance(inputs, Tensors)
        assert inputs.ref("x").offset == placed[0]  # an arena tensor: staged by reference
        np.testing.assert_array_equal(inputs["x"], request.inputs["x"])
        assert inputs["w"].tolist() == [b"ab", b"c"]
        assert decoded.size >= request.inputs["x"].nbytes  # declared shapes still fit
        assert grant.lent == 1 and not arena.quiet()  # the grant is pinned
        decoded.request.release()
        assert freed == placed and grant.lent == 0
        space.free(freed[0])
        assert space.used == 0
        with pytest.raises(FrameError):
            link_tensors.decode_infer(body)  # descriptors to an engine that granted nothing
        with pytest.raises(FrameError):  # a range outside the grant
            link_tensors.decode_infer(body, Grant(arena, 1 << 16, freed.append))
    finally:
        arena.close()


def test_a_full_grant_sends_the_bytes_and_a_closed_one_waits_for_its_ranges() -> None:
    arena = Arena(1 << 22)
    try:
        grant = Grant(arena, 8 * WIDE * 4, lambda offset: None)
        space = GrantSpace(arena.name, grant.block.offset, grant.block.size)
        first = link_tensors.encode_infer(1, _decoded_request("wide", 6), 0.0, space=space)
        full = link_tensors.encode_infer(2, _decoded_request("wide", 6), 0.0, space=space)
        assert len(first[1]) == 1 and full[1] == []  # no room left: bytes
        ((_, body),) = FrameReader().feed(b"".join(first[0]))
        held = link_tensors.decode_infer(body, grant).request
        in_use = arena.statistics().in_use_bytes
        grant.close()  # the link ended while a request still runs
        assert arena.statistics().in_use_bytes == in_use
        held.release()
        assert arena.statistics().in_use_bytes == 0
    finally:
        arena.close()


def test_inputs_from_the_front_end_cross_in_its_grant(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    decode = link_tensors.decode_infer
    placed: list[bool] = []

    def counted(body: bytes, grant: Grant | None = None) -> link_tensors.Decoded:
        decoded = decode(body, grant)
        placed.append(isinstance(decoded.request.inputs, Tensors))
        return decoded

    monkeypatch.setattr(link_tensors, "decode_infer", counted)
    connection = any_connection(server)
    for model, rows in (("wide", 1), ("wide", 4), ("narrow", 2)):
        body, headers, _ = _body(model, rows, True)
        connection.request("POST", f"/v2/models/{model}/infer", body, headers)
        response = connection.getresponse()
        assert response.status == 200
        response.read()
    connection.close()
    assert placed == [True, True, False]  # the narrow one (24 bytes a row) as bytes
    assert server.frontends is not None
    link = server.frontends.link
    grants = [c.grant for c in link.connections if c.grant is not None]
    assert len(grants) == 2  # one a front-end process
    wait_for(lambda: _lent(server) == 0, "every range freed")


def test_granted_inputs_are_freed_when_the_service_swaps_the_inputs_mapping(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """System shared memory, sequence controls and step state make the request's inputs a
    new dict (the grant's lease is not in it): the engine frees the ranges all the same."""
    from sordino.server import fast_infer

    admit = fast_infer.admit

    def swapping(parts: Any, request: Any, tenant: str | None) -> bool:
        request.inputs = dict(request.inputs)  # as shm.attach does
        return admit(parts, request, tenant)

    monkeypatch.setattr(fast_infer, "admit", swapping)
    connection = any_connection(server)
    body, headers, _ = _body("wide", 2, True)
    connection.request("POST", "/v2/models/wide/infer", body, headers)
    response = connection.getresponse()
    assert response.status == 200
    response.read()
    connection.close()
    wait_for(lambda: _lent(server) == 0, "every range freed")


class _Transport:
    """What a FrontendLink writes, kept (a stand-in for its Unix socket's transport)."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def is_closing(self) -> bool:
        return False

    def writelines(self, parts: list[bytes]) -> None:
        self.written += parts

    def close(self) -> None:
        pass


async def test_a_held_result_nobody_waits_for_is_released_and_a_gone_link_is_not_read() -> None:
    from sordino.server.frontend_link import FrontendLink

    arena = Arena(1 << 20)
    try:
        outputs = _placed(arena, y=np.ones((1, WIDE), np.float32))
        response = InferResponse("m", "1", outputs, {"y": "FP32"})
        parts, held = link_tensors.encode_result_held(7, response, False, arena)
        assert held
        link = FrontendLink()
        transport = _Transport()
        link.connection_made(transport)  # type: ignore[arg-type]
        link.data_received(b"".join(parts))  # the client left: no future waits for id 7
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        ((kind, body),) = FrameReader().feed(b"".join(transport.written))
        assert (kind, link_arena.decode_ids(body)) == (link_arena.RELEASE, (7,))
        # A held result that arrived, and then the link ended: not to be read any more.
        link.held.add(8)
        assert link.readable(8) and link.readable(9)
        link.connection_lost(None)
        assert link.readable(9)  # nothing held under it
        link.held.add(8)
        assert not link.readable(8)
        response.release()
    finally:
        arena.close()
