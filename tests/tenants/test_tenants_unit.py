"""The tenant table and its admission links, without a server (a manual clock)."""

from __future__ import annotations

import pytest

from sordino.admission.chain import AdmissionContext
from sordino.admission.tenants import BREAKER_COOLDOWN_S, BREAKER_FAILURES, Tenants
from sordino.config import load_config
from sordino.config.tenants import TenantConfig, hash_key, parse_rate
from sordino.errors import ConfigError, InvalidRequest, RateLimited, Unauthenticated, Unavailable
from sordino.inference import InferRequest
from sordino.records import QueueSettings


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _context(tenant: str, priority: int = 2) -> AdmissionContext:
    return AdmissionContext(
        model="m", settings=QueueSettings(), priority_rules={}, priority=priority, tenant=tenant
    )


REQUEST = InferRequest(model="m", inputs={})


def test_rates_parse_and_bad_ones_say_how() -> None:
    assert parse_rate("800/s") == 800
    assert parse_rate("120/min") == 2
    assert parse_rate(5) == 5
    with pytest.raises(ValueError, match="800/s"):
        parse_rate("fast")


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match="not a hashed key"):
        load_config(None, {"tenants": [{"name": "a", "keys": ["plain-text-key"]}]})
    with pytest.raises(ConfigError, match="tenant names"):
        load_config(None, {"tenants": [{"name": "a"}, {"name": "a"}]})
    key = hash_key("k" * 12)
    with pytest.raises(ConfigError, match="each key belongs to one tenant"):
        load_config(None, {"tenants": [{"name": "a", "keys": [key]}, {"name": "b", "keys": [key]}]})
    with pytest.raises(ConfigError, match="max_priority"):
        load_config(None, {"tenants": [{"name": "a", "max_priority": "urgent"}]})
    with pytest.raises(ConfigError, match="rate"):
        load_config(None, {"tenants": [{"name": "a", "rate": "lots"}]})


def test_memory_quota_feeds_the_memory_quotas() -> None:
    config = load_config(None, {"tenants": [{"name": "a", "memory_quota": "1MB"}]})
    assert config.memory_with_tenant_quotas.quota("a") == 2**20
    with pytest.raises(ConfigError, match="keep one of them"):
        load_config(
            None,
            {
                "tenants": [{"name": "a", "memory_quota": "1MB"}],
                "memory": {"quotas": [{"tenant": "a", "max": "2MB"}]},
            },
        )


def test_authenticate_and_revoke() -> None:
    tenants = Tenants([TenantConfig(name="a", keys=(hash_key("key-a-123"),))], required=False)
    assert tenants.authenticate("Bearer key-a-123") == "a"
    assert tenants.authenticate(None) == "default"
    revoked = tenants.revoke_key("a", hash_key("key-a-123")[7:19])
    assert revoked == hash_key("key-a-123")
    with pytest.raises(Unauthenticated, match="wrong or revoked"):
        tenants.authenticate("Bearer key-a-123")
    tenants.add_key("a", hash_key("key-a-456"))
    assert tenants.authenticate("Bearer key-a-456") == "a"
    with pytest.raises(InvalidRequest, match="no key of tenant 'a' starts with 'ffff'"):
        tenants.revoke_key("a", "ffff")


def test_max_priority_lowers_a_claim() -> None:
    tenants = Tenants([TenantConfig(name="a", max_priority="normal")])
    context = _context("a", priority=1)
    tenants.cap_priority(REQUEST, context)
    assert context.priority == QueueSettings().default_priority
    low = _context("a", priority=QueueSettings().priority_levels)
    tenants.cap_priority(REQUEST, low)
    assert low.priority == QueueSettings().priority_levels  # a lower claim stands


def test_concurrency_and_rate() -> None:
    clock = Clock()
    tenants = Tenants(
        [TenantConfig(name="a", max_concurrency=2), TenantConfig(name="b", rate=10.0, burst=2)],
        clock=clock,
    )
    held = [_context("a"), _context("a")]
    for context in held:
        tenants(REQUEST, context)
    with pytest.raises(RateLimited, match="max_concurrency"):
        tenants(REQUEST, _context("a"))
    tenants.finished(held[0], "success")
    tenants(REQUEST, _context("a"))
    tenants(REQUEST, _context("b"))
    tenants(REQUEST, _context("b"))
    with pytest.raises(RateLimited) as caught:
        tenants(REQUEST, _context("b"))
    assert caught.value.retry_after_s == pytest.approx(0.1)
    clock.t += 0.11
    tenants(REQUEST, _context("b"))


def test_breaker_opens_for_the_failing_tenant_only() -> None:
    clock = Clock()
    tenants = Tenants([TenantConfig(name="a"), TenantConfig(name="b")], clock=clock)
    for _ in range(BREAKER_FAILURES):
        context = _context("a")
        tenants(REQUEST, context)
        tenants.finished(context, "failure")
    with pytest.raises(Unavailable, match="breaker is open"):
        tenants(REQUEST, _context("a"))
    tenants(REQUEST, _context("b"))
    clock.t += BREAKER_COOLDOWN_S
    tenants(REQUEST, _context("a"))


def test_a_plain_key_in_the_config_is_never_echoed() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, {"auth": {"admin_keys": ["my-secret-admin-key"]}})
    assert "not a hashed key" in str(caught.value)
    assert "my-secret-admin-key" not in str(caught.value)


def test_a_tenant_called_default_limits_anonymous_requests() -> None:
    tenants = Tenants([TenantConfig(name="default", max_concurrency=1)], required=False)
    tenant = tenants.authenticate(None)
    assert tenant == "default"
    tenants(REQUEST, _context(tenant))
    with pytest.raises(RateLimited, match="max_concurrency"):
        tenants(REQUEST, _context(tenant))
