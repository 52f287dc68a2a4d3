"""Who may read what over HTTP when tenants are configured (docs/security.md).

- With ``auth.required`` every endpoint wants a key — a tenant's or an admin's — except
  the health checks (``/v2/health/live``, ``/v2/health/ready``, ``/health``) and the
  dashboard's static pages (the data they fetch is behind the key). Inference and
  generate authenticate in the service (so a refusal is counted like any other); the
  rest here, answered 401 with ``WWW-Authenticate: Bearer``.
- **Isolation**: a tenant's key reads only its own tenant's series in ``/metrics``
  (``tenant="…"`` labels of other tenants are left out) and its own figures at
  ``GET /v2/tenants/me``; an admin key (or the admin token) reads everything.
"""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from sordino.admission.tenants import ADMIN_TENANT
from sordino.errors import InvalidRequest, SordinoError
from sordino.protocol.encode import encode_error, encode_json
from sordino.server.fast_infer import INFER_PATH, error_parts
from sordino.server.runtime import Runtime

__all__ = ["caller", "me_routes", "visible_metrics", "with_authentication"]

_OPEN = re.compile(r"/v2/health/(live|ready)|/health|/dashboard(/playground|/static/[^/]+)?")
_GENERATE = re.compile(r"/v2/models/[^/]+(/versions/[^/]+)?/generate(_stream)?")
_TENANT_LABEL = re.compile(rb'(?:tenant|owner)="((?:[^"\\]|\\.)*)"')


def with_authentication(app: ASGIApp, runtime: Runtime) -> ASGIApp:
    """Wrap ``app`` so that, with ``auth.required``, every endpoint but health wants a key."""
    tenants = runtime.tenants

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and tenants.required:
            path = scope["path"]
            if not (
                _OPEN.fullmatch(path) or INFER_PATH.fullmatch(path) or _GENERATE.fullmatch(path)
            ):
                authorization = None
                for name, value in scope["headers"]:
                    if name == b"authorization":
                        authorization = value.decode("latin-1")
                try:
                    tenants.authenticate(authorization)
                except SordinoError as exc:
                    await send(
                        {
                            "type": "http.response.start",
                            "status": 401,
                            "headers": [
                                (b"content-type", b"application/json"),
                                (b"www-authenticate", b"Bearer"),
                            ],
                        }
                    )
                    await send({"type": "http.response.body", "body": encode_error(str(exc))})
                    return
        await app(scope, receive, send)

    return asgi


def caller(runtime: Runtime, request: Request) -> str | None:
    """The tenant whose figures ``request`` may read, or None to read everyone's.

    None without tenants (nothing to isolate) and for an admin key or the admin token.
    Raises ``Unauthenticated`` for a wrong key.
    """
    tenants = runtime.tenants
    if not tenants.enabled:
        return None
    authorization = request.headers.get("authorization")
    if tenants.is_admin(authorization):
        return None
    return tenants.authenticate(authorization)


def visible_metrics(exposition: bytes, tenant: str | None) -> bytes:
    """``exposition`` without the series of tenants other than ``tenant`` (None: all)."""
    if tenant is None:
        return exposition
    own = tenant.encode()
    kept = []
    for line in exposition.split(b"\n"):
        match = _TENANT_LABEL.search(line) if (b"tenant=" in line or b"owner=" in line) else None
        if match is None or match[1] == own:
            kept.append(line)
    return b"\n".join(kept)


def me_routes(runtime: Runtime) -> list[Route]:
    """``GET /v2/tenants/me``: the caller's own tenant, its settings and counters."""

    async def me(request: Request) -> Response:
        try:
            tenant = caller(runtime, request)
            if tenant is None or tenant == ADMIN_TENANT:
                raise InvalidRequest(
                    "this key is an admin's (or the server has no tenants): every tenant is "
                    "at GET /v2/admin/tenants"
                )
            if tenant not in runtime.tenants.names():
                raise InvalidRequest(
                    f"tenant {tenant!r} is not configured: it has no settings or counters"
                )
        except SordinoError as exc:
            status, body, headers = error_parts(exc)
            return Response(body, status_code=status, headers=headers)
        return Response(
            encode_json(runtime.tenants.describe(tenant)), media_type="application/json"
        )

    return [Route("/v2/tenants/me", me, methods=["GET"])]
