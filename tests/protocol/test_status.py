"""One table maps every error to an HTTP status and a gRPC code (Triton's mapping)."""

from __future__ import annotations

import pytest

from sordino import errors
from sordino.protocol.status import grpc_code_name, http_status, retry_after_header

CASES = [
    (errors.MalformedBody("x"), 400, "INVALID_ARGUMENT"),
    (errors.MalformedBody("x", too_large=True), 413, "RESOURCE_EXHAUSTED"),
    (errors.TensorError("x"), 400, "INVALID_ARGUMENT"),
    (errors.Unsupported("x"), 400, "UNIMPLEMENTED"),
    (errors.ModelLoadError("x"), 400, "INVALID_ARGUMENT"),
    (errors.NotFound("x"), 404, "NOT_FOUND"),
    (errors.Unauthenticated("x"), 401, "UNAUTHENTICATED"),
    (errors.Forbidden("x"), 403, "PERMISSION_DENIED"),
    (errors.QueueFull("x"), 503, "UNAVAILABLE"),
    (errors.QueueTimeout("x"), 503, "UNAVAILABLE"),
    (errors.ShuttingDown("x"), 503, "UNAVAILABLE"),
    (errors.ModelNotReady("x"), 503, "UNAVAILABLE"),
    (errors.RateLimited("x"), 429, "RESOURCE_EXHAUSTED"),
    (errors.Conflict("x"), 409, "ABORTED"),
    (errors.Cancelled("x"), 499, "CANCELLED"),
    (errors.InferenceFailed("x"), 500, "INTERNAL"),
]


@pytest.mark.parametrize(
    ("error", "status", "code"), CASES, ids=[type(c[0]).__name__ for c in CASES]
)
def test_mapping(error: errors.SordinoError, status: int, code: str) -> None:
    assert http_status(error) == status
    assert grpc_code_name(error) == code


def test_retry_after_only_where_a_retry_helps() -> None:
    assert retry_after_header(errors.QueueFull("x", retry_after_s=2.5)) == "3"
    assert retry_after_header(errors.RateLimited("x")) == "1"
    assert retry_after_header(errors.TensorError("x")) is None
