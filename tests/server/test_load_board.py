"""The engine's load board: published by a real engine, read by a real second process.

The reader is ``tests/server/board_process.py`` run as its own process (one JSON
command a line). A backlog is made by holding a batch inside the digits model's
backend (``Gate``) with low-priority requests queued behind it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.synchronize
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from sordino.config import RuntimeConfig
from sordino.memory.segments import remove_stale_segments
from sordino.models.repository import builtin_sources
from sordino.records import QueueSettings
from sordino.server.board_shed import ENGINE_SILENT_S, BoardShed
from sordino.server.load_board import MAX_LEVELS, STALE_S, LoadBoard, RouteLoad
from sordino.server.load_publisher import LoadBoardPublisher
from sordino.server.loop_lag import LoopLag
from sordino.testing import RunningServer, serve_in_thread
from tests.conftest import thread_isolated
from tests.server.helpers import Gate
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
MODEL = "digits-classifier"
INFER = f"/v2/models/{MODEL}/infer"
GOOD = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}


def _spawn(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}")
    return subprocess.Popen(
        [sys.executable, "-m", "tests.server.board_process", *args],
        cwd=ROOT, env=env, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip


class Reader:
    """The board as a second process sees it."""

    def __init__(self, name: str) -> None:
        self.process = _spawn("reader", name)

    def ask(self, op: str, **fields: Any) -> Any:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(orjson.dumps({"op": op, **fields}).decode() + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, "the reader process ended"
        return orjson.loads(line)

    def route(self, name: str = MODEL) -> Any:
        """The route ``name`` as the board shows it, or None."""
        return next((r for r in self.ask("routes") if r["name"] == name), None)

    def shed(self, target: str = INFER, **headers: str) -> Any:
        named = [[k.replace("_", "-").lower(), v] for k, v in headers.items()]
        return self.ask("shed", target=target, headers=named)

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()  # end of input: the reader detaches and ends
        assert self.process.wait(30) == 0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    sources = thread_isolated([s for s in builtin_sources() if s.name in (MODEL, "simple")])
    config = RuntimeConfig.model_validate(
        {"server": {"shed_loop_lag": 0, "data_dir": str(tmp_path_factory.mktemp("data"))}}
    )
    with serve_in_thread(config, sources) as running:
        httpx.post(f"{running.url}{INFER}", json=GOOD, timeout=30)  # a batch's cost known
        yield running


@pytest.fixture(scope="module")
def published(server: RunningServer) -> Iterator[LoadBoardPublisher]:
    publisher = LoadBoardPublisher(server.runtime)
    server.loop.call_soon_threadsafe(publisher.start)
    wait_for(lambda: publisher.published > 0, "the first publish")
    yield publisher
    name = publisher.name
    server.loop.call_soon_threadsafe(publisher.close)
    wait_for(lambda: publisher.board is None, "the publisher to close")
    assert not Path("/dev/shm", name).exists()


@pytest.fixture
def reader(published: LoadBoardPublisher) -> Iterator[Reader]:
    seen = Reader(published.name)
    yield seen
    seen.close()


def _engine_shed(server: RunningServer, target: str, **headers: str) -> bytes | None:
    """Today's in-process early shed's answer to the same request."""
    shed = server.early_shed
    assert shed is not None
    named = [(k.replace("_", "-").lower().encode(), v.encode()) for k, v in headers.items()]

    async def ask() -> bytes | None:
        return shed(target.encode(), named)

    return server.call(ask())  # type: ignore[return-value]


def test_a_loaded_model_is_ready_on_the_board(reader: Reader) -> None:
    header = reader.ask("header")
    assert header["fresh"] and header["pid"] == os.getpid() and header["share"] == 1.0
    assert {r["name"] for r in reader.ask("routes")} == {MODEL, "simple"}
    route = reader.route()
    assert route["ready"] and route["default"] and route["eligible"]
    assert route["priority_levels"] == 3 and len(route["waits"]) == 3
    # What a request to it holds at most (64 rows of 64 pixels): a front end refuses more
    # JSON than that before parsing it.
    assert route["json_values"] == 64 * 64


def test_a_backlog_refuses_the_low_priority_and_not_the_high(
    server: RunningServer, reader: Reader
) -> None:
    results: list[int] = []

    def send(priority: str) -> None:
        response = httpx.post(
            f"{server.url}{INFER}", json=GOOD, headers={"X-Sordino-Priority": priority},
            timeout=60,
        )  # fmt: skip
        results.append(response.status_code)

    with Gate(server, MODEL) as gate:
        threads = [threading.Thread(target=send, args=("high",))]
        threads[0].start()
        assert gate.entered.wait(30)
        threads += [threading.Thread(target=send, args=("low",)) for _ in range(8)]
        for thread in threads[1:]:
            thread.start()
        wait_for(lambda: reader.route()["rows_ahead"][2] == 8, "8 rows queued on the board")
        route = reader.route()
        high, _, low = route["waits"]
        assert route["rows_ahead"][0] == 0 and low > high
        # A deadline the high priority meets and the low one cannot, by the scheduler's rule.
        timeout_us = str(int((high + low) / 2 / 0.8 * 1e6))
        refused = reader.shed(X_Sordino_Priority="low", X_Sordino_Timeout=timeout_us)
        assert refused is not None
        status, body, headers = refused
        message = orjson.loads(body)["error"]
        assert status == 503 and f"model {MODEL}/1 is overloaded: 8 rows at priority 3" in message
        assert int(headers["Retry-After"]) >= 1
        assert reader.shed(X_Sordino_Priority="high", X_Sordino_Timeout=timeout_us) is None
        # Today's in-process early shed gives the same answers now.
        engine = _engine_shed(server, INFER, X_Sordino_Priority="low", X_Sordino_Timeout=timeout_us)
        assert engine is not None and engine.startswith(b"HTTP/1.1 503")
        high_engine = _engine_shed(
            server, INFER, X_Sordino_Priority="high", X_Sordino_Timeout=timeout_us
        )
        assert high_engine is None
        gate.release()
        for thread in threads:
            thread.join(60)
    assert results == [200] * 9


@pytest.mark.parametrize(
    ("target", "headers"),
    [
        (INFER, {"X_Sordino_Priority": "urgent", "X_Sordino_Timeout": "1"}),
        (INFER, {"X_Sordino_Priority": "9", "X_Sordino_Timeout": "1"}),
        (INFER, {"X_Sordino_Priority": "low", "X_Sordino_Timeout": "soon"}),
        ("/v2/models/no-such-model/infer", {"X_Sordino_Timeout": "1"}),
        (f"/v2/models/{MODEL}/versions/7/infer", {"X_Sordino_Timeout": "1"}),
        ("/v2/models/%FF/infer", {"X_Sordino_Timeout": "1"}),
        (INFER, {"X_Sordino_Priority": "low", "X_Sordino_Timeout": "1"}),
        (f"/v2/models/{MODEL}/versions/1/infer", {"X_Sordino_Timeout": "1"}),
    ],
)
def test_bad_input_gets_the_same_answer_as_the_engines_early_shed(
    server: RunningServer, reader: Reader, target: str, headers: dict[str, str]
) -> None:
    """A malformed priority or timeout, an unknown model or version: neither refuses
    (the ordinary path says what is wrong); a 1 µs deadline: both refuse."""
    engine = _engine_shed(server, target, **headers)
    board = reader.shed(target, **headers)
    assert (board is None) == (engine is None)
    if board is not None:
        assert engine is not None and engine.startswith(b"HTTP/1.1 %d" % board[0])


def test_a_route_with_no_slot_is_left_off_and_forwarded(server: RunningServer) -> None:
    """Two routes, one slot: the first by name has it; the other is counted in the
    header's overflow, and its requests are not refused here (the engine decides)."""
    small = LoadBoardPublisher(server.runtime, slots=1)
    server.loop.call_soon_threadsafe(small.start)
    wait_for(lambda: small.published > 0, "the small board's first publish")
    seen = Reader(small.name)
    try:
        assert [r["name"] for r in seen.ask("routes")] == [MODEL]
        assert seen.ask("header")["overflow"] == 1
        assert seen.shed("/v2/models/simple/infer", X_Sordino_Timeout="1") is None
        # A batch just ran (an idle model's batch time over a second old refuses no
        # deadline: docs/scheduling.md, "Overload"); the next publish carries it.
        httpx.post(f"{server.url}{INFER}", json=GOOD, timeout=30)
        after = small.published
        wait_for(lambda: small.published > after, "a publish after the batch")
        assert seen.shed(X_Sordino_Timeout="1") is not None
    finally:
        seen.close()
        server.loop.call_soon_threadsafe(small.close)
        wait_for(lambda: small.board is None, "the small board to close")


def test_an_unloaded_model_leaves_the_board(server: RunningServer, reader: Reader) -> None:
    """(Last of the tests on the module's server: its model is gone after it.)"""
    version = server.runtime.get(MODEL).key.version
    server.call(server.runtime.loader.unload(MODEL, version, drain=True))
    assert reader.route() is None  # published on the unload, not at the next tick
    assert reader.shed(X_Sordino_Timeout="1") is None  # unknown now: the engine answers


@pytest.mark.parametrize(("given", "read"), [(0, 0), (4096, 4096), (None, None), (1 << 40, None)])
def test_a_routes_json_bound_is_read_as_written(
    tmp_path: Path, given: int | None, read: int | None
) -> None:
    """None (no bound) and a count past what the slot holds both read as no bound."""
    board = LoadBoard.create(tmp_path, slots=1)
    try:
        settings = QueueSettings(priority_levels=2, default_priority=1)
        route = RouteLoad("m", "1", True, True, True, settings, (0.0, 0.0), (0, 0), given)
        board.write_route(0, route)
        found = board.route_at(0)
        assert found is not None and found.json_values == read and found.name == "m"
    finally:
        board.close()


def test_torn_reads_are_impossible(tmp_path: Path) -> None:
    """A writer process rewrites every record as fast as it can, each figure the same
    counter; every record read here holds one counter, never two."""
    writer = _spawn("writer", str(tmp_path), "1.5")
    assert writer.stdout is not None and writer.stdin is not None
    board = LoadBoard.attach(writer.stdout.readline().strip())
    try:
        reads = changes = 0
        last = None
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            route = board.route_at(0)
            header = board.header()
            if route is not None:
                reads += 1
                (k,) = set(route.waits)
                assert set(route.rows_ahead) == {int(k)} and len(route.waits) == MAX_LEVELS
                changes += k != last
                last = k
            if header is not None:
                assert header.share == header.top_share == header.last_lag_s
                assert header.overflow == int(header.share)
        written = int(writer.stdout.readline())
        # They overlapped: the reader saw the writer's records change under it (a busy
        # machine may run the two by turns, so only a few changes are asked for).
        assert written > 1000 and reads > 100 and changes > 10, (written, reads, changes)
    finally:
        writer.stdin.close()
        writer.wait(30)
        board.close()


def test_the_block_is_removed_at_close(tmp_path: Path) -> None:
    board = LoadBoard.create(tmp_path)
    name = board.name
    assert Path("/dev/shm", name).exists() and (tmp_path / name).exists()
    board.close()
    assert not Path("/dev/shm", name).exists() and not (tmp_path / name).exists()
    with pytest.raises(FileNotFoundError):
        LoadBoard.attach(name)


def _hold_board(registry: str, ready: multiprocessing.synchronize.Event) -> None:
    board = LoadBoard.create(Path(registry))
    ready.set()
    time.sleep(60)  # until SIGKILLed: nothing removes the board
    board.close()


def test_a_killed_engines_board_is_reclaimed_at_the_next_start(tmp_path: Path) -> None:
    # Spawned by multiprocessing: it shares this process's resource tracker, which would
    # otherwise remove the segment itself when its own process dies.
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    owner = context.Process(target=_hold_board, args=(str(tmp_path), ready))
    owner.start()
    try:
        assert ready.wait(60)
        (record,) = tmp_path.iterdir()
        assert remove_stale_segments(tmp_path) == []  # alive: left alone
    finally:
        owner.kill()
        owner.join(30)
    assert Path("/dev/shm", record.name).exists()
    (stale,) = remove_stale_segments(tmp_path)  # what Runtime.start runs first
    assert stale.name == record.name and stale.removed and stale.pid == owner.pid
    assert not Path("/dev/shm", record.name).exists()


def test_what_is_not_a_board_is_refused(tmp_path: Path) -> None:
    from multiprocessing import shared_memory

    other = shared_memory.SharedMemory(create=True, size=4096)
    try:
        with pytest.raises(ValueError, match="not a sordino load board"):
            LoadBoard.attach(other.name)
    finally:
        other.close()
        other.unlink()


SETTINGS = QueueSettings(priority_levels=3, default_priority=2, default_timeout_s=0.0)
LOADED = RouteLoad("m", "1", True, True, True, SETTINGS, (0.01, 0.05, 0.5), (0, 4, 40))


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _board(tmp_path: Path, clock: _Clock, share: float = 1.0) -> tuple[LoadBoard, LoadBoard]:
    writer = LoadBoard.create(tmp_path, slots=2)
    writer.write_route(1, LOADED)
    writer.bump_generation()
    writer.write_header(
        share=share, top_share=1.0, last_lag_s=0.05, tenants_required=False, stopping=False,
        overflow=0, now=clock.now,
    )  # fmt: skip
    return writer, LoadBoard.attach(writer.name, clock=clock)


def _refusal(shed: BoardShed, target: bytes, headers: list[tuple[bytes, bytes]]) -> Any:
    """The shed's answer, on its one loop (a shed is bound to the loop it first ran on)."""

    async def ask() -> Any:
        return shed.refusal(target, headers)

    loop = _LOOPS.setdefault(id(shed), asyncio.new_event_loop())
    return loop.run_until_complete(ask())


_LOOPS: dict[int, asyncio.AbstractEventLoop] = {}


LOW_200MS = [(b"x-sordino-priority", b"low"), (b"x-sordino-timeout", b"200000")]


def test_a_stale_board_refuses_nothing(tmp_path: Path) -> None:
    clock = _Clock()
    writer, board = _board(tmp_path, clock)
    try:
        shed = BoardShed(board, {})
        refused = _refusal(shed, b"/v2/models/m/infer", LOW_200MS)
        assert refused is not None and refused[0] == 503
        clock.now += STALE_S + 0.5  # the engine stopped publishing
        assert _refusal(shed, b"/v2/models/m/infer", LOW_200MS) is None
        assert sum(shed.refused.values()) == 1
    finally:
        board.close()
        writer.close()


def test_a_header_read_while_being_written_is_read_again_next_iteration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A header that could not be read whole (the engine writing it all the while)
    refuses nothing for that iteration only, not until the engine publishes again."""
    clock = _Clock()
    writer, board = _board(tmp_path, clock)
    try:
        shed = BoardShed(board, {})
        whole = board.header
        monkeypatch.setattr(board, "header", lambda: None)
        assert _refusal(shed, b"/v2/models/m/infer", LOW_200MS) is None
        monkeypatch.setattr(board, "header", whole)  # the board has not moved since
        refused = _refusal(shed, b"/v2/models/m/infer", LOW_200MS)
        assert refused is not None and refused[0] == 503
    finally:
        board.close()
        writer.close()


def test_the_engines_lag_share_refuses_lower_priorities_only(tmp_path: Path) -> None:
    clock = _Clock()
    writer, board = _board(tmp_path, clock, share=0.01)
    try:
        shed = BoardShed(board, {})
        target = b"/v2/models/m/versions/1/infer"
        refused = _refusal(shed, target, [(b"x-sordino-priority", b"low")])
        assert refused is not None and "event loop runs 50 ms late" in refused[1].decode()
        assert _refusal(shed, target, [(b"x-sordino-priority", b"high")]) is None
        assert _refusal(shed, target, []) is None  # the body may say high
        # The front end's own loop lag applies too.
        own = LoopLag(0.01, interval_s=3600.0, idle_s=3600.0)
        own.share, own.top_share = 0.01, 0.5
        shed = BoardShed(board, {}, own)
        answers = [_refusal(shed, target, [(b"x-sordino-priority", b"high")]) for _ in range(4)]
        assert sum(a is None for a in answers) == 2
        own.close()
    finally:
        board.close()
        writer.close()


def test_a_board_silent_for_long_refuses_inference(tmp_path: Path) -> None:
    """An engine stopped (SIGSTOP, a debugger) or stuck publishes nothing: past
    ``ENGINE_SILENT_S`` a front end refuses inference with 503 rather than forwarding
    requests that could only wait (before: forwarded, each waited until its client gave
    up). Anything else still goes to the engine."""
    clock = _Clock()
    writer, board = _board(tmp_path, clock)
    try:
        shed = BoardShed(board, {})
        tenant = [(b"x-sordino-tenant", b"acme")]
        assert _refusal(shed, b"/v2/models/m/infer", tenant) is None  # served: it is idle
        clock.now += STALE_S + 0.5  # stale: the board's rules refuse nothing
        assert _refusal(shed, b"/v2/models/m/infer", tenant) is None
        clock.now += ENGINE_SILENT_S
        refused = _refusal(shed, b"/v2/models/m/infer", tenant)
        assert refused is not None and refused[0] == 503, refused
        assert b"the engine has not answered for 12 s (stopped or stuck)" in refused[1]
        assert refused[2].get("Retry-After") == "1"
        assert _refusal(shed, b"/v2/health/ready", []) is None  # not inference
        assert shed.refused == {("m", None, "acme", "engine_silent"): 1}
        # It publishes again: served again.
        writer.write_header(
            share=1.0, top_share=1.0, last_lag_s=0.0, tenants_required=False, stopping=False,
            overflow=0, now=clock.now,
        )  # fmt: skip
        assert _refusal(shed, b"/v2/models/m/infer", tenant) is None
    finally:
        board.close()
        writer.close()


def test_a_stopping_engines_silence_refuses_nothing(tmp_path: Path) -> None:
    clock = _Clock()
    writer, board = _board(tmp_path, clock)
    try:
        writer.write_header(
            share=1.0, top_share=1.0, last_lag_s=0.0, tenants_required=False, stopping=True,
            overflow=0, now=clock.now,
        )  # fmt: skip
        shed = BoardShed(board, {})
        clock.now += ENGINE_SILENT_S + 5
        assert _refusal(shed, b"/v2/models/m/infer", []) is None
    finally:
        board.close()
        writer.close()
