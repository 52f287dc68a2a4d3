"""Accepting TLS connections with the guard's limits and a bounded handshake.

uvicorn would make the TLS layer itself, with asyncio's 60 s handshake default and no
count of pending handshakes. Here a plain listening socket accepts; each connection is
admitted (counted against ``server.max_connections`` and the per-client limit) at its
accept, its handshake must end within ``server.header_timeout``, and then the HTTP
protocol (``server/http_protocol.py``) serves the secured transport.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Protocol, cast

from sordino.server import connection_guard
from sordino.server.connection_guard import Admission, ConnectionGuard

__all__ = ["Accepted", "client_address", "tls_protocol"]


class Accepted(Protocol):
    """The HTTP protocol as a TLS accept hands it a connection."""

    admission: Admission | None
    """Set before ``connection_made``: the connection was admitted at its accept."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None: ...

    def forget(self) -> None:
        """Release what the guard counted for this connection (once)."""
        ...

    def drop(self) -> None:
        """The connection ended before it was made: break the parser's cycle."""
        ...


def tls_protocol(
    make: Callable[[], Accepted],
    guard: ConnectionGuard,
    context: ssl.SSLContext,
    handshake_timeout: float,
) -> Callable[[], asyncio.Protocol]:
    """A protocol factory for a plain listening socket that serves TLS: each connection
    is admitted (counted against the limits) when it is accepted, before its handshake,
    which must end within ``handshake_timeout``; then ``make()``'s protocol (from
    ``server/http_protocol.py``) serves it. Pending handshakes hold descriptors too."""
    return lambda: _TlsAccept(make, guard, context, handshake_timeout)


class _TlsAccept(asyncio.Protocol):
    """A TCP connection of a TLS listener until its handshake is done."""

    def __init__(
        self,
        make: Callable[[], Accepted],
        guard: ConnectionGuard,
        context: ssl.SSLContext,
        handshake_timeout: float,
    ) -> None:
        self.make = make
        self.guard = guard
        self.context = context
        self.handshake_timeout = handshake_timeout
        self.protocol: Accepted | None = None
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # the ClientHello is for the TLS layer start_tls makes
        admission = self.guard.admit(client_address(transport))
        if (
            admission.kind == "refused"
            and len(self.guard.lingering) >= connection_guard.MAX_LINGERING
        ):
            transport.abort()  # no room left even to say 503 over TLS
            return
        protocol = self.make()
        protocol.admission = admission
        if admission.kind == "refused":
            self.guard.lingering.add(transport)  # its handshake, then its 503, hold it
        self.protocol = protocol
        self.task = asyncio.get_running_loop().create_task(self._handshake(transport, protocol))

    async def _handshake(self, transport: asyncio.Transport, protocol: Accepted) -> None:
        loop = asyncio.get_running_loop()
        try:
            secured = await loop.start_tls(
                transport,
                cast(asyncio.BaseProtocol, protocol),
                self.context,
                server_side=True,
                ssl_handshake_timeout=self.handshake_timeout,
            )
        except Exception as exc:  # any failed handshake just ends the connection
            # Its traceback holds asyncio's handshake frames (the TLS objects, this
            # protocol) in a cycle with the waiter that holds it: broken, they go at once.
            exc.__traceback__ = exc.__context__ = None
            transport.abort()
            protocol.forget()
            protocol.drop()  # a cycle of bound methods
            return
        finally:
            self.guard.lingering.discard(transport)
            self.task = self.protocol = None  # no cycle through this coroutine's frame
        if secured is None or secured.is_closing():
            protocol.forget()
            return
        protocol.connection_made(secured)

    def connection_lost(self, exc: Exception | None) -> None:
        # Lost before start_tls took the transport over: nothing else will release it.
        if self.protocol is not None and self.task is not None and not self.task.done():
            self.task.cancel()
            self.protocol.forget()


def client_address(transport: asyncio.BaseTransport) -> str:
    """The peer's address as the limits count it (``unknown`` without one)."""
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
