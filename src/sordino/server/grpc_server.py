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
from typing import Any

import grpc

from sordino.errors import SordinoError
from sordino.protocol.status import grpc_code_name, retry_after_header
from sordino.server.grpc import SERVICE, UNSUPPORTED_RPCS, InferenceServicer, Unary
from sordino.server.grpc_accept import open_server
from sordino.server.model_control import ModelControl
from sordino.server.runtime import Runtime
from sordino.server.serve import check_port
from sordino.server.streams import peer_address
from sordino.server.tls import load_tls

__all__ = ["GrpcServer", "build_handler"]

log = logging.getLogger("sordino.grpc")

_MAX_DETAILS = 2000
"""The most bytes of an error message sent as a call's status details (see ``_details``)."""


def _guard(method: Unary) -> Unary:
    """Answer a SordinoError with its gRPC status and message; anything else is INTERNAL."""

    async def guarded(raw: bytes, context: Any) -> Any:
        try:
            return await method(raw, context)
        except SordinoError as exc:
            await _abort(context, exc)
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            log.exception("gRPC handler failed")
            await context.abort(grpc.StatusCode.INTERNAL, _details(f"{type(exc).__name__}: {exc}"))

    return guarded


async def _abort(context: Any, exc: SordinoError) -> None:
    code = getattr(grpc.StatusCode, grpc_code_name(exc))
    retry = retry_after_header(exc)
    if retry is not None:
        context.set_trailing_metadata((("retry-after", retry),))
    level = logging.ERROR if code == grpc.StatusCode.INTERNAL else logging.DEBUG
    log.log(level, "%s %s", code.name, exc)
    await context.abort(code, _details(str(exc)))


def _details(message: str) -> str:
    """Cut ``message`` to fit the status trailer (clients refuse metadata past 8 KiB).

    The trailer carries it percent-encoded, up to three bytes per byte.
    """
    encoded = message.encode("utf-8")
    if len(encoded) <= _MAX_DETAILS:
        return message
    return encoded[:_MAX_DETAILS].decode("utf-8", "ignore") + " ... (message cut)"


def _unsupported(method: str, message: str) -> Unary:
    async def refuse(raw: bytes, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method}: {message}")

    return refuse


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


def build_handler(servicer: InferenceServicer) -> Any:
    """Return the generic handler serving ``servicer`` as ``inference.GRPCInferenceService``."""
    unary = [
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
        "ModelConfig",
        "ModelStatistics",
        "RepositoryIndex",
        "RepositoryModelLoad",
        "RepositoryModelUnload",
        "SystemSharedMemoryStatus",
        "SystemSharedMemoryRegister",
        "SystemSharedMemoryUnregister",
        "CudaSharedMemoryStatus",
        "CudaSharedMemoryRegister",
        "CudaSharedMemoryUnregister",
    ]
    handlers: dict[str, Any] = {
        name: grpc.unary_unary_rpc_method_handler(
            _guard(getattr(servicer, name)), response_serializer=_serialize
        )
        for name in unary
    }

    async def stream(_requests: Any, context: Any) -> None:
        try:
            with servicer.streams.hold(peer_address(context.peer() or "")):
                await servicer.ModelStreamInfer(context)
        except SordinoError as exc:
            await _abort(context, exc)

    handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        stream, response_serializer=_serialize
    )
    for name, message in UNSUPPORTED_RPCS.items():
        handlers[name] = grpc.unary_unary_rpc_method_handler(_unsupported(name, message))
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


class GrpcServer:
    """The KServe v2 gRPC endpoint of one runtime, on grpc.aio in the running loop."""

    def __init__(self, runtime: Runtime, host: str, port: int, control: ModelControl) -> None:
        self.runtime = runtime
        self.host = host
        self._requested_port = port
        self.port = port
        self._servicer = InferenceServicer(runtime, control)
        self._server: Any = None
        self._started = False

    @property
    def address(self) -> str:
        """``host:port``, as gRPC clients take it."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def bind(self) -> None:
        """Bind the port now (serving starts with :meth:`start`).

        Raises OSError naming ``--grpc-port`` if the port is taken: checked with a
        plain socket first, so that gRPC's own error log line never shows.
        """
        if self._server is not None:
            return
        check_port(self.host, self._requested_port, flag="--grpc-port", what=" for gRPC")
        limit = self.runtime.config.server.max_request_size
        server = open_server(
            [
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", -1),
                # Without this a second server could bind the same port and steal calls.
                ("grpc.so_reuseport", 0),
                # A connection that never starts HTTP/2 is closed like a silent HTTP one.
                (
                    "grpc.server_handshake_timeout_ms",
                    max(1, round(self.runtime.config.server.header_timeout * 1000)),
                ),
            ],
            self.runtime.config.server.grpc_accept_ahead,
        )
        server.add_generic_rpc_handlers((build_handler(self._servicer),))
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
        await self._server.start()
        self._started = True

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting calls; calls in progress get ``grace_s`` seconds to finish.

        A server bound but never started gives its port back.
        """
        if self._server is not None:
            if not self._started:
                # grpc.aio releases a bound port only from a started server.
                await self._server.start()
            await self._server.stop(grace_s)
            self._server = None
            self._started = False
