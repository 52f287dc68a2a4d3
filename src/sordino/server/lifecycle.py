"""One open/close for a whole server: ``async with open_server(...) as server``.

``sordino start`` and the in-process test server both use it, so start-up and
shutdown happen in one order everywhere:

open
    bind the HTTP port, then the gRPC port (a port in use stops start-up before any
    model loads, naming the flag that changes it), open the journal (locked: one
    server per journal), load every model (``on_loaded`` after each), start gRPC,
    start HTTP, then with ``server.frontends`` > 1 publish the engine's load board and
    start the front-end processes (HTTP and gRPC; their HTTP refuses from the board),
    returning once each listens; start model control (poll mode's rescans). With
    front-end processes this process only *holds* the two ports (bound, never listened
    on: ``listen.reserve_port``) and reads no client connection; its HTTP server serves
    the connections handed over to it and its gRPC servicer the calls forwarded to it;
close
    stop accepting connections, stop the front-end processes (each answers what it
    has in flight first), stop model control, let queued requests finish
    (those still queued after ``server.shutdown_timeout`` get an explicit 503), stop
    gRPC, then close HTTP connections after their grace period, and remove the load
    board.

If opening fails at any step, whatever was started is stopped (workers included)
before the error propagates.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from sordino.config import RuntimeConfig
from sordino.models.repository import ModelSource
from sordino.server.connection_guard import CLOSING_GRACE_S
from sordino.server.frontends import Frontends
from sordino.server.grpc_server import GrpcServer
from sordino.server.load_publisher import LoadBoardPublisher
from sordino.server.model_control import ModelControl
from sordino.server.registry import LoadedModel
from sordino.server.runtime import Runtime
from sordino.server.serve import HttpServer

__all__ = ["Server", "open_server"]


@dataclass(frozen=True, slots=True)
class Server:
    """A running server: its runtime, model control and the two endpoints."""

    runtime: Runtime
    control: ModelControl
    http: HttpServer
    grpc: GrpcServer
    journal: Path | None
    frontends: Frontends | None = None
    """The front-end processes (None: one process, the engine's listeners are the only ones)."""

    @property
    def url(self) -> str:
        return self.http.url


@asynccontextmanager
async def open_server(
    config: RuntimeConfig,
    sources: Sequence[ModelSource],
    *,
    journal: Path | None = None,
    prepare: Callable[[Runtime], None] | None = None,
    on_journal: Callable[[Path], None] | None = None,
    on_loaded: Callable[[LoadedModel], None] | None = None,
    closing_grace_s: float = CLOSING_GRACE_S,
) -> AsyncIterator[Server]:
    """Start a server for ``config`` serving ``sources``; stop it when the block ends.

    ``journal`` is the SQLite journal to write (None: none). ``prepare`` is called
    with the runtime before any model loads (tests install doubles there); ``on_journal``
    with the journal's path once it is open, ``on_loaded`` with each model once it serves.
    ``closing_grace_s``: once stopping, how long kept-alive HTTP connections may still
    send a request before the idle ones are closed (:meth:`HttpServer.stop`).
    """
    runtime = Runtime(config, sources)
    control = ModelControl(runtime)
    http = HttpServer(runtime, config.server.host, config.server.http_port, control)
    grpc = GrpcServer(runtime, config.server.host, config.server.grpc_port, control)
    frontends: Frontends | None = None
    board: LoadBoardPublisher | None = None  # the engine's load, for the front ends
    if http.frontends > 1:
        frontends = Frontends(
            runtime,
            http.adopt,
            host=config.server.host,
            port=http.port,
            count=http.frontends,
            servicer=grpc.servicer,
        )
        http.tally = frontends.link.tally
    try:
        grpc.bind()
        opened = runtime.telemetry.open_journal(journal) if journal is not None else None
        if opened is not None and on_journal is not None:
            on_journal(opened.path)
        if prepare is not None:
            prepare(runtime)
        await runtime.start(on_loaded=on_loaded)
        await grpc.start()
        await http.start()
        if frontends is not None:
            board = LoadBoardPublisher(runtime, lag=http.early_shed.lag)
            board.start()
            frontends.spec = replace(
                frontends.spec,
                board=board.name,
                rules={r.tag: r.priority for r in config.scheduler.priority_rules},
                grpc_port=grpc.port,
            )
            await frontends.start()
        control.start()
    except BaseException:
        # Whatever stopped start-up, stop the workers already running before leaving.
        await control.close()
        await runtime.stop(drain=False)
        await grpc.stop()
        await http.stop(grace_s=0)
        if frontends is not None:
            await frontends.close()
        if board is not None:
            board.close()
        raise
    journal_path = opened.path if opened is not None else None
    server = Server(runtime, control, http, grpc, journal_path, frontends)
    try:
        yield server
    finally:
        http.stop_accepting()
        if frontends is not None:
            await frontends.drain(config.server.shutdown_timeout + 5.0)
        await control.close()
        await runtime.stop(drain=True, timeout_s=config.server.shutdown_timeout)
        await grpc.stop()
        await http.stop(grace_s=closing_grace_s)
        if frontends is not None:
            await frontends.close()
        if board is not None:
            board.close()
