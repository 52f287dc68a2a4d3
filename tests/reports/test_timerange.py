"""Time ranges as people write them."""

from __future__ import annotations

import datetime as dt

import pytest

from sordino.reports.timerange import parse_time_range

NOW = dt.datetime(2026, 12, 1, 12, 0).timestamp()


def test_last_forms() -> None:
    assert parse_time_range("last_1h", now=NOW) == (NOW - 3600, NOW + 1)
    assert parse_time_range("last_30m", now=NOW)[0] == NOW - 1800
    assert parse_time_range("last_2d", now=NOW)[0] == NOW - 2 * 86400


def test_explicit_range_with_a_bare_end_time() -> None:
    start, end = parse_time_range("2026-12-01 10:00..11:00", now=NOW)
    assert start == dt.datetime(2026, 12, 1, 10, 0).timestamp()
    assert end - start == 3600


def test_all_starts_at_the_first_second() -> None:
    assert parse_time_range("all", now=NOW, first=5.0) == (5.0, NOW + 1)


@pytest.mark.parametrize(
    "text", ["yesterday", "2026-12-01 11:00..10:00", "2026-13-01 10:00..11:00"]
)
def test_bad_ranges_say_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="time range"):
        parse_time_range(text, now=NOW)
