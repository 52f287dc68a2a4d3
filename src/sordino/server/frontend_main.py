"""A front-end process: ``python -m sordino.server.frontend_main SPEC``.

Started by the engine (``server/frontends.py``) with a JSON :class:`FrontendSpec`. It
connects to the engine's link, listens on the server's HTTP host and port, and on its
gRPC port, with ``SO_REUSEPORT`` (the kernel spreads new connections over every process
listening there; the engine only holds the ports and listens on neither), then says
hello on the link — the engine counts it as started only then, so a server that says it
is ready has every front end accepting — and serves HTTP with
``server/frontend_protocol.py`` and gRPC with ``server/grpc_frontend.py`` until:

- SIGTERM or SIGINT: stop accepting, let the requests in flight be answered (at most
  ``shutdown_timeout``), each answer saying ``Connection: close``; close the connections
  still open after a grace of 2 s, exit 0;
- the engine is gone (EOF on the link, or the parent-death signal): requests waiting
  on it are answered 503, the connections close, exit 0.

A port it cannot listen on (another program took it) or an engine it cannot reach ends
it with one logged line and status 1, no traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from email.utils import formatdate
from typing import Any

__all__ = ["FrontendSpec", "main"]

log = logging.getLogger("sordino.frontends")

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class FrontendSpec:
    """What a front end needs to know: where to listen, the engine's sockets, the
    connection guard's settings (``server.*``), the drain bound, and the engine's load
    board (``server/load_board.py``; None: none) with the tag → priority rules its
    refusals apply (``scheduler.priority_rules``)."""

    host: str
    port: int
    link: str
    handover: str
    guard: dict[str, Any]
    max_request_size: int
    keep_alive_timeout: float
    shutdown_timeout: float
    board: str | None = None
    rules: dict[str, int | str] = field(default_factory=dict)
    grpc_port: int | None = None
    """The engine's bound gRPC port, served here too (None: no gRPC here)."""
    grpc_options: dict[str, int] = field(default_factory=dict)
    """``max_receive`` (bytes), ``handshake_ms`` and ``accept_ahead`` of the gRPC server."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))


class _State:
    """What ``HttpProtocol`` reads and writes of uvicorn's ``server_state``."""

    def __init__(self) -> None:
        self.total_requests = 0
        self.connections: set[Any] = set()
        self.tasks: set[Any] = set()
        self.default_headers: list[tuple[bytes, bytes]] = []

    def tick(self, loop: asyncio.AbstractEventLoop) -> None:
        """Refresh the ``date`` header (as uvicorn does, once a second)."""
        date = formatdate(time.time(), usegmt=True).encode()
        self.default_headers = [(b"date", date), (b"server", b"uvicorn")]
        loop.call_later(1.0, self.tick, loop)


def _die_with_parent() -> None:
    """Ask Linux for SIGTERM when the engine process ends (EOF on the link covers the rest)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


async def serve(spec: FrontendSpec) -> None:
    """Serve until a signal or the engine's end (see the module's docstring)."""
    from sordino.server import link_frames
    from sordino.server.connection_guard import CLOSING_GRACE_S, ConnectionGuard, drained
    from sordino.server.connection_tally import ConnectionReporter
    from sordino.server.frontend_link import FrontendLink
    from sordino.server.frontend_protocol import frontend_protocol
    from sordino.server.listen import bind_socket

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    link = await FrontendLink.open(spec.link, hello=False)
    channel = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    channel.connect(spec.handover)
    channel.settimeout(5.0)
    guard = ConnectionGuard(**spec.guard)
    shed = None
    if spec.board is not None:
        from sordino.server.board_shed import RefusalCounts, attach_board_shed

        # Refuse from the engine's published load, before the body is read and
        # without a round trip: the same header rule as the one-process server's.
        def count(refused: RefusalCounts) -> None:
            # Counted by the engine as its own early refusals are, once a loop iteration.
            for (model, version, tenant, reason), times in refused.items():
                link.refused(model, version, tenant, reason, times)

        shed = attach_board_shed(spec.board, spec.rules, on_refused=count)
        guard.early_shed = shed
    protocol = frontend_protocol(
        guard,
        link,
        channel,
        max_request_size=spec.max_request_size,
        keep_alive_s=spec.keep_alive_timeout,
    )
    state = _State()
    state.tick(loop)
    sock = bind_socket(spec.host, spec.port, reuse_port=True)
    server = await loop.create_server(
        lambda: protocol(server_state=state, _loop=loop), sock=sock, backlog=2048
    )
    grpc_server = None
    if spec.grpc_port is not None:
        from sordino.server.grpc_frontend import open_frontend_grpc

        grpc_server = await open_frontend_grpc(
            link, spec.host, spec.grpc_port, spec.grpc_options, shed
        )
    link.say_hello()  # listening on both ports now
    # The engine reports this process's connections with its own (/metrics).
    reporter = ConnectionReporter(
        guard.statistics, link.connections, link_frames.CONNECTIONS_EVERY_S
    )
    reporter.start()
    ended = loop.create_task(link.closed.wait())
    stopped = loop.create_task(stop.wait())
    await asyncio.wait([ended, stopped], return_when=asyncio.FIRST_COMPLETED)
    server.close()
    stopping = (
        loop.create_task(grpc_server.stop(spec.shutdown_timeout))
        if grpc_server is not None
        else None
    )
    # As the one-process server stops (HttpServer.stop): every answer from now on closes
    # its connection, and a kept-alive client has a grace to send its next request and
    # read that answer before the idle connections are closed under it.
    guard.begin_closing()
    await drained(state.connections, CLOSING_GRACE_S)
    for connection in list(state.connections):
        connection.shutdown()  # idle ones close, busy ones after their answer
    await drained(state.connections, spec.shutdown_timeout + 2.0)
    for connection in list(state.connections):
        connection.transport.close()
    if stopping is not None:
        await stopping
    for task in list(state.tasks):
        task.cancel()
    reporter.stop()
    link.close()
    channel.close()
    guard.close_lingering()
    if shed is not None:
        shed.board.close()
    ended.cancel()
    stopped.cancel()


def main(argv: list[str]) -> int:
    """The process's entry: ``argv[1]`` is the spec as JSON."""
    from sordino.execution.lost_streams import keep_standard_streams

    _die_with_parent()
    keep_standard_streams(background=True)  # a reader that does not read holds no loop
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    spec = FrontendSpec(**json.loads(argv[1]))
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        run = asyncio.run
    else:
        run = uvloop.run
    try:
        run(serve(spec))
    except OSError as exc:  # a port taken, the engine's sockets gone
        log.error("front-end process ended: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv))
    sys.exit(0)
