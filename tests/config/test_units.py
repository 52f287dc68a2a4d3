"""Size and duration parsing, and the pydantic types built on it."""

from __future__ import annotations

import math

import pytest
from pydantic import TypeAdapter, ValidationError

from sordino.config.units import Duration, Milliseconds, Size, parse_duration, parse_size
from sordino.errors import ConfigError

KIB = 1024
MIB = 1024**2
GIB = 1024**3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512", 512),
        ("100B", 100),
        ("10KB", 10 * KIB),
        ("64MB", 64 * MIB),
        ("2GB", 2 * GIB),
        ("1TB", 1024 * GIB),
        ("1.5GiB", GIB + GIB // 2),
        ("64 mib", 64 * MIB),
        ("2gb", 2 * GIB),
        (" 8 KiB ", 8 * KIB),
    ],
)
def test_size_strings(text: str, expected: int) -> None:
    """Numbers with or without a unit, any case, optional space, parse to bytes."""
    assert parse_size(text) == expected


def test_size_int_is_bytes() -> None:
    """A plain int is already a number of bytes."""
    assert parse_size(4096) == 4096


def test_size_decimal_and_binary_units_are_both_powers_of_1024() -> None:
    """KB means KiB: one spelling, one meaning."""
    assert parse_size("1KB") == parse_size("1KiB") == 1024
    assert parse_size("1GB") == parse_size("1GiB")


def test_size_fraction_rounds_down_to_whole_bytes() -> None:
    """A fractional size is truncated to a whole byte."""
    assert parse_size("1.1KB") == 1126


@pytest.mark.parametrize("bad", ["-5MB", -1, "12XB", "", "MB", "1.2.3GB", "5 MB extra", True])
def test_size_refuses_garbage_naming_value_and_forms(bad: str | int) -> None:
    """Negative or unparseable sizes raise ConfigError naming the value and accepted units."""
    with pytest.raises(ConfigError) as caught:
        parse_size(bad)
    assert repr(bad) in caught.value.message
    assert "KiB" in caught.value.message


def test_size_negative_says_negative() -> None:
    """A negative size is called out as negative, not just as unparseable."""
    with pytest.raises(ConfigError, match="cannot be negative"):
        parse_size("-5MB")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("250us", 0.00025),
        ("250µs", 0.00025),
        ("50ms", 0.05),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1d", 86400.0),
        ("1.5", 1.5),
        ("10 MS", 0.01),
    ],
)
def test_duration_strings(text: str, expected: float) -> None:
    """Durations with a unit (or none, meaning seconds) parse to seconds."""
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize(("number", "expected"), [(2, 2.0), (0.25, 0.25), (0, 0.0)])
def test_duration_numbers_are_seconds(number: float, expected: float) -> None:
    """A plain number is seconds."""
    assert parse_duration(number) == expected


@pytest.mark.parametrize("bad", ["-1s", -1, math.inf, math.nan, "5 parsecs", "", "s", True])
def test_duration_refuses_garbage(bad: str | float) -> None:
    """Negative, infinite or unparseable durations raise ConfigError naming the value."""
    with pytest.raises(ConfigError) as caught:
        parse_duration(bad)
    assert repr(bad) in caught.value.message


def test_size_type_accepts_strings_and_ints() -> None:
    """The Size annotated type runs parse_size before validating an int."""
    adapter = TypeAdapter(Size)
    assert adapter.validate_python("2GB") == 2 * GIB
    assert adapter.validate_python(10) == 10


def test_size_type_reports_bad_value_as_validation_error() -> None:
    """A bad size inside a schema becomes a pydantic error carrying parse_size's message."""
    with pytest.raises(ValidationError, match="invalid size '12XB'"):
        TypeAdapter(Size).validate_python("12XB")


def test_duration_type_accepts_numbers_and_strings() -> None:
    """The Duration annotated type yields float seconds."""
    adapter = TypeAdapter(Duration)
    assert adapter.validate_python("30s") == 30.0
    assert adapter.validate_python(5) == 5.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [(50, 50.0), (2.5, 2.5), ("20", 20.0), ("50ms", 50.0), ("0.1s", 100.0), ("250us", 0.25)],
)
def test_milliseconds_type(value: object, expected: float) -> None:
    """A number means milliseconds; a duration string is converted to milliseconds."""
    assert TypeAdapter(Milliseconds).validate_python(value) == pytest.approx(expected)


def test_milliseconds_type_refuses_garbage() -> None:
    """A bad milliseconds value names itself and the accepted forms."""
    with pytest.raises(ValidationError, match="invalid milliseconds 'soon'"):
        TypeAdapter(Milliseconds).validate_python("soon")
