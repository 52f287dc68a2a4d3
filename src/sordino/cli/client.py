"""The CLI's JSON calls to a running server: GET and POST over :func:`request_json`."""

from __future__ import annotations

from typing import Any

from sordino.control.client import ServerError, ServerUnreachable, request_json

__all__ = ["ServerError", "ServerUnreachable", "get_json", "post_json"]


def get_json(
    base: str, path: str, *, timeout: float = 5.0, headers: dict[str, str] | None = None
) -> Any:
    """GET ``base + path`` and return the decoded JSON."""
    return request_json("GET", base.rstrip("/") + path, headers=headers, timeout=timeout)


def post_json(
    base: str,
    path: str,
    body: Any,
    *,
    timeout: float = 5.0,
    headers: dict[str, str] | None = None,
) -> Any:
    """POST ``body`` as JSON to ``base + path`` and return the decoded JSON answer."""
    return request_json("POST", base.rstrip("/") + path, body, headers=headers, timeout=timeout)
