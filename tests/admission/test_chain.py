"""Admission links: priority by number, name or tag; deadlines capped by policy."""

from __future__ import annotations

import time

import numpy as np
import pytest

from sordino.admission.chain import (
    AdmissionChain,
    AdmissionContext,
    choose_priority,
    choose_timeout,
    default_links,
)
from sordino.errors import InvalidRequest, QueueTimeout, Unsupported
from sordino.inference import InferRequest
from sordino.records import LevelQueue, QueueSettings

RULES = {"premium_user": "high", "batch_job": "low", "vip": 1}


def _admit(params: dict[str, object], headers: dict[str, str] | None = None,
           settings: QueueSettings | None = None) -> AdmissionContext:  # fmt: skip
    request = InferRequest(
        model="m", inputs={"x": np.zeros((1, 1))}, parameters=params, headers=headers or {}
    )
    settings = settings or QueueSettings()
    context = AdmissionContext(model="m", settings=settings, priority_rules=RULES)
    return AdmissionChain(default_links()).admit(request, context)


@pytest.mark.parametrize(
    ("params", "expected"),
    [({}, 2), ({"priority": 1}, 1), ({"priority": 0}, 2), ({"priority": "high"}, 1),
     ({"priority": "low"}, 3), ({"priority": "normal"}, 2), ({"priority": "3"}, 3)],
)  # fmt: skip
def test_priority_from_parameter(params: dict[str, object], expected: int) -> None:
    assert _admit(params).priority == expected


def test_priority_from_tag_parameter() -> None:
    assert _admit({"tag": "premium_user"}).priority == 1
    assert _admit({"tag": "batch_job"}).priority == 3
    assert _admit({"tag": "vip"}).priority == 1


def test_priority_from_tag_header() -> None:
    assert _admit({}, headers={"x-sordino-tag": "batch_job"}).priority == 3


def test_explicit_priority_beats_tag() -> None:
    assert _admit({"priority": 3, "tag": "premium_user"}).priority == 3


def test_unknown_tag_gets_default() -> None:
    assert _admit({"tag": "nobody"}).priority == 2


@pytest.mark.parametrize("value", [4, -1, "urgent", 1.5, True])
def test_bad_priority_is_refused(value: object) -> None:
    with pytest.raises(InvalidRequest, match="priorit"):
        _admit({"priority": value})


@pytest.mark.parametrize(
    "value", ["9" * 5000, "-" + "9" * 5000, "²", "٣", "--3", "+-3", "3.0", "0x3", ""]
)
def test_priority_strings_that_are_not_small_integers_are_refused(value: str) -> None:
    """Thousands of digits, non-ASCII digits and odd signs are a 400, never a crash."""
    with pytest.raises(InvalidRequest, match="priorit") as info:
        _admit({"priority": value})
    assert len(str(info.value)) < 300  # the value is shown cut short


@pytest.mark.parametrize(("value", "expected"), [("0" * 5000 + "3", 3), (" +1 ", 1), ("-0", 2)])
def test_priority_strings_with_padding_are_read(value: str, expected: int) -> None:
    assert _admit({"priority": value}).priority == expected


def test_timeout_from_parameter_in_microseconds() -> None:
    assert _admit({"timeout": 250_000}).timeout_s == pytest.approx(0.25)
    assert _admit({}).timeout_s is None


def test_timeout_capped_by_default() -> None:
    settings = QueueSettings(default_timeout_s=0.1)
    assert _admit({"timeout": 5_000_000}, settings=settings).timeout_s == pytest.approx(0.1)
    assert _admit({"timeout": 50_000}, settings=settings).timeout_s == pytest.approx(0.05)
    assert _admit({}, settings=settings).timeout_s == pytest.approx(0.1)


def test_timeout_override_can_be_disallowed() -> None:
    settings = QueueSettings(default_timeout_s=0.1, allow_timeout_override=False)
    assert _admit({"timeout": 50_000}, settings=settings).timeout_s == pytest.approx(0.1)


def test_bad_timeout_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="microseconds"):
        _admit({"timeout": "soon"})


def test_sequence_batching_is_not_supported() -> None:
    with pytest.raises(Unsupported, match="sequence"):
        _admit({"sequence_id": 4})
    assert _admit({"sequence_id": 0}).priority == 2


def test_priority_from_priority_header() -> None:
    assert _admit({}, {"x-sordino-priority": "low"}).priority == 3
    assert _admit({}, {"x-sordino-priority": "1"}).priority == 1


def test_priority_parameter_beats_header_and_header_beats_tag() -> None:
    assert _admit({"priority": "high"}, {"x-sordino-priority": "low"}).priority == 1
    headers = {"x-sordino-priority": "low", "x-sordino-tag": "premium_user"}
    assert _admit({}, headers).priority == 3


def test_bad_priority_header_is_refused_naming_the_header() -> None:
    with pytest.raises(InvalidRequest, match="x-sordino-priority"):
        _admit({}, {"x-sordino-priority": "urgent"})


def test_timeout_from_header_in_microseconds_when_no_parameter() -> None:
    assert _admit({}, {"x-sordino-timeout": "250000"}).timeout_s == 0.25
    assert _admit({"timeout": 100_000}, {"x-sordino-timeout": "250000"}).timeout_s == 0.1


@pytest.mark.parametrize("value", ["-5", "1.5", "soon", "9" * 40])
def test_bad_timeout_header_is_refused(value: str) -> None:
    with pytest.raises(InvalidRequest, match="x-sordino-timeout"):
        _admit({}, {"x-sordino-timeout": value})


@pytest.mark.parametrize(
    "headers",
    [{}, {"x-sordino-priority": "low"}, {"x-sordino-tag": "premium_user"},
     {"x-sordino-timeout": "250000"}, {"x-sordino-priority": "1", "x-sordino-timeout": "0"}],
)  # fmt: skip
def test_the_header_rules_are_the_admissions(headers: dict[str, str]) -> None:
    """What the headers alone decide (early_shed, before the body) is what admission
    decides for a body without parameters: one rule, applied in both places."""
    settings = QueueSettings(default_timeout_s=1.0)
    admitted = _admit({}, headers, settings)
    assert admitted.priority == choose_priority(
        settings,
        RULES,
        header=headers.get("x-sordino-priority"),
        tag=headers.get("x-sordino-tag"),
    )
    assert admitted.timeout_s == choose_timeout(settings, header=headers.get("x-sordino-timeout"))


def test_the_deadline_counts_from_arrival() -> None:
    settings = QueueSettings(default_timeout_s=0.5)
    request = InferRequest(model="m", inputs={}, received_at=time.monotonic() - 0.2)
    context = AdmissionContext(model="m", settings=settings, priority_rules=RULES)
    AdmissionChain(default_links()).admit(request, context)
    assert context.timeout_s is not None and 0 < context.timeout_s <= 0.3
    late = InferRequest(model="m", inputs={}, received_at=time.monotonic() - 0.6)
    with pytest.raises(QueueTimeout, match="waited"):
        AdmissionChain(default_links()).admit(late, context)


def test_a_level_with_its_own_policy_has_its_own_deadline() -> None:
    """Triton's priority_queue_policy: the request's level's default timeout and override
    rule; the model's for the other levels."""
    settings = QueueSettings(
        default_timeout_s=1.0,
        allow_timeout_override=True,
        levels=(None, None, LevelQueue(default_timeout_s=0.2, allow_timeout_override=False)),
    )
    assert _admit({"priority": 3}, settings=settings).timeout_s == pytest.approx(0.2, abs=0.01)
    assert _admit({"priority": 3, "timeout": 100_000}, settings=settings).timeout_s == (
        pytest.approx(0.2, abs=0.01)
    )  # the level allows no override
    assert _admit({"priority": 1, "timeout": 100_000}, settings=settings).timeout_s == (
        pytest.approx(0.1, abs=0.01)
    )
    assert _admit({"priority": 2}, settings=settings).timeout_s == pytest.approx(1.0, abs=0.01)
