"""The tenants admin API: list, add, change tenants and their keys without a restart.

Every route is a protected endpoint (an admin key or the admin token,
:class:`~sordino.control.admin.AdminAccess`); every change is journaled as an
``admin_call`` event with its outcome. A new key is made here, returned once and
stored only as its hash; the server never shows a key again.

- ``GET /v2/admin/tenants``: every tenant's settings (key ids, not hashes) and counters
- ``POST /v2/admin/tenants``: add ``{"name", "weight", "rate", ...}`` (the config keys)
- ``PATCH /v2/admin/tenants/{name}``: change weight, rate, burst, max_concurrency,
  max_priority
- ``POST /v2/admin/tenants/{name}/keys``: a new key ``{"key", "id"}`` (shown once)
- ``DELETE /v2/admin/tenants/{name}/keys/{id}``: revoke the key whose id (the start of
  its hash) is ``id``; at once, requests bearing it get 401
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sordino.admission.tenants import key_id
from sordino.config.tenants import TenantConfig, hash_key
from sordino.control.admin import AdminAccess
from sordino.errors import InvalidRequest, Unsupported
from sordino.server.openapi import documented
from sordino.server.runtime import Runtime

__all__ = ["KEY_PREFIX", "new_key", "tenant_routes"]

Handler = Callable[[Request], Awaitable[Response]]
KEY_PREFIX = "sk-"
_SETTABLE = ("weight", "rate", "burst", "max_concurrency", "max_priority", "breaker")


def new_key() -> str:
    """A new API key: ``sk-`` and 43 URL-safe characters (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidRequest("the body must be a JSON object of tenant settings")
    return document


def _invalid(exc: ValidationError) -> InvalidRequest:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in error['loc']) or 'tenant'}: {error['msg']}"
        for error in exc.errors()
    )
    return InvalidRequest(f"invalid tenant settings: {problems}")


def tenant_routes(
    runtime: Runtime, guard: Callable[[Handler], Handler], access: AdminAccess
) -> list[Route]:
    """The tenants routes, behind ``access``; ``guard`` maps errors as ``http.py`` does."""
    tenants = runtime.tenants

    @contextlib.contextmanager
    def journaled(action: str, name: str) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            runtime.events.emit(
                "admin_call",
                f"tenant:{name}",
                "tenants API",
                action=action,
                outcome=f"failed: {exc}",
            )
            raise
        runtime.events.emit(
            "admin_call", f"tenant:{name}", "tenants API", action=action, outcome="ok"
        )

    async def listing(request: Request) -> Response:
        return _json(
            {
                "auth_required": tenants.required,
                "tenants": [tenants.describe(name) for name in tenants.names()],
            }
        )

    async def add(request: Request) -> Response:
        body = await _body(request)
        name = str(body.get("name", ""))
        with journaled("add", name):
            if "keys" in body:
                raise InvalidRequest("add a tenant without keys, then `sordino tenants add-key`")
            if "memory_quota" in body:
                raise Unsupported(
                    "memory_quota cannot be set at run time (the quotas are fixed at start-up); "
                    "put it in the tenants: section of the config and restart"
                )
            try:
                config = TenantConfig.model_validate(body)
            except ValidationError as exc:
                raise _invalid(exc) from None
            tenants.add(config)
        return _json(tenants.describe(config.name), 201)

    async def change(request: Request) -> Response:
        name = request.path_params["name"]
        body = await _body(request)
        with journaled("set", name):
            unknown = sorted(set(body) - set(_SETTABLE))
            if unknown:
                raise InvalidRequest(
                    f"cannot set {', '.join(unknown)}: settable are {', '.join(_SETTABLE)} "
                    "(keys: add-key and revoke-key; memory_quota: the config file)"
                )
            try:
                tenants.update(name, body)
            except ValidationError as exc:
                raise _invalid(exc) from None
        return _json(tenants.describe(name))

    async def add_key(request: Request) -> Response:
        name = request.path_params["name"]
        with journaled("add-key", name):
            key = new_key()
            hashed = hash_key(key)
            tenants.add_key(name, hashed)
        return _json({"tenant": name, "key": key, "id": key_id(hashed)}, 201)

    async def revoke_key(request: Request) -> Response:
        name = request.path_params["name"]
        wanted = request.path_params["key_id"]
        with journaled("revoke-key", name):
            hashed = tenants.revoke_key(name, wanted)
        return _json({"tenant": name, "revoked": key_id(hashed)})

    def protected(handler: Handler) -> Handler:
        return guard(access.protect(handler))

    # The published body schemas are the models these handlers validate with.
    adding = documented(protected(add), body=TenantConfig, success=201)
    changing = documented(protected(change), body=TenantConfig, only=_SETTABLE)
    return [
        Route("/v2/admin/tenants", protected(listing), methods=["GET"]),
        Route("/v2/admin/tenants", adding, methods=["POST"]),
        Route("/v2/admin/tenants/{name}", changing, methods=["PATCH"]),
        Route(
            "/v2/admin/tenants/{name}/keys",
            documented(protected(add_key), success=201),
            methods=["POST"],
        ),
        Route("/v2/admin/tenants/{name}/keys/{key_id}", protected(revoke_key), methods=["DELETE"]),
    ]
