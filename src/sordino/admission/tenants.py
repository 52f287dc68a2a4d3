"""Tenants at admission: who a request is, and what it may do now.

:class:`Tenants` holds the tenant table (from ``tenants:`` in the config, changed at
run time by the admin API) and does four cheap things per request:

- **authenticate**: the ``Authorization: Bearer <key>`` value is hashed (SHA-256) and
  looked up among the tenants' hashed keys: the key names the tenant, whatever the
  request claims. A wrong or revoked key is 401; no key is 401 when ``auth.required``,
  else the request is tenant ``default``. Without tenants and without ``auth.required``
  nothing changes: the tenant is the one the request names (``parameters.tenant``,
  ``X-Sordino-Tenant``), as before.
- **cap the priority** (:meth:`cap_priority`, a link after the priority is resolved):
  a claim above the tenant's ``max_priority`` is lowered to it.
- **limit** (the link itself, last in the chain): at most ``max_concurrency`` requests
  in flight (429), and a token bucket of ``rate`` requests per second holding at most
  ``burst`` (429 with ``Retry-After``: when the next token comes).
- **break**: a tenant whose requests keep failing (``breaker.failures`` in a row, 5 by
  default: bad inputs, model errors, timeouts, worker crashes) gets fast 503s for
  ``breaker.cooldown`` (10 s); then the breaker is half-open: one trial request is let
  through while the others still get 503, and the trial's success closes the breaker,
  its failure opens it for another cooldown (Envoy's and Hystrix's rule). Other tenants
  are unaffected. ``tenants[].breaker`` sets a tenant's, ``auth.breaker`` the default.

A request that passed the limits holds a slot; the service gives it back with
:meth:`Tenants.finished` when the request ends, however it ends.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sordino.admission.chain import AdmissionContext, parse_priority
from sordino.config.tenants import BreakerConfig, TenantConfig, hash_key
from sordino.errors import InvalidRequest, NotFound, RateLimited, Unauthenticated, Unavailable
from sordino.inference import InferRequest
from sordino.records import TenantStatistics

__all__ = [
    "ADMIN_TENANT",
    "BREAKER_COOLDOWN_S",
    "BREAKER_FAILURES",
    "DEFAULT_TENANT",
    "Tenants",
]

DEFAULT_TENANT = "default"
ADMIN_TENANT = "admin"
"""The tenant of an inference request made with an admin key."""
BREAKER_FAILURES = BreakerConfig().failures
"""Failed requests in a row that open a tenant's breaker, by default."""
BREAKER_COOLDOWN_S = BreakerConfig().cooldown
"""How long an open breaker answers 503 before it lets a trial request through, by default."""


@dataclass(slots=True)
class _State:
    """One tenant's configuration and its live counters."""

    config: TenantConfig
    tokens: float = 0.0
    refilled: float = 0.0
    in_flight: int = 0
    failures: int = 0
    open_until: float = 0.0
    """0: closed; in the future: open; in the past: half-open (a trial may run)."""
    trial: bool = False
    """Whether the half-open breaker's one trial request is in flight."""
    refused_rate: int = 0
    refused_concurrency: int = 0
    refused_breaker: int = 0
    trips: int = 0
    requests: int = 0


@dataclass(slots=True)
class _Limits:
    tenants: dict[str, _State] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)  # hashed key -> tenant name


class Tenants:
    """The tenant table, authentication, and the per-tenant admission links."""

    def __init__(
        self,
        tenants: Sequence[TenantConfig] = (),
        *,
        required: bool = False,
        admin_keys: Iterable[str] = (),
        admin_token: str | None = None,
        breaker: BreakerConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.required = required
        self._breaker = breaker or BreakerConfig()
        self._admin_keys = frozenset(admin_keys)
        self._admin_token = admin_token
        self._clock = clock
        self._lock = threading.Lock()  # the admin API and the event loop share the table
        self._table = _Limits()
        for tenant in tenants:
            self._put(tenant)

    # -- the table -------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """Whether keys decide the tenant (tenants are configured, or keys are required)."""
        return self.required or bool(self._table.tenants)

    def names(self) -> list[str]:
        return sorted(self._table.tenants)

    def config(self, name: str) -> TenantConfig:
        state = self._table.tenants.get(name)
        if state is None:
            known = ", ".join(self.names()) or "none"
            raise NotFound(f"no tenant {name!r} (tenants: {known})")
        return state.config

    def _put(self, config: TenantConfig) -> None:
        with self._lock:
            old = self._table.tenants.get(config.name)
            state = _State(config)
            if old is not None:
                state.in_flight, state.failures = old.in_flight, old.failures
                state.open_until, state.trips = old.open_until, old.trips
                state.trial = old.trial
            state.tokens = config.bucket_size or 0.0
            state.refilled = self._clock()
            self._table.tenants[config.name] = state
            self._table.keys = {k: v for k, v in self._table.keys.items() if v != config.name}
            for key in config.keys:
                owner = self._table.keys.get(key)
                if owner is not None or key in self._admin_keys:
                    raise InvalidRequest(
                        f"key {key[:15]}… already belongs to "
                        f"{'the admins' if owner is None else repr(owner)}"
                    )
                self._table.keys[key] = config.name

    def add(self, config: TenantConfig) -> None:
        """Add a new tenant (409-like 400 when the name is taken)."""
        if config.name in self._table.tenants:
            raise InvalidRequest(
                f"tenant {config.name!r} exists; change it with `sordino tenants set`"
            )
        self._put(config)

    def update(self, name: str, changes: dict[str, Any]) -> TenantConfig:
        """Apply ``changes`` (config keys) to tenant ``name``; validated like the config file."""
        current = self.config(name)
        if "name" in changes or "keys" in changes:
            raise InvalidRequest("set cannot change name or keys; use add-key and revoke-key")
        data = current.model_dump(exclude_unset=False) | changes
        if isinstance(changes.get("breaker"), dict):
            # A partial breaker keeps the rest of the tenant's (or the default) breaker.
            base = (current.breaker or self._breaker).model_dump()
            data["breaker"] = base | changes["breaker"]
        updated = TenantConfig.model_validate(data)
        self._put(updated)
        return updated

    def add_key(self, name: str, hashed: str) -> None:
        current = self.config(name)
        self._put(current.model_copy(update={"keys": (*current.keys, hashed)}))

    def revoke_key(self, name: str, prefix: str) -> str:
        """Remove the key of ``name`` whose hash starts with ``prefix``; return its hash."""
        current = self.config(name)
        wanted = prefix if prefix.startswith("sha256:") else "sha256:" + prefix
        matches = [key for key in current.keys if key.startswith(wanted)]
        if len(matches) != 1:
            listed = ", ".join(key_id(k) for k in current.keys) or "none"
            what = "no key" if not matches else "several keys"
            verb = "starts" if not matches else "start"
            raise InvalidRequest(
                f"{what} of tenant {name!r} {verb} with {prefix!r}; its keys: {listed} (as "
                "`sordino tenants list` shows them)"
            )
        self._put(
            current.model_copy(update={"keys": tuple(k for k in current.keys if k != matches[0])})
        )
        return matches[0]

    def describe(self, name: str) -> dict[str, Any]:
        """The tenant's settings (key ids, never hashes in full) and its live counters."""
        state = self._table.tenants[name]
        config = state.config
        return {
            "name": name,
            "keys": [key_id(k) for k in config.keys],
            "weight": config.weight,
            "rate": config.rate,
            "burst": config.bucket_size,
            "max_concurrency": config.max_concurrency,
            "memory_quota": config.memory_quota,
            "max_priority": config.max_priority,
            "in_flight": state.in_flight,
            "requests": state.requests,
            "refused_rate": state.refused_rate,
            "refused_concurrency": state.refused_concurrency,
            "refused_breaker": state.refused_breaker,
            "breaker": self._breaker_state(state),
            "breaker_trips": state.trips,
            "breaker_failures": self.breaker(name).failures,
            "breaker_cooldown": self.breaker(name).cooldown,
        }

    def statistics(self) -> list[TenantStatistics]:
        """Every configured tenant's live figures (the ``/metrics`` families read these)."""
        now = self._clock()
        return [
            TenantStatistics(
                tenant=name,
                weight=state.config.weight,
                in_flight=state.in_flight,
                admitted=state.requests,
                refused_rate=state.refused_rate,
                refused_concurrency=state.refused_concurrency,
                refused_breaker=state.refused_breaker,
                breaker_open=state.open_until > now,
                breaker_trips=state.trips,
            )
            for name, state in sorted(self._table.tenants.items())
        ]

    def breaker(self, tenant: str) -> BreakerConfig:
        """The breaker settings of ``tenant``: its own, else ``auth.breaker``."""
        state = self._table.tenants.get(tenant)
        if state is None or state.config.breaker is None:
            return self._breaker
        return state.config.breaker

    def _breaker_state(self, state: _State) -> str:
        if state.open_until == 0.0:
            return "closed"
        return "open" if state.open_until > self._clock() else "half_open"

    def weight(self, tenant: str) -> int:
        state = self._table.tenants.get(tenant)
        return state.config.weight if state is not None else 1

    # -- credentials -----------------------------------------------------------------

    def is_admin(self, authorization: str | None) -> bool:
        """Whether ``authorization`` bears an admin key or the admin token."""
        key = _bearer(authorization)
        if key is None:
            return False
        if self._admin_token is not None and hmac.compare_digest(
            key.encode(), self._admin_token.encode()
        ):
            return True
        return hash_key(key) in self._admin_keys

    def is_tenant_key(self, key: str) -> bool:
        """Whether ``key`` (in plain text) is a tenant's current key."""
        return hash_key(key) in self._table.keys

    def authenticate(self, authorization: str | None) -> str:
        """The tenant ``authorization`` names; raises :class:`Unauthenticated`."""
        key = _bearer(authorization)
        if key is None:
            if authorization:
                raise Unauthenticated(
                    "the Authorization header is not 'Bearer <key>': send your API key as "
                    "Authorization: Bearer <key>"
                )
            if self.required:
                raise Unauthenticated(
                    "this server requires an API key: send Authorization: Bearer <key> "
                    "(gRPC: the authorization metadata)"
                )
            return DEFAULT_TENANT
        tenant = self._table.keys.get(hash_key(key))
        if tenant is not None:
            return tenant
        if self.is_admin(authorization):
            return ADMIN_TENANT
        raise Unauthenticated("the API key is wrong or revoked: ask an admin for a valid key")

    # -- admission links -------------------------------------------------------------

    def cap_priority(self, request: InferRequest, context: AdmissionContext) -> None:
        """Lower a priority claimed above the tenant's ``max_priority`` to it."""
        state = self._table.tenants.get(context.tenant)
        if state is None or state.config.max_priority is None:
            return
        cap = parse_priority(state.config.max_priority, context.settings, "max_priority")
        if context.priority < cap:
            context.priority = cap

    def __call__(self, request: InferRequest, context: AdmissionContext) -> None:
        """The limits link: breaker, concurrency, rate; on success the request holds a slot."""
        state = self._table.tenants.get(context.tenant)
        if state is None:
            return
        config = state.config
        now = self._clock()
        trial = False
        if state.open_until > now:
            state.refused_breaker += 1
            failures = self.breaker(context.tenant).failures
            error = Unavailable(
                f"tenant {context.tenant!r}'s requests kept failing ({failures} in a "
                f"row): its breaker is open for {state.open_until - now:.1f} s more; fix "
                "the requests and retry then"
            )
            error.retry_after_s = state.open_until - now
            raise error
        if state.open_until:  # half-open: one trial request tells whether to close
            if state.trial:
                state.refused_breaker += 1
                error = Unavailable(
                    f"tenant {context.tenant!r}'s breaker is half-open: one trial request is "
                    "running, and its outcome closes or reopens the breaker; retry shortly"
                )
                error.retry_after_s = 1.0
                raise error
            trial = True
        if config.max_concurrency is not None and state.in_flight >= config.max_concurrency:
            state.refused_concurrency += 1
            raise RateLimited(
                f"tenant {context.tenant!r} has {state.in_flight} requests in flight, its "
                f"max_concurrency; wait for one to finish",
                retry_after_s=1.0,
            )
        if config.rate is not None:
            size = config.bucket_size or 1.0
            tokens = min(size, state.tokens + (now - state.refilled) * config.rate)
            state.refilled = now
            if tokens < 1.0:
                state.tokens = tokens
                state.refused_rate += 1
                raise RateLimited(
                    f"tenant {context.tenant!r} is over its rate of {config.rate:g} requests/s "
                    f"(burst {size:g}); retry after the Retry-After seconds",
                    retry_after_s=(1.0 - tokens) / config.rate,
                )
            state.tokens = tokens - 1.0
        state.in_flight += 1
        state.requests += 1
        context.slot = True
        if trial:
            state.trial = context.trial = True

    def finished(self, context: AdmissionContext, outcome: str | None) -> None:
        """Give back the request's slot and feed its outcome to the tenant's breaker."""
        if not context.slot:
            return
        context.slot = False
        state = self._table.tenants.get(context.tenant)
        if state is None:
            return
        state.in_flight = max(0, state.in_flight - 1)
        if context.trial:
            context.trial = state.trial = False
            if outcome == "success":
                state.open_until, state.failures = 0.0, 0
            elif outcome == "failure":
                self._open(state)
            # Cancelled or refused later: no verdict; the next request is the trial.
        elif outcome == "success":
            state.failures = 0
        elif outcome == "failure" and not state.open_until:
            self._failed(state)

    def failed(self, tenant: str) -> None:
        """Count a request of ``tenant`` refused for its own mistake (a bad input)."""
        state = self._table.tenants.get(tenant)
        if state is not None and not state.open_until:
            self._failed(state)

    def _failed(self, state: _State) -> None:
        state.failures += 1
        if state.failures >= self.breaker(state.config.name).failures:
            self._open(state)

    def _open(self, state: _State) -> None:
        state.failures = 0
        state.trips += 1
        state.open_until = self._clock() + self.breaker(state.config.name).cooldown


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    value = value.strip()
    if scheme.lower() != "bearer" or not value:
        return None
    return value


def key_id(hashed: str) -> str:
    """A short, public name of a hashed key: its first 12 hex digits."""
    return hashed.removeprefix("sha256:")[:12]
