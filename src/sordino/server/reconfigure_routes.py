"""HTTP endpoints of hot reconfiguration (protected: the admin token, see control/admin.py).

- ``GET /v2/sordino/config``: the live effective configuration (``sordino config show``).
- ``GET /v2/sordino/config/history``: the calls since start-up (``sordino config history``).
- ``POST /v2/sordino/config``: change it (``sordino reconfigure``). The body::

      {"set": {"scheduler.mode": "conservative"}, "config": {...partial document...},
       "dry_run": false, "rollback": true, "verify_window": "30s",
       "source": "reconfigure", "who": "alice"}

  answers the call's history entry once its verify window is over (``result``:
  ``applied``, ``rolled_back``, ``kept_worse``, ``unchanged`` or ``dry_run``); a change
  that does not validate is 400, one that needs a restart is 400 naming each key, and
  one sent while another change is being verified is 409 with Retry-After.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sordino.config import parse_duration
from sordino.config.reconfigure import MAX_VERIFY_WINDOW_S
from sordino.control.admin import AdminAccess
from sordino.errors import ConfigError, InvalidRequest
from sordino.server.reconfigure import ChangeRequest, Reconfigurer

__all__ = ["reconfigure_routes"]

Handler = Callable[[Request], Awaitable[Response]]


def _json(obj: Any) -> Response:
    return Response(orjson.dumps(obj), media_type="application/json")


def reconfigure_routes(
    reconfigurer: Reconfigurer, guard: Callable[[Handler], Handler], access: AdminAccess
) -> list[Route]:
    """The configuration routes, each behind ``access``; ``guard`` maps errors."""

    async def show(request: Request) -> Response:
        return _json(reconfigurer.show())

    async def history(request: Request) -> Response:
        return _json({"history": reconfigurer.history()})

    async def change(request: Request) -> Response:
        body = _body(await request.body())
        peer = request.client.host if request.client is not None else "?"
        who = body.get("who")
        rollback = body.get("rollback")
        return _json(
            await reconfigurer.change(
                ChangeRequest(
                    overlay=_mapping(body, "config"),
                    assignments=_mapping(body, "set"),
                    dry_run=_flag(body, "dry_run"),
                    rollback=rollback if isinstance(rollback, bool) else None,
                    verify_window_s=_window(body.get("verify_window")),
                    source=str(body.get("source") or "reconfigure"),
                    who=f"{who}@{peer}" if isinstance(who, str) and who else peer,
                )
            )
        )

    return [
        Route("/v2/sordino/config", guard(access.protect(show)), methods=["GET"]),
        Route("/v2/sordino/config", guard(access.protect(change)), methods=["POST"]),
        Route("/v2/sordino/config/history", guard(access.protect(history)), methods=["GET"]),
    ]


def _body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest('send a JSON object such as {"set": {"scheduler.mode": "manual"}}')
    return body


def _mapping(body: dict[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key) or {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{key!r} must be a JSON object, got {type(value).__name__}")
    return value


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise InvalidRequest(f"{key!r} must be true or false")
    return value


def _window(value: object) -> float | None:
    if value is None:
        return None
    try:
        seconds = parse_duration(value)  # type: ignore[arg-type]
    except ConfigError as exc:
        raise InvalidRequest(f"verify_window: {exc}") from None
    if seconds > MAX_VERIFY_WINDOW_S:
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:40]}…"
        raise InvalidRequest(
            f"verify_window: {shown} is longer than the longest window, "
            f"{MAX_VERIFY_WINDOW_S:.0f} s (1h)"
        )
    return seconds
