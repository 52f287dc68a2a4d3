"""The admin API: fault injection over HTTP, behind a bearer token.

Routes (JSON bodies; a failure answers ``{"error": ...}`` with the status that
:mod:`sordino.protocol.status` gives the error on every other endpoint):

- ``GET /v2/admin/chaos``: the active faults
- ``POST /v2/admin/chaos``: inject ``{"target", "fault", "rate", "latency", "duration"}``
  (``latency``/``duration`` as durations: ``"200ms"``, ``"30s"`` or seconds)
- ``DELETE /v2/admin/chaos[?id=f1]``: clear one fault or all of them

Every request needs ``Authorization: Bearer <token>``; the token is
``server.admin_token`` or else the ``SORDINO_ADMIN_TOKEN`` environment variable. With
neither set the admin API is disabled (403): chaos is never open by accident.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sordino.clock import Clock
from sordino.config import parse_duration
from sordino.errors import ConfigError, InvalidRequest, SordinoError
from sordino.execution.faults import FaultSpec
from sordino.protocol.status import http_status, retry_after_header

__all__ = ["TOKEN_ENV", "ChaosControl", "admin_routes", "admin_token"]

TOKEN_ENV = "SORDINO_ADMIN_TOKEN"
JSON = "application/json"


class ChaosControl(Protocol):
    """What the admin API needs from the executor."""

    def inject_fault(
        self,
        target: str,
        kind: str,
        *,
        rate: float = 1.0,
        latency_s: float = 0.2,
        duration_s: float | None = None,
    ) -> FaultSpec: ...

    @property
    def faults(self) -> Any: ...


def admin_token(configured: str | None) -> str | None:
    """The admin token: the configured one, else the environment's, else None."""
    return configured or os.environ.get(TOKEN_ENV) or None


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type=JSON)


def _error(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps({"error": message}), status_code=status, media_type=JSON, headers=headers
    )


def _refusal(error: SordinoError) -> Response:
    """Answer ``error`` with the status and ``Retry-After`` the rest of the API would use."""
    retry = retry_after_header(error)
    return _error(str(error), http_status(error), None if retry is None else {"Retry-After": retry})


def _seconds(body: dict[str, Any], key: str, default: float | None) -> float | None:
    value = body.get(key)
    if value is None:
        return default
    try:
        return parse_duration(value)
    except ConfigError as exc:
        raise InvalidRequest(f"{key}: {exc}") from None


def admin_routes(chaos: ChaosControl, clock: Clock, token: str | None) -> list[Route]:
    """The admin API's routes, each behind the bearer-token check."""

    def guarded(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def check(request: Request) -> Response:
            if token is None:
                return _error(
                    f"the admin API is disabled: set server.admin_token or {TOKEN_ENV}", 403
                )
            given = request.headers.get("authorization", "")
            scheme, _, value = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                value.strip().encode(), token.encode()
            ):
                return _error(
                    "missing or wrong admin token: send Authorization: Bearer <token>",
                    401,
                    {"WWW-Authenticate": "Bearer"},
                )
            try:
                return await handler(request)
            except SordinoError as exc:
                return _refusal(exc)

        return check

    async def list_faults(request: Request) -> Response:
        now = clock.now()
        return _json({"faults": [f.to_json(now) for f in chaos.faults.active()]})

    async def inject(request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict) or "target" not in body or "fault" not in body:
            raise InvalidRequest('send {"target": "device:NAME", "fault": "error", ...}')
        try:
            rate = float(body.get("rate", 1.0))
        except (TypeError, ValueError):
            raise InvalidRequest(f"rate {body.get('rate')!r} is not a number") from None
        spec = chaos.inject_fault(
            str(body["target"]),
            str(body["fault"]),
            rate=rate,
            latency_s=_seconds(body, "latency", 0.2) or 0.0,
            duration_s=_seconds(body, "duration", None),
        )
        return _json({"fault": spec.to_json(clock.now())}, 201)

    async def clear(request: Request) -> Response:
        removed = chaos.faults.clear(request.query_params.get("id"))
        now = clock.now()
        return _json({"cleared": [f.to_json(now) for f in removed]})

    return [
        Route("/v2/admin/chaos", guarded(list_faults), methods=["GET"]),
        Route("/v2/admin/chaos", guarded(inject), methods=["POST"]),
        Route("/v2/admin/chaos", guarded(clear), methods=["DELETE"]),
    ]
