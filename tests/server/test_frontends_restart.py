"""``server.frontends: 2``: a front end that dies, all of them dying at once, a stop, and
the ports the engine holds at start-up (taken, given back on a failed start).

Its own server (the engine on a thread of this process, two front-end processes), as
these tests kill front ends and stop servers.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from sordino.config import RuntimeConfig
from sordino.errors import ModelLoadError
from sordino.models.repository import builtin_sources
from sordino.server.lifecycle import open_server
from sordino.server.runtime import Runtime
from sordino.testing import RunningServer, serve_in_thread
from tests.conftest import thread_isolated
from tests.server.frontend_helpers import (
    any_connection,
    ask,
    connection_on,
    digits_body,
    listening,
)
from tests.server.helpers import SIMPLE_BODY, Gate, frontend_pid
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    config = RuntimeConfig.model_validate({"server": {"frontends": 2, "shutdown_timeout": 10}})
    digits = [s for s in builtin_sources() if s.name == "digits-classifier"]
    with serve_in_thread(config, thread_isolated(digits)) as running:
        yield running


def _serve_steadily(server: RunningServer, pid: int, count: int, statuses: list[int]) -> None:
    connection = connection_on(server, pid)
    for seed in range(count):
        status, _, _ = ask(
            connection, "POST", "/v2/models/digits-classifier/infer", digits_body(seed)
        )
        statuses.append(status)
    connection.close()


def test_a_front_end_that_dies_is_replaced_and_the_others_lose_nothing(
    server: RunningServer,
) -> None:
    assert server.frontends is not None
    restarts = server.frontends.restarts
    dead, alive = server.frontends.pids()
    statuses: list[int] = []
    steady = threading.Thread(target=_serve_steadily, args=(server, alive, 200, statuses))
    steady.start()
    wait_for(lambda: len(statuses) >= 20, "requests on the other front end's connection")
    os.kill(dead, signal.SIGKILL)
    # What the kernel queued for it while it died is reset with it; once it is gone, new
    # connections go to the front end that is left (or to the replacement). Gone means
    # reaped: a dying process's fd table empties before its sockets are released (the
    # last close runs later in its exit), and a connection queued on its listener in
    # that window is reset too (seen under load).
    wait_for(lambda: not listening(dead, server.port), "the killed front end to let go")
    wait_for(lambda: not psutil.pid_exists(dead), "the supervisor to reap it")
    for _ in range(5):
        connection = any_connection(server)
        assert ask(connection, "GET", "/v2/health/ready")[0] == 200
        connection.close()
    steady.join(60)
    assert statuses == [200] * 200
    wait_for(
        lambda: server.frontends is not None and server.frontends.restarts == restarts + 1,
        "a restart",
    )
    wait_for(
        lambda: (
            server.frontends is not None
            and set(server.frontends.pids()) <= server.frontends.link.pids()
        ),
        "the new front end to listen",
    )
    (replacement,) = set(server.frontends.pids()) - {alive}
    assert replacement != dead
    connection = connection_on(server, replacement)
    status, _, _ = ask(connection, "POST", "/v2/models/digits-classifier/infer", digits_body())
    assert status == 200
    connection.close()


def test_with_every_front_end_down_the_port_stays_the_engines(server: RunningServer) -> None:
    """Both killed at once: no program can take the port meanwhile (``reserve_port``'s
    own tests show the rest: a client is refused until a front end listens again), and
    both come back."""
    assert server.frontends is not None
    restarts = server.frontends.restarts
    pids = server.frontends.pids()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: not any(listening(pid, server.port) for pid in pids),
        "the killed front ends to let go of the port",
    )
    wait_for(lambda: not any(psutil.pid_exists(pid) for pid in pids), "both to be reaped")
    stranger = socket.socket()
    stranger.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    with pytest.raises(OSError), stranger:
        stranger.bind(("127.0.0.1", server.port))
    wait_for(
        lambda: server.frontends is not None and server.frontends.restarts == restarts + 2,
        "both restarts",
    )
    wait_for(
        lambda: (
            server.frontends is not None
            and set(server.frontends.pids()) <= server.frontends.link.pids()
        ),
        "the new front ends to listen",
    )
    connection = any_connection(server)
    assert ask(connection, "POST", "/v2/models/digits-classifier/infer", digits_body())[0] == 200
    connection.close()


def test_a_stop_answers_what_a_front_end_has_in_flight() -> None:
    config = RuntimeConfig.model_validate({"server": {"frontends": 2, "shutdown_timeout": 10}})
    simple = [s for s in builtin_sources() if s.name == "simple"]
    serving = serve_in_thread(config, thread_isolated(simple))
    server = serving.__enter__()
    assert server.frontends is not None
    frontend = psutil.Process(frontend_pid(server))
    answered: list[tuple[int, str]] = []
    with Gate(server, "simple") as gate:
        connection = connection_on(server, frontend.pid)

        def send() -> None:
            status, _, headers = ask(connection, "POST", "/v2/models/simple/infer", SIMPLE_BODY)
            answered.append((status, headers.get("connection", "")))

        asking = threading.Thread(target=send)
        asking.start()
        wait_for(gate.entered.is_set, "the request to reach the model")
        stopping = threading.Thread(target=serving.__exit__, args=(None, None, None))
        stopping.start()
        # The front end has its SIGTERM once it stops listening: only then is the
        # answer due with "Connection: close" (before, it would be a plain answer).
        wait_for(lambda: not listening(frontend, server.port), "the front end to stop accepting")
        gate.release()
        asking.join(30)
        stopping.join(60)
    assert answered == [(200, "close")]
    assert not frontend.is_running() or frontend.status() == psutil.STATUS_ZOMBIE


def _config(http_port: int, grpc_port: int) -> RuntimeConfig:
    return RuntimeConfig.model_validate(
        {"server": {"host": "127.0.0.1", "frontends": 2, "http_port": http_port,
                    "grpc_port": grpc_port}}
    )  # fmt: skip


async def test_a_taken_port_stops_start_up_as_for_one_process() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(OSError) as raised:
            async with open_server(_config(0, port), builtin_sources()):
                pass
    assert str(raised.value) == (
        f"cannot listen for gRPC on 127.0.0.1:{port}: Address already in use; pick another "
        "port with --grpc-port (0 picks a free one)"
    )


async def test_a_failed_start_gives_both_held_ports_back(tmp_path: Path) -> None:
    digits = next(s for s in builtin_sources() if s.name == "digits-classifier")
    broken = replace(digits, path=tmp_path / "not-a-model.onnx")
    broken.path.write_bytes(b"not onnx")
    ports: list[int] = []

    def note(runtime: Runtime) -> None:  # the ports are held by now, before any model
        ports.extend((runtime.config.server.http_port, runtime.config.server.grpc_port))

    held = [socket.socket(), socket.socket()]
    for sock in held:  # two free ports, known before start-up
        sock.bind(("127.0.0.1", 0))
    numbers = [sock.getsockname()[1] for sock in held]
    for sock in held:
        sock.close()
    with pytest.raises(ModelLoadError):
        async with open_server(_config(*numbers), [broken], prepare=note):
            pass
    assert ports == numbers
    for port in numbers:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))  # raises if the engine still held it


def test_a_front_end_that_stops_answering_is_killed_and_replaced(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopped (or hung) front end was never noticed: it lives, so it was not
    restarted, and the kernel went on spreading new connections to it, which waited for
    ever. Its link is silent (a front end beats every second): it is killed, replaced."""
    from sordino.server import frontends

    monkeypatch.setattr(frontends, "_SILENT_S", 2.0, raising=False)
    assert server.frontends is not None
    restarts = server.frontends.restarts
    stopped, alive = server.frontends.pids()
    os.kill(stopped, signal.SIGSTOP)
    try:
        wait_for(lambda: not psutil.pid_exists(stopped), "the silent front end to be ended")
        wait_for(lambda: server.frontends.restarts == restarts + 1, "another to start")
        wait_for(lambda: len(server.frontends.link.pids()) == 2, "it to say hello")
        for _ in range(10):
            connection = any_connection(server)
            assert ask(connection, "GET", "/v2/health/ready")[0] == 200
            connection.close()
        assert alive in server.frontends.pids()  # the one that answered was left alone
    finally:
        if psutil.pid_exists(stopped):
            os.kill(stopped, signal.SIGCONT)
