"""The ``tenants`` and ``auth`` sections: who may call the server, and each tenant's limits.

API keys are stored hashed: ``sha256:`` and 64 hex digits (the SHA-256 of the key a
client sends as ``Authorization: Bearer <key>``). ``sordino tenants add-key`` makes a
key and prints it once; :func:`hash_key` is the one hashing rule.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field, field_validator

from sordino.config.base import Section, reject_repeated_names
from sordino.config.units import Duration, Size

__all__ = [
    "KEY_PREFIX",
    "TENANT_NAME_PATTERN",
    "AuthConfig",
    "BreakerConfig",
    "HashedKey",
    "Rate",
    "TenantConfig",
    "check_hashed_key",
    "hash_key",
    "parse_rate",
]

KEY_PREFIX = "sha256:"
TENANT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_HASHED = re.compile(r"sha256:[0-9a-f]{64}")
_RATE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*")
_PER = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0}
_PER |= {"h": 3600.0, "hour": 3600.0}


def hash_key(key: str) -> str:
    """The stored form of the API key ``key``: ``sha256:<hex digest>``."""
    return KEY_PREFIX + hashlib.sha256(key.encode("utf-8")).hexdigest()


def check_hashed_key(value: str) -> str:
    """Return ``value`` if it is a hashed key (``sha256:`` + 64 lowercase hex digits)."""
    if not isinstance(value, str) or not _HASHED.fullmatch(value):
        # Never echo the value: it may be a key in plain text.
        raise ValueError(
            "this is not a hashed key: keys are stored as 'sha256:' and 64 lowercase "
            "hex digits (the SHA-256 of the key; `sordino tenants add-key NAME` makes one), "
            "never in plain text"
        )
    return value


HashedKey = Annotated[str, AfterValidator(check_hashed_key)]


def parse_rate(value: object) -> float:
    """Requests per second from ``800/s``, ``3000/min``, ``10/h`` or a plain number (per second)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a rate")
    if isinstance(value, int | float):
        rate = float(value)
    elif isinstance(value, str) and (match := _RATE.fullmatch(value)):
        rate = float(match[1]) / _PER[match[2]]
    else:
        raise ValueError(
            f"{value!r} is not a rate: write requests per unit of time, e.g. 800/s, "
            "3000/min, 10/h (or a number of requests per second)"
        )
    if rate <= 0:
        raise ValueError(f"rate {value!r} must be above 0 (leave rate out for no limit)")
    return rate


Rate = Annotated[float, BeforeValidator(parse_rate)]
"""Requests per second, written ``800/s``, ``3000/min`` or ``10/h``."""


class BreakerConfig(Section):
    """A tenant's circuit breaker: ``failures`` in a row open it; after ``cooldown`` one
    trial request is let through (half-open), whose outcome closes or reopens it."""

    failures: int = Field(default=5, ge=1, le=1_000_000)
    """Failed requests in a row (bad inputs, model errors, timeouts, worker crashes)
    that open the breaker."""
    cooldown: Duration = Field(default=10.0, gt=0)
    """How long an open breaker answers 503 before it lets one trial request through."""


class TenantConfig(Section):
    """One tenant: its API keys, its share under contention and its limits."""

    name: str = Field(pattern=TENANT_NAME_PATTERN)
    """The tenant's name (letters, digits, ``_.-``; up to 64): metrics, journal, quotas."""
    keys: tuple[HashedKey, ...] = ()
    """Hashed API keys (``sha256:…``); a request bearing one of them is this tenant's."""
    weight: int = Field(default=1, ge=1, le=1000)
    """Its share of batch rows under contention, against the other tenants' weights."""
    rate: Rate | None = None
    """Requests per second (token bucket), e.g. ``800/s``; None: no rate limit."""
    burst: int | None = Field(default=None, ge=1)
    """The bucket's size in requests; default: one second of ``rate`` (at least 1)."""
    max_concurrency: int | None = Field(default=None, ge=1)
    """Requests of this tenant in flight at once; past it 429."""
    memory_quota: Size | None = Field(default=None, gt=0)
    """Bytes of the shared-memory arena in flight (memory.quotas, keyed by this tenant)."""
    max_priority: int | str | None = None
    """The highest priority its requests may claim (high, normal, low or a level); a
    higher claim is lowered to it."""
    breaker: BreakerConfig | None = None
    """This tenant's breaker; None: ``auth.breaker``, the default of every tenant."""

    @field_validator("max_priority")
    @classmethod
    def _priority(cls, value: int | str | None) -> int | str | None:
        if value is None:
            return None
        if isinstance(value, str) and value.strip().lower() in ("high", "normal", "low"):
            return value.strip().lower()
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        raise ValueError(
            f"max_priority {value!r} is not a priority: use high, normal, low or a level "
            "1, 2, … (1 is highest)"
        )

    @field_validator("keys")
    @classmethod
    def _keys_unique(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        reject_repeated_names(keys, what="keys", verb="are listed")
        return keys

    @property
    def bucket_size(self) -> float | None:
        """The token bucket's size: ``burst``, else one second of ``rate``."""
        if self.rate is None:
            return None
        return float(self.burst) if self.burst is not None else max(1.0, self.rate)


class AuthConfig(Section):
    """Whether requests must bear an API key, and the admin keys."""

    required: bool = False
    """true: every request needs a tenant's or an admin key (401 otherwise); false:
    a request without a key is tenant ``default``."""
    admin_keys: tuple[HashedKey, ...] = ()
    """Hashed admin keys (``sha256:…``): chaos, model control, the journal, tenants.
    ``server.admin_token`` stays a valid admin credential too."""
    breaker: BreakerConfig = BreakerConfig()
    """The breaker of every tenant that does not set its own ``breaker``."""
