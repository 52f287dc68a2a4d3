"""Real HTTP and gRPC servers in a background thread, for tests that use real clients.

Both listen on free loopback ports and share one runtime and one model control, as
``sordino start`` runs them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sordino.backends.base import Backend
from sordino.config import RuntimeConfig
from sordino.models.repository import ModelSource, builtin_sources
from sordino.server.engine_shed import EarlyShed
from sordino.server.frontends import Frontends
from sordino.server.lifecycle import open_server
from sordino.server.model_control import ModelControl
from sordino.server.runtime import Runtime
from sordino.server.serve import HttpServer

__all__ = ["TEST_CLOSING_GRACE_S", "RunningServer", "serve_in_thread"]

TEST_CLOSING_GRACE_S = 0.1
"""A test server's closing grace (:func:`serve_in_thread`): the server's own is
``connection_guard.CLOSING_GRACE_S`` (2 s), which every test whose client stays
connected to the end would otherwise wait out at its teardown."""


@dataclass
class RunningServer:
    """A server started by :func:`serve_in_thread`.

    ``url`` and ``port`` are the HTTP endpoint's; ``grpc_url`` is the ``host:port`` of
    the gRPC endpoint, which shares the runtime and ``control`` (the model control)
    with HTTP. ``runtime`` lives on the server's own event loop: read its
    ``statistics()`` from tests, but call coroutines only through :meth:`call`.
    """

    url: str
    port: int
    runtime: Runtime
    loop: asyncio.AbstractEventLoop
    grpc_port: int = 0
    control: ModelControl | None = None
    early_shed: EarlyShed | None = None
    """What refuses requests from their headers (tests may swap its ``lag``)."""
    frontends: Frontends | None = None
    """The extra HTTP front-end processes (``server.frontends`` > 1), else None."""
    http: HttpServer | None = None
    """The HTTP server (tests may begin its stop: ``stop_accepting``, on its loop)."""

    def thread_backends(self, name: str, version: str | None = None) -> list[Backend]:
        """The in-process backends of a thread-isolated model (tests hold or inspect them)."""
        return self.runtime.executor.local_backends(self.runtime.get(name, version).key)

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def call(self, coro: object, timeout: float = 60.0) -> object:
        """Run a coroutine on the server's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]


@contextmanager
def serve_in_thread(
    config: RuntimeConfig | None = None,
    sources: Sequence[ModelSource] | None = None,
    *,
    startup_timeout: float = 120.0,
    data_dir: Path | None = None,
    prepare: Callable[[Runtime], None] | None = None,
    closing_grace_s: float = TEST_CLOSING_GRACE_S,
) -> Iterator[RunningServer]:
    """Run real HTTP and gRPC servers on 127.0.0.1 in a background thread while the block runs.

    Serves ``sources`` (the built-in models by default) under ``config``, whose host
    and ports are not used. On exit the server shuts down as on SIGTERM: queued
    requests finish, then connections close. With ``data_dir`` the runtime journals
    there as ``sordino start --data-dir`` does; ``prepare`` is called with the runtime
    before it starts (to install test doubles). A failure during start-up is raised
    here, after the workers already started are stopped; a start-up slower than
    ``startup_timeout`` seconds raises :class:`TimeoutError`. The event-loop lag rule
    (``server.shed_loop_lag``) is off unless ``config`` sets it. ``closing_grace_s``: how
    long, once stopping, kept-alive HTTP connections may still send a request before the
    idle ones are closed; :data:`TEST_CLOSING_GRACE_S` unless given, so that a test
    whose client keeps its connection open does not wait the server's 2 s for it.
    """
    config = config or RuntimeConfig()
    # Loopback and free ports, whatever the config says: tests never collide on a port.
    loopback: dict[str, object] = {"host": "127.0.0.1", "http_port": 0, "grpc_port": 0}
    if "shed_loop_lag" not in config.server.model_fields_set:
        # The server's loop shares this process's GIL with the test's own clients, so
        # its lag measures them, not the server: on a busy 2-core machine it refused a
        # plain load test's requests as overload. Tests of the lag rule set it.
        loopback["shed_loop_lag"] = 0
    config = config.model_copy(update={"server": config.server.model_copy(update=loopback)})
    chosen = list(sources) if sources is not None else builtin_sources()
    started = threading.Event()
    failure: list[BaseException] = []
    holder: dict[str, object] = {}

    async def main() -> None:
        stop = asyncio.Event()
        holder["stop"] = stop
        holder["loop"] = asyncio.get_running_loop()
        try:
            async with open_server(
                config,
                chosen,
                journal=data_dir / config.telemetry.journal_file if data_dir else None,
                prepare=prepare,
                closing_grace_s=closing_grace_s,
            ) as server:
                holder["running"] = RunningServer(
                    server.url,
                    server.http.port,
                    server.runtime,
                    asyncio.get_running_loop(),
                    grpc_port=server.grpc.port,
                    control=server.control,
                    early_shed=server.http.early_shed,
                    frontends=server.frontends,
                    http=server.http,
                )
                started.set()
                await stop.wait()
        except BaseException as exc:
            if not started.is_set():
                failure.append(exc)
                started.set()
                return
            raise

    thread = threading.Thread(target=lambda: asyncio.run(main()), name="sordino-test-server")
    thread.start()
    if not started.wait(startup_timeout):
        raise TimeoutError("the test server did not start in time")
    if failure:
        thread.join()
        raise failure[0]
    running = holder["running"]
    assert isinstance(running, RunningServer)
    try:
        yield running
    finally:
        loop = holder["loop"]
        stop = holder["stop"]
        assert isinstance(loop, asyncio.AbstractEventLoop) and isinstance(stop, asyncio.Event)
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=60)
