"""The gRPC server: the method table of ``inference.GRPCInferenceService`` and its
lifecycle on grpc.aio (bind, start, stop).

The RPCs themselves are :class:`~sordino.server.grpc.InferenceServicer`'s; here each
unary one is wrapped so that a :class:`SordinoError` is answered with its gRPC status
and message (``protocol/status.py``) and anything else with INTERNAL, the stream is
held against the per-client limit, and Triton's RPCs sordino does not implement are
answered UNIMPLEMENTED.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import grpc

from sordino.errors import SordinoError
from sordino.server.connection_guard import default_max_connections
from sordino.server.grpc import SERVICE, UNSUPPORTED_RPCS, InferenceServicer
from sordino.server.grpc_accept import open_server
from sordino.server.grpc_guard import UNARY_RPCS, abort_with, guard, serialize, unsupported
from sordino.server.listen import reserve_port
from sordino.server.model_control import ModelControl
from sordino.server.runtime import Runtime
from sordino.server.serve import check_port
from sordino.server.streams import peer_address
from sordino.server.tls import load_tls

__all__ = ["GrpcServer", "build_handler"]

log = logging.getLogger("sordino.grpc")


def build_handler(servicer: InferenceServicer) -> Any:
    """Return the generic handler serving ``servicer`` as ``inference.GRPCInferenceService``."""
    handlers: dict[str, Any] = {
        name: grpc.unary_unary_rpc_method_handler(
            guard(getattr(servicer, name)), response_serializer=serialize
        )
        for name in UNARY_RPCS
    }

    async def stream(_requests: Any, context: Any) -> None:
        try:
            with servicer.streams.hold(peer_address(context.peer() or "")):
                await servicer.ModelStreamInfer(context)
        except SordinoError as exc:
            await abort_with(context, exc)

    handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        stream, response_serializer=serialize
    )
    for name, message in UNSUPPORTED_RPCS.items():
        handlers[name] = grpc.unary_unary_rpc_method_handler(unsupported(name, message))
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


class GrpcServer:
    """The KServe v2 gRPC endpoint of one runtime, on grpc.aio in the running loop."""

    def __init__(self, runtime: Runtime, host: str, port: int, control: ModelControl) -> None:
        self.runtime = runtime
        self.host = host
        self._requested_port = port
        self.port = port
        self.servicer = InferenceServicer(runtime, control)
        self._server: Any = None
        self._started = False
        self._reserved: socket.socket | None = None
        from sordino.server.frontends import frontend_count  # it imports this module's users

        self.shared_port = frontend_count(runtime.config.server) > 1
        """Whether front-end processes serve this port (``SO_REUSEPORT``) instead of this
        process: then it only holds the port (``listen.reserve_port``) and its servicer
        answers the calls they forward."""

    @property
    def address(self) -> str:
        """``host:port``, as gRPC clients take it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def bind(self) -> None:
        """Bind the port now (serving starts with :meth:`start`).

        Raises OSError naming ``--grpc-port`` if the port is taken: checked with a
        plain socket first, so that gRPC's own error log line never shows. With
        front-end processes the port is only reserved: no gRPC server runs here.
        """
        if self._server is not None or self._reserved is not None:
            return
        if self.shared_port:
            self._reserved = reserve_port(
                self.host, self._requested_port, flag="--grpc-port", what=" for gRPC"
            )
            self.port = self._reserved.getsockname()[1]
            return
        check_port(self.host, self._requested_port, flag="--grpc-port", what=" for gRPC")
        settings = self.runtime.config.server
        limit = settings.max_request_size
        server = open_server(
            [
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", -1),
                # Without this a second server could bind the same port and steal calls.
                ("grpc.so_reuseport", 0),
                # A connection that never starts HTTP/2 is closed like a silent HTTP one.
                (
                    "grpc.server_handshake_timeout_ms",
                    max(1, round(settings.header_timeout * 1000)),
                ),
                # Past it gRPC core closes a new connection at once (as HTTP's 503).
                (
                    "grpc.max_allowed_incoming_connections",
                    settings.max_connections or default_max_connections(),
                ),
            ],
            self.runtime.config.server.grpc_accept_ahead,
        )
        server.add_generic_rpc_handlers((build_handler(self.servicer),))
        host = f"[{self.host}]" if ":" in self.host else self.host
        try:
            tls = load_tls(self.runtime.config.server.tls)
            address = f"{host}:{self._requested_port}"
            if tls is not None:
                port = server.add_secure_port(address, tls.grpc_credentials())
            else:
                port = server.add_insecure_port(address)
        except RuntimeError as exc:
            port = 0
            cause: Exception | None = exc
        else:
            cause = None
        if not port:
            raise OSError(
                f"cannot listen for gRPC on {self.host}:{self._requested_port}; pick another "
                "port with --grpc-port (0 picks a free one)"
            ) from cause
        self.port = port
        self._server = server

    async def start(self) -> None:
        """Start serving (binding first if :meth:`bind` was not called)."""
        self.bind()
        if self._server is None:  # front-end processes serve the port
            return
        await self._server.start()
        self._started = True

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting calls; calls in progress get ``grace_s`` seconds to finish.

        A server bound but never started gives its port back.
        """
        if self._reserved is not None:
            self._reserved.close()
            self._reserved = None
        if self._server is not None:
            if not self._started:
                # grpc.aio releases a bound port only from a started server.
                await self._server.start()
            await self._server.stop(grace_s)
            self._server = None
            self._started = False
