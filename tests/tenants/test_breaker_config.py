"""Breaker settings from the config, and the half-open trial request (a manual clock)."""

from __future__ import annotations

import pytest

from sordino.admission.chain import AdmissionContext
from sordino.admission.tenants import Tenants
from sordino.config import load_config
from sordino.config.tenants import BreakerConfig
from sordino.errors import ConfigError, Unavailable
from sordino.inference import InferRequest
from sordino.records import QueueSettings

REQUEST = InferRequest(model="m", inputs={})


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _context(tenant: str) -> AdmissionContext:
    return AdmissionContext(model="m", settings=QueueSettings(), priority_rules={}, tenant=tenant)


def _fail(tenants: Tenants, tenant: str, times: int) -> None:
    for _ in range(times):
        context = _context(tenant)
        tenants(REQUEST, context)
        tenants.finished(context, "failure")


def _tenants(clock: Clock) -> Tenants:
    config = load_config(
        None,
        {
            "tenants": [
                {"name": "a", "breaker": {"failures": 2, "cooldown": "3s"}},
                {"name": "b"},
            ],
            "auth": {"breaker": {"failures": 4, "cooldown": "1m"}},
        },
    )
    return Tenants(config.tenants, breaker=config.auth.breaker, clock=clock)


def test_the_breaker_settings_load_and_default() -> None:
    config = load_config(None, {"tenants": [{"name": "a", "breaker": {"failures": 3}}]})
    assert config.tenants[0].breaker == BreakerConfig(failures=3, cooldown=10.0)
    assert config.auth.breaker == BreakerConfig()
    tenants = _tenants(Clock())
    assert tenants.breaker("a") == BreakerConfig(failures=2, cooldown=3.0)
    assert tenants.breaker("b") == BreakerConfig(failures=4, cooldown=60.0)


@pytest.mark.parametrize(
    ("breaker", "named"),
    [
        ({"failures": 0}, "failures"),
        ({"cooldown": "soon"}, "cooldown"),
        ({"cooldown": 0}, "cooldown"),
        ({"trials": 2}, "trials"),
    ],
)
def test_a_bad_breaker_setting_names_the_key(breaker: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, {"tenants": [{"name": "a", "breaker": breaker}]})
    assert f"tenants.0.breaker.{named}" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        load_config(None, {"auth": {"breaker": breaker}})
    assert f"auth.breaker.{named}" in str(caught.value)


def test_each_tenant_trips_at_its_own_count() -> None:
    clock = Clock()
    tenants = _tenants(clock)
    _fail(tenants, "a", 2)
    _fail(tenants, "b", 3)
    with pytest.raises(Unavailable, match="2 in a row"):
        tenants(REQUEST, _context("a"))
    tenants(REQUEST, _context("b"))  # b's default needs 4
    _fail(tenants, "b", 1)
    with pytest.raises(Unavailable) as caught:
        tenants(REQUEST, _context("b"))
    assert caught.value.retry_after_s == pytest.approx(60.0)


def test_after_the_cooldown_one_trial_runs_and_its_failure_reopens() -> None:
    clock = Clock()
    tenants = _tenants(clock)
    _fail(tenants, "a", 2)
    clock.t += 2.9
    with pytest.raises(Unavailable, match=r"open for 0\.1 s more"):
        tenants(REQUEST, _context("a"))
    clock.t += 0.1
    trial = _context("a")
    tenants(REQUEST, trial)
    assert trial.trial and tenants.describe("a")["breaker"] == "half_open"
    with pytest.raises(Unavailable, match="half-open: one trial request is running"):
        tenants(REQUEST, _context("a"))
    tenants.finished(trial, "failure")
    assert tenants.describe("a")["breaker"] == "open"
    with pytest.raises(Unavailable, match=r"open for 3\.0 s more"):
        tenants(REQUEST, _context("a"))


def test_a_successful_trial_closes_the_breaker() -> None:
    clock = Clock()
    tenants = _tenants(clock)
    _fail(tenants, "a", 2)
    clock.t += 3.0
    trial = _context("a")
    tenants(REQUEST, trial)
    tenants.finished(trial, "success")
    assert tenants.describe("a")["breaker"] == "closed"
    both = [_context("a"), _context("a")]
    for context in both:
        tenants(REQUEST, context)  # closed: no longer one at a time
    assert not any(c.trial for c in both)
    for context in both:
        tenants.finished(context, "success")
    _fail(tenants, "a", 1)
    tenants(REQUEST, _context("a"))  # one failure after closing: still below 2


def test_a_trial_without_a_verdict_hands_the_trial_to_the_next_request() -> None:
    clock = Clock()
    tenants = _tenants(clock)
    _fail(tenants, "a", 2)
    clock.t += 3.0
    cancelled = _context("a")
    tenants(REQUEST, cancelled)
    tenants.finished(cancelled, None)
    assert tenants.describe("a")["breaker"] == "half_open"
    second = _context("a")
    tenants(REQUEST, second)
    assert second.trial


def test_failures_of_requests_admitted_before_the_breaker_opened_do_not_extend_it() -> None:
    clock = Clock()
    tenants = _tenants(clock)
    early = _context("a")
    tenants(REQUEST, early)
    _fail(tenants, "a", 2)
    tenants.finished(early, "failure")  # still in flight when it opened: no verdict
    tenants.failed("a")  # a bad input while open: no verdict either
    clock.t += 3.0
    trial = _context("a")
    tenants(REQUEST, trial)
    assert trial.trial
