"""The one place errors become HTTP statuses and gRPC codes (Triton's mapping)."""

from __future__ import annotations

import math

from sordino.errors import (
    Cancelled,
    ConfigError,
    Conflict,
    Forbidden,
    InferenceFailed,
    InvalidRequest,
    MalformedBody,
    ModelLoadError,
    ModelResponseError,
    NotFound,
    RateLimited,
    SordinoError,
    Unauthenticated,
    Unavailable,
    Unsupported,
)

__all__ = ["grpc_code_name", "http_status", "retry_after_header"]

# A model's error response, by Triton's error code (TRITONSERVER_Error_Code: UNKNOWN,
# INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS,
# CANCELLED), as Triton 2.51 answers it over HTTP and gRPC (measured side by side:
# docs/backends.md, "Errors").
_TRITON_HTTP = (400, 500, 404, 400, 503, 501, 400, 400)
_TRITON_GRPC = (
    "UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARGUMENT", "UNAVAILABLE", "UNIMPLEMENTED",
    "ALREADY_EXISTS", "CANCELLED",
)  # fmt: skip


def http_status(error: SordinoError) -> int:
    """Return the HTTP status for ``error``."""
    if isinstance(error, ModelResponseError):
        return _TRITON_HTTP[error.code]
    if isinstance(error, MalformedBody) and error.too_large:
        return 413
    if isinstance(error, InvalidRequest | Unsupported | ModelLoadError | ConfigError):
        return 400
    if isinstance(error, NotFound):
        return 404
    if isinstance(error, Unauthenticated):
        return 401
    if isinstance(error, Forbidden):
        return 403
    if isinstance(error, Conflict):
        return 409
    if isinstance(error, RateLimited):
        return 429
    if isinstance(error, Unavailable):
        return 503
    if isinstance(error, Cancelled):
        return 499
    if isinstance(error, InferenceFailed):
        return 500
    return 500


def grpc_code_name(error: SordinoError) -> str:
    """Return the gRPC status code name (``grpc.StatusCode`` member) for ``error``."""
    if isinstance(error, ModelResponseError):
        return _TRITON_GRPC[error.code]
    if isinstance(error, MalformedBody) and error.too_large:
        return "RESOURCE_EXHAUSTED"
    if isinstance(error, InvalidRequest | ModelLoadError | ConfigError):
        return "INVALID_ARGUMENT"
    if isinstance(error, Unsupported):
        return "UNIMPLEMENTED"
    if isinstance(error, NotFound):
        return "NOT_FOUND"
    if isinstance(error, Unauthenticated):
        return "UNAUTHENTICATED"
    if isinstance(error, Forbidden):
        return "PERMISSION_DENIED"
    if isinstance(error, Conflict):
        return "ABORTED"
    if isinstance(error, RateLimited):
        return "RESOURCE_EXHAUSTED"
    if isinstance(error, Unavailable):
        return "UNAVAILABLE"
    if isinstance(error, Cancelled):
        return "CANCELLED"
    return "INTERNAL"


def retry_after_header(error: SordinoError) -> str | None:
    """Return a ``Retry-After`` value (whole seconds) when the error invites a retry."""
    seconds = getattr(error, "retry_after_s", None)
    if seconds is None:
        return None
    return str(max(1, math.ceil(seconds)))
