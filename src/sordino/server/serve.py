"""Running the HTTP server: binding, start-up, graceful shutdown.

:class:`HttpServer` runs uvicorn on a socket it binds itself, so ``port 0`` gives a
free port that is known before the first request. Shutdown refuses new requests,
lets queued ones finish (or fail explicitly after the shutdown timeout), then closes
the connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Generator

import uvicorn

from sordino.errors import ConfigError
from sordino.records import ConnectionStatistics
from sordino.server.connection_guard import (
    CLOSING_GRACE_S,
    ConnectionGuard,
    default_max_connections,
    drained,
)
from sordino.server.connection_tally import ConnectionTally
from sordino.server.engine_shed import EarlyShed
from sordino.server.frontends import frontend_count
from sordino.server.http import build_app
from sordino.server.http_protocol import HttpProtocol, http_protocol
from sordino.server.listen import bind_socket, check_port, reserve_port
from sordino.server.loop_lag import LoopLag
from sordino.server.model_control import ModelControl
from sordino.server.runtime import Runtime
from sordino.server.tls import load_tls
from sordino.server.tls_accept import tls_protocol
from sordino.telemetry.connection_metrics import ConnectionCollector

__all__ = ["HttpServer", "bind_socket", "check_port"]


async def _adopt(
    loop: asyncio.AbstractEventLoop, protocol: HttpProtocol, sock: socket.socket
) -> None:
    try:
        await loop.connect_accepted_socket(lambda: protocol, sock=sock)
    except OSError:  # the client left while its connection moved
        sock.close()


class _EmbeddedServer(uvicorn.Server):
    # The owner of the event loop handles signals; uvicorn must not replace its handlers.
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class HttpServer:
    """The KServe v2 HTTP endpoint of one runtime.

    uvicorn owns the socket and the shutdown; each connection is sordino's own
    protocol (``server/http_protocol.py``): inference answered on it directly, the
    rest through Starlette, and guarded (``server/connection_guard.py``): header and
    body read timeouts, and limits on open connections in total and per client address.
    """

    def __init__(
        self, runtime: Runtime, host: str, port: int, control: ModelControl | None = None
    ) -> None:
        self.runtime = runtime
        self.host = host
        settings = runtime.config.server
        tls = load_tls(settings.tls)  # before binding: a bad file leaves no socket behind
        self.frontends = frontend_count(settings)
        if self.frontends > 1 and tls is not None:
            raise ConfigError(
                "server.frontends > 1 with server.tls is not supported: a TLS session cannot "
                "move between processes; use server.frontends: 1 or end TLS at a proxy"
            )
        if self.frontends > 1 and not sys.platform.startswith("linux"):
            raise ConfigError(
                "server.frontends > 1 is supported on Linux only (SO_REUSEPORT's spreading "
                "of connections); use server.frontends: 1"
            )
        # With front-end processes this process reads no client connection: it only holds
        # the port (bound, never listened on) for them, and serves what they hand over.
        if self.frontends > 1:
            self._sock = reserve_port(host, port, flag="--http-port")
        else:
            self._sock = bind_socket(host, port)
        self.port: int = self._sock.getsockname()[1]
        self.guard = ConnectionGuard(
            max_connections=settings.max_connections or default_max_connections(),
            max_per_client=settings.max_connections_per_client,
            header_timeout=settings.header_timeout,
            max_header_size=settings.max_header_size,
            body_timeout=settings.body_timeout,
            max_pending_bodies=settings.max_pending_bodies,
            max_pending_body_size=settings.max_pending_body_size,
            body_min_rate=settings.body_min_rate,
            body_rate_grace=settings.body_rate_grace,
            monitoring_connections=settings.monitoring_connections,
        )
        # Refuse from the headers what the scheduler would shed after decoding the body.
        lag = settings.shed_loop_lag
        self.early_shed = EarlyShed(runtime, LoopLag(lag) if lag > 0 else None)
        self.guard.early_shed = self.early_shed
        self.tally: ConnectionTally | None = None
        """The front ends' connection figures (set with ``server.frontends`` > 1)."""
        runtime.metrics.registry.register(ConnectionCollector(self.connection_statistics))
        self.tls = tls is not None
        # With TLS the listener is made here, not by uvicorn, so that the TLS handshake
        # is bounded by server.header_timeout (uvicorn leaves asyncio's 60 s default).
        self._ssl = tls.ssl_context() if tls is not None else None
        self._handshake_timeout = settings.header_timeout
        app = build_app(runtime, control)
        self._protocol = http_protocol(self.guard, app, runtime, settings.keep_alive_timeout)
        config = uvicorn.Config(
            app,
            loop="none",
            http=self._protocol,
            lifespan="off",
            access_log=False,
            log_level="warning",
            timeout_graceful_shutdown=5,
            # sordino reads no client address; skip the X-Forwarded-* middleware per request.
            proxy_headers=False,
        )
        self._server = _EmbeddedServer(config)
        self._task: asyncio.Task[None] | None = None
        self._adopting: set[asyncio.Task[None]] = set()

    def connection_statistics(self) -> ConnectionStatistics:
        """The server's HTTP connections: this process's, and its front ends' when it
        has some (``server/connection_tally.py``)."""
        own = self.guard.statistics()
        return own if self.tally is None else self.tally.total(own)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    async def start(self) -> None:
        """Start serving; return once the socket accepts connections (with front-end
        processes: once handed-over connections can be adopted; none is accepted here)."""
        loop = asyncio.get_running_loop()
        sockets = [self._sock] if self._ssl is None and self.frontends == 1 else []
        self._task = loop.create_task(self._server.serve(sockets=sockets))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("the HTTP server stopped during start-up")
            await asyncio.sleep(0.01)
        if self._ssl is not None:
            await self._listen_tls(loop)

    async def _listen_tls(self, loop: asyncio.AbstractEventLoop) -> None:
        """Accept TLS connections on the socket, as uvicorn would, but with the handshake
        bounded (a client that stalls it is dropped after ``server.header_timeout``) and
        counted against the connection limits from the accept (``tls_protocol``)."""
        server = self._server
        config = server.config
        assert self._ssl is not None

        def protocol() -> HttpProtocol:
            return self._protocol(
                server_state=server.server_state, app_state=server.lifespan.state, _loop=loop
            )

        listener = await loop.create_server(
            tls_protocol(protocol, self.guard, self._ssl, self._handshake_timeout),
            sock=self._sock,
            backlog=config.backlog,
        )
        server.servers.append(listener)  # closed by stop_accepting() and uvicorn's shutdown

    def adopt(self, sock: socket.socket, data: bytes) -> None:
        """Serve a connection another front-end process accepted (``server/engine_link.py``):
        ``data`` is what that process already read from it, fed before the next read."""
        loop = asyncio.get_running_loop()
        server = self._server
        protocol = self._protocol(
            server_state=server.server_state, app_state=server.lifespan.state, _loop=loop
        )
        if data:
            protocol._early.append(data)  # fed by connection_made, before any read
        task = loop.create_task(_adopt(loop, protocol, sock))
        self._adopting.add(task)
        task.add_done_callback(self._adopting.discard)

    def stop_accepting(self) -> None:
        """Close the listening socket; open connections keep being served, each answer
        now closing its connection (:meth:`ConnectionGuard.begin_closing`)."""
        self.guard.begin_closing()
        for server in getattr(self._server, "servers", ()):  # none before start()
            server.close()

    async def stop(self, *, grace_s: float = CLOSING_GRACE_S) -> None:
        """Close the listening socket and, after a grace period, the connections.

        During the grace period connections are still served (after shutdown began,
        every response says ``Connection: close``), so a keep-alive client that is
        between two requests gets an answer and closes its side, instead of having
        the connection closed under a request it is sending. Connections still open
        when the grace period ends are closed.
        """
        self.stop_accepting()
        await drained(self._server.server_state.connections, grace_s)
        self._server.should_exit = True
        if self._task is not None:
            await self._task
        self.guard.close_lingering()
        if self.early_shed.lag is not None:
            self.early_shed.lag.close()
        self._sock.close()
