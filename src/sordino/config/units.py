"""Sizes and durations as people write them in configuration files.

Sizes are bytes. ``KB``, ``MB``, ``GB`` and ``TB`` are powers of 1024, exactly like
``KiB``, ``MiB``, ``GiB`` and ``TiB``: a "64MB" request limit is 64 * 1024 * 1024 bytes.
Nobody sizing a buffer means 10**6, and two meanings for one spelling is a trap.
Fractions are allowed ("1.5GiB") and round down to a whole byte.

Durations are seconds (a float). Units: ``us`` (or ``µs``), ``ms``, ``s``, ``m``,
``h``, ``d``; a plain number is seconds.

:data:`Size`, :data:`Duration` and :data:`Milliseconds` are pydantic annotated types
that run these parsers before the schema's own checks, so a schema field can be
written ``max_request_size: Size``.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Annotated

from pydantic import BeforeValidator

from sordino.errors import ConfigError

__all__ = [
    "MAX_DURATION",
    "MAX_SIZE",
    "Duration",
    "Milliseconds",
    "Size",
    "parse_duration",
    "parse_size",
]

MAX_DURATION = 366 * 86_400.0
"""The longest duration any setting may give (a year): waits on threads overflow past
about 292 years, and no timeout, window or interval of a server needs more."""
MAX_SIZE = 1024**5
"""The largest size any setting may give (1 PiB); sections bound their own sizes lower."""

_SIZE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kb": 1024,
    "kib": 1024,
    "mb": 1024**2,
    "mib": 1024**2,
    "gb": 1024**3,
    "gib": 1024**3,
    "tb": 1024**4,
    "tib": 1024**4,
}

_DURATION_UNITS: dict[str, Decimal] = {
    "": Decimal(1),
    "us": Decimal("0.000001"),
    "µs": Decimal("0.000001"),
    "ms": Decimal("0.001"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
    "d": Decimal(86400),
}

# A non-negative decimal number, optional spaces, then an optional unit word.
_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zµ]*)\s*$", re.IGNORECASE)

_SIZE_FORMS = (
    "a non-negative whole number of bytes, or a number with a unit "
    "B, KB, MB, GB, TB or KiB, MiB, GiB, TiB (all powers of 1024), "
    "e.g. 512, '64MB', '1.5GiB'"
)
_DURATION_FORMS = (
    "a non-negative number of seconds, or a number with a unit us, ms, s, m, h, d, "
    "e.g. 30, '250us', '50ms', '5m'"
)


def parse_size(value: str | int) -> int:
    """Return ``value`` as a number of bytes.

    Accepts a non-negative int, or a string such as ``"512"``, ``"64MB"``, ``"1.5 GiB"``
    (unit case-insensitive, space optional, K/M/G/T units are powers of 1024).
    Raises :class:`ConfigError` naming the value and the accepted forms otherwise.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"invalid size {value!r}: expected {_SIZE_FORMS}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"invalid size {value!r}: a size cannot be negative; {_SIZE_FORMS}")
        return _at_most_max_size(value, value)
    match = _QUANTITY.match(value)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _SIZE_UNITS:
        hint = "a size cannot be negative; " if value.strip().startswith("-") else ""
        raise ConfigError(f"invalid size {value!r}: {hint}expected {_SIZE_FORMS}")
    return _at_most_max_size(value, int(Decimal(match.group(1)) * _SIZE_UNITS[unit]))


def _at_most_max_size(written: str | int, size: int) -> int:
    if size > MAX_SIZE:
        raise ConfigError(f"invalid size {written!r}: at most 1PB ({MAX_SIZE} bytes)")
    return size


def parse_duration(value: str | int | float) -> float:
    """Return ``value`` as seconds.

    Accepts a non-negative finite number (seconds), or a string such as ``"250us"``,
    ``"50ms"``, ``"30s"``, ``"5m"``, ``"1h"``, ``"1d"`` or ``"1.5"`` (seconds).
    Raises :class:`ConfigError` naming the value and the accepted forms otherwise.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"invalid duration {value!r}: expected {_DURATION_FORMS}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ConfigError(
                f"invalid duration {value!r}: a duration must be finite and not negative; "
                f"{_DURATION_FORMS}"
            )
        return _at_most_max_duration(value, float(value))
    match = _QUANTITY.match(value)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _DURATION_UNITS:
        hint = "a duration cannot be negative; " if value.strip().startswith("-") else ""
        raise ConfigError(f"invalid duration {value!r}: {hint}expected {_DURATION_FORMS}")
    return _at_most_max_duration(value, float(Decimal(match.group(1)) * _DURATION_UNITS[unit]))


def _at_most_max_duration(written: str | int | float, seconds: float) -> float:
    if seconds > MAX_DURATION:
        raise ConfigError(f"invalid duration {written!r}: at most 366d ({MAX_DURATION:.0f} s)")
    return seconds


def _is_plain_number(text: str) -> bool:
    match = _QUANTITY.match(text)
    return match is not None and match.group(2) == ""


def _validate_size(value: object) -> int:
    # pydantic only turns ValueError into a validation error, so re-raise as one.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int | str):
        raise ValueError(f"invalid size {value!r}: expected {_SIZE_FORMS}")
    try:
        return parse_size(value)
    except ConfigError as exc:
        raise ValueError(exc.message) from None


def _validate_duration(value: object) -> float:
    if not isinstance(value, int | float | str):
        raise ValueError(f"invalid duration {value!r}: expected {_DURATION_FORMS}")
    try:
        return parse_duration(value)
    except ConfigError as exc:
        raise ValueError(exc.message) from None


def _validate_milliseconds(value: object) -> float:
    # A bare number (or numeric string) already means milliseconds; a unit converts.
    try:
        if isinstance(value, str) and not _is_plain_number(value):
            return _validate_duration(value) * 1000.0
        return _validate_duration(float(value) if isinstance(value, str) else value)
    except ValueError:
        raise ValueError(
            f"invalid milliseconds {value!r}: expected a non-negative number of milliseconds, "
            "or a duration with a unit us, ms, s, m, h, d, e.g. 50, '250us', '0.1s'"
        ) from None


Size = Annotated[int, BeforeValidator(_validate_size)]
"""Bytes; accepts an int or a size string such as ``"64MB"`` (see :func:`parse_size`)."""

Duration = Annotated[float, BeforeValidator(_validate_duration)]
"""Seconds; accepts a number or a duration string such as ``"30s"`` (see :func:`parse_duration`)."""

Milliseconds = Annotated[float, BeforeValidator(_validate_milliseconds)]
"""Milliseconds; accepts a number meaning milliseconds, or a duration string ("0.1s" is 100.0)."""
