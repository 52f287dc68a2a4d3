"""How a gRPC call ends: the servicer's methods wrapped so that an error becomes the
call's status, shared by the engine's gRPC server (``server/grpc_server.py``), the
calls the front ends forward to it (``server/grpc_link.py``) and the front ends
themselves (``server/grpc_frontend.py``).

A :class:`SordinoError` is answered with its gRPC status and message
(``protocol/status.py``, with ``retry-after`` when it invites a retry), anything else
with INTERNAL; a message is cut to fit the status trailer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from sordino.errors import SordinoError
from sordino.protocol.status import grpc_code_name, retry_after_header

__all__ = ["UNARY_RPCS", "Unary", "abort_with", "details", "guard", "serialize", "unsupported"]

log = logging.getLogger("sordino.grpc")

Unary = Callable[[bytes, Any], Awaitable[Any]]

_MAX_DETAILS = 2000
"""The most bytes of an error message sent as a call's status details (see ``details``)."""


UNARY_RPCS = (
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
    "LogSettings",
    "TraceSetting",
    "SystemSharedMemoryStatus",
    "SystemSharedMemoryRegister",
    "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus",
    "CudaSharedMemoryRegister",
    "CudaSharedMemoryUnregister",
)
"""The unary RPCs the servicer implements (the stream and the unsupported ones aside)."""


def guard(method: Unary) -> Unary:
    """Answer a SordinoError with its gRPC status and message; anything else is INTERNAL."""

    async def guarded(raw: bytes, context: Any) -> Any:
        try:
            return await method(raw, context)
        except SordinoError as exc:
            await abort_with(context, exc)
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            log.exception("gRPC handler failed")
            await context.abort(grpc.StatusCode.INTERNAL, details(f"{type(exc).__name__}: {exc}"))

    return guarded


async def abort_with(context: Any, exc: SordinoError) -> None:
    """End the call with ``exc``'s gRPC status and message (and ``retry-after``)."""
    code = getattr(grpc.StatusCode, grpc_code_name(exc))
    retry = retry_after_header(exc)
    if retry is not None:
        context.set_trailing_metadata((("retry-after", retry),))
    level = logging.ERROR if code == grpc.StatusCode.INTERNAL else logging.DEBUG
    log.log(level, "%s %s", code.name, exc)
    await context.abort(code, details(str(exc)))


def details(message: str) -> str:
    """Cut ``message`` to fit the status trailer (clients refuse metadata past 8 KiB).

    The trailer carries it percent-encoded, up to three bytes per byte.
    """
    encoded = message.encode("utf-8")
    if len(encoded) <= _MAX_DETAILS:
        return message
    return encoded[:_MAX_DETAILS].decode("utf-8", "ignore") + " ... (message cut)"


def unsupported(method: str, message: str) -> Unary:
    """The handler of an RPC sordino does not implement: UNIMPLEMENTED, ``message``."""

    async def refuse(raw: bytes, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method}: {message}")

    return refuse


def serialize(message: Any) -> bytes:
    """A response's bytes, map entries in key order: the same bytes for the same message
    in every process (a front end encodes what the engine would; protobuf's own map
    order is per process)."""
    data: bytes = message.SerializeToString(deterministic=True)
    return data
