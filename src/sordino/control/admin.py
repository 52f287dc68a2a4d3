"""The admin credential: who may use the protected endpoints, and the chaos API.

**The token.** ``server.admin_token``, else the ``SORDINO_ADMIN_TOKEN`` environment
variable; either must be at least 8 characters (a shorter variable stops start-up).
Callers send it as ``Authorization: Bearer <token>`` (gRPC: the ``authorization``
metadata).

**Protected endpoints** (model control over HTTP and gRPC, profiling, the journal, the
full telemetry view) follow one rule, :class:`AdminAccess`:

- with a token configured, every caller must send it: 401 / ``UNAUTHENTICATED`` without
  it or with a wrong one;
- without a token, a server bound to a loopback address (the default, 127.0.0.1) lets
  loopback clients in: on one machine ``sordino models`` works with no set-up, and
  nothing else can reach the port; any other caller, and every caller of a server bound
  to another address (``--host 0.0.0.0``), gets 403 / ``PERMISSION_DENIED``: the admin
  API is off until a token is set.

**Chaos** (fault injection) is stricter: it is off without a token, even on loopback,
so faults are never injected by accident. Routes (JSON bodies; a failure answers
``{"error": ...}`` with the status :mod:`sordino.protocol.status` gives the error):

- ``GET /v2/admin/chaos``: the active faults
- ``POST /v2/admin/chaos``: inject ``{"target", "fault", "rate", "latency", "duration",
  "tenant"}`` (``tenant``: only batches holding that tenant's requests)
  (``latency``/``duration`` as durations: ``"200ms"``, ``"30s"`` or seconds)
- ``DELETE /v2/admin/chaos[?id=f1]``: clear one fault or all of them
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sordino.clock import Clock
from sordino.config import MIN_TOKEN_LENGTH, ServerConfig, parse_duration
from sordino.config.tenants import AuthConfig, hash_key
from sordino.control.client import TOKEN_ENV
from sordino.errors import ConfigError, Forbidden, InvalidRequest, SordinoError, Unauthenticated
from sordino.execution.faults import FaultSpec
from sordino.protocol.status import http_status, retry_after_header

__all__ = [
    "TOKEN_ENV",
    "AdminAccess",
    "ChaosControl",
    "admin_routes",
    "admin_token",
    "exposure_refusal",
    "exposure_warning",
    "is_loopback",
]

JSON = "application/json"

Handler = Callable[[Request], Awaitable[Response]]


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
        celsius: float | None = None,
        tenant: str | None = None,
    ) -> FaultSpec: ...

    @property
    def faults(self) -> Any: ...


def admin_token(configured: str | None) -> str | None:
    """The admin token: the configured one, else the environment's, else None.

    Raises :class:`ConfigError` when ``SORDINO_ADMIN_TOKEN`` is set but shorter than the
    config key allows (an empty variable counts as unset).
    """
    if configured:
        return configured
    value = os.environ.get(TOKEN_ENV) or None
    if value is not None and len(value) < MIN_TOKEN_LENGTH:
        raise ConfigError(
            f"{TOKEN_ENV} is {len(value)} characters long; an admin token needs at least "
            f"{MIN_TOKEN_LENGTH} (the same rule as server.admin_token): set a longer one, "
            "or unset it"
        )
    return value


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    if not host:
        return False
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def exposure_warning(host: str, token: str | None) -> str | None:
    """The warning to log when ``host`` is reachable from other machines without a token."""
    if token is not None or is_loopback(host):
        return None
    return (
        f"listening on {host}, reachable from other machines, with no admin token: anyone "
        "who can reach the ports can run inference and read model metadata, statistics, "
        "/metrics, the dashboard and the public telemetry view; model control, profiling, "
        "the journal and chaos answer 403 until server.admin_token or "
        f"{TOKEN_ENV} is set. Put an authenticating proxy in front to restrict inference."
    )


def exposure_refusal(host: str, auth_required: bool, *, insecure: bool = False) -> str | None:
    """Why a server on ``host`` must not start, or None: off loopback, a key is required
    (``auth.required``) unless the operator says ``--insecure``."""
    if auth_required or insecure or is_loopback(host):
        return None
    return (
        f"refusing to listen on {host}, reachable from other machines, without "
        "auth.required: anyone who reaches the port could run inference. Set auth.required: "
        "true with tenants' keys (docs/tenants.md), bind to 127.0.0.1, or pass --insecure "
        "to serve it open anyway"
    )


class AdminAccess:
    """Decides who may call a protected endpoint (see the module's docstring).

    ``host`` is the address the server is bound to; ``loopback_without_token`` lets
    loopback clients of a loopback-bound server in when no token is set (chaos: False).
    """

    def __init__(
        self,
        token: str | None,
        host: str,
        *,
        loopback_without_token: bool = True,
        keys: Iterable[str] = (),
        tenant_key: Callable[[str], bool] | None = None,
    ):
        """``keys`` are hashed admin keys (``auth.admin_keys``); ``tenant_key`` tells a
        tenant's valid (non-admin) key, which is refused with 403 rather than 401."""
        self.token = token
        self.host = host
        self.keys = frozenset(keys)
        self._tenant_key = tenant_key
        self._loopback_rule = loopback_without_token
        self._loopback_open = (
            loopback_without_token and token is None and not self.keys and is_loopback(host)
        )

    @classmethod
    def from_config(
        cls,
        server: ServerConfig,
        auth: AuthConfig | None = None,
        tenant_key: Callable[[str], bool] | None = None,
    ) -> AdminAccess:
        """The access rule of a server configured as ``server`` (token from env too)
        and ``auth`` (its admin keys)."""
        keys = auth.admin_keys if auth is not None else ()
        return cls(admin_token(server.admin_token), server.host, keys=keys, tenant_key=tenant_key)

    @property
    def has_credentials(self) -> bool:
        """Whether an admin token or admin keys are set."""
        return self.token is not None or bool(self.keys)

    def check(self, authorization: str | None, peer: str | None, *, proxied: bool = False) -> None:
        """Return if the caller may proceed; raise Unauthenticated or Forbidden otherwise.

        ``authorization`` is the caller's ``Authorization`` value; ``peer`` its address;
        ``proxied`` says the request names a client behind a proxy (``Forwarded``,
        ``X-Forwarded-For``, ``X-Real-IP``): such a request is no loopback client, even
        when the proxy connects from loopback.
        """
        if not self.has_credentials:
            if self._loopback_open and is_loopback(peer) and not proxied:
                return
            why = (
                "without a token only loopback clients of a server bound to a loopback "
                "address may use it"
                if self._loopback_rule
                else "this part needs a token even on loopback"
            )
            raise Forbidden(f"the admin API is off: set server.admin_token or {TOKEN_ENV} ({why})")
        scheme, _, value = (authorization or "").partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer" and value:
            if self.token is not None and hmac.compare_digest(value.encode(), self.token.encode()):
                return
            if hash_key(value) in self.keys:
                return
            if self._tenant_key is not None and self._tenant_key(value):
                raise Forbidden(
                    "this key is a tenant's, not an admin's: the admin API needs an admin key "
                    "(auth.admin_keys) or the admin token"
                )
        raise Unauthenticated(
            "missing or wrong admin token: send Authorization: Bearer <token> (the "
            f"server's server.admin_token or {TOKEN_ENV}, or a key of auth.admin_keys)"
        )

    def check_request(self, request: Request) -> None:
        """:meth:`check` for an HTTP request: its header, its peer, its proxy headers."""
        headers = request.headers
        self.check(
            headers.get("authorization"),
            request.client.host if request.client is not None else None,
            proxied=any(name in headers for name in _PROXY_HEADERS),
        )

    def allows_request(self, request: Request) -> bool:
        """Whether the HTTP ``request`` may see what the protected endpoints show."""
        try:
            self.check_request(request)
        except SordinoError:
            return False
        return True

    def check_grpc(self, context: Any) -> None:
        """:meth:`check` for a gRPC call: its ``authorization`` metadata and its peer."""
        metadata: Iterable[tuple[str, Any]] = context.invocation_metadata() or ()
        pairs = [(str(key).lower(), value) for key, value in metadata]
        given = next((str(value) for key, value in pairs if key == "authorization"), None)
        proxied = any(key in _PROXY_HEADERS for key, _ in pairs)
        self.check(given, _grpc_peer_host(context.peer()), proxied=proxied)

    def protect(self, handler: Handler) -> Handler:
        """``handler`` behind :meth:`check`; a refused caller gets the error's status."""

        async def checked(request: Request) -> Response:
            try:
                self.check_request(request)
            except SordinoError as exc:
                return _refusal(exc)
            return await handler(request)

        return checked


_PROXY_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip")


def _grpc_peer_host(peer: str | None) -> str | None:
    """The address in a gRPC peer string: ``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``."""
    if not peer:
        return None
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return None  # unix sockets and others: not a loopback TCP client


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type=JSON)


def _refusal(error: SordinoError) -> Response:
    """Answer ``error`` with the status and headers the rest of the API would use."""
    headers: dict[str, str] = {}
    retry = retry_after_header(error)
    if retry is not None:
        headers["Retry-After"] = retry
    if isinstance(error, Unauthenticated):
        headers["WWW-Authenticate"] = "Bearer"
    return Response(
        orjson.dumps({"error": str(error)}),
        status_code=http_status(error),
        media_type=JSON,
        headers=headers,
    )


def _seconds(body: dict[str, Any], key: str, default: float | None) -> float | None:
    value = body.get(key)
    if value is None:
        return default
    try:
        return parse_duration(value)
    except ConfigError as exc:
        raise InvalidRequest(f"{key}: {exc}") from None


def _number(body: dict[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{key} {value!r} is not a number")
    return float(value)


def admin_routes(
    chaos: ChaosControl,
    clock: Clock,
    token: str | None,
    keys: Iterable[str] = (),
    tenant_key: Callable[[str], bool] | None = None,
) -> list[Route]:
    """The chaos API's routes, each behind the bearer token or an admin key (off without)."""
    access = AdminAccess(token, "", loopback_without_token=False, keys=keys, tenant_key=tenant_key)

    def guarded(handler: Handler) -> Handler:
        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except SordinoError as exc:
                return _refusal(exc)

        return access.protect(run)

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
        # Only a temperature fault takes a reading, and only a scoped fault a tenant:
        # other controls need not know them.
        extra: dict[str, Any] = {}
        if (celsius := _number(body, "celsius")) is not None:
            extra["celsius"] = celsius
        if body.get("tenant"):
            extra["tenant"] = str(body["tenant"])
        spec = chaos.inject_fault(
            str(body["target"]),
            str(body["fault"]),
            rate=rate,
            latency_s=_seconds(body, "latency", 0.2) or 0.0,
            duration_s=_seconds(body, "duration", None),
            **extra,
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
