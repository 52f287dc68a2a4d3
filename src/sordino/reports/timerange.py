"""Time ranges as people write them: ``last_1h``, ``all``, ``"2026-12-01 10:00..11:00"``."""

from __future__ import annotations

import datetime as dt
import re

__all__ = ["parse_time_range"]

_LAST = re.compile(r"^last[_ ]?(\d+(?:\.\d+)?)\s*(s|m|h|d)$", re.IGNORECASE)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_FORMATS = ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M")
_TIMES = ("%H:%M:%S", "%H:%M")


def _moment(text: str, day: dt.date | None) -> dt.datetime:
    text = text.strip()
    for fmt in _FORMATS:
        try:
            return dt.datetime.strptime(text, fmt)
        except ValueError:
            pass
    if day is not None:
        for fmt in _TIMES:
            try:
                return dt.datetime.combine(day, dt.datetime.strptime(text, fmt).time())
            except ValueError:
                pass
    raise ValueError(text)


def parse_time_range(text: str, *, now: float, first: float | None = None) -> tuple[float, float]:
    """Return ``(start, end)`` in epoch seconds for ``text``, read in local time.

    ``last_30m``, ``last_1h``, ``last_2d`` end at ``now``; ``all`` starts at
    ``first`` (the journal's first second); ``A..B`` takes two moments, and ``B``
    may be a bare time on ``A``'s day (``"2026-12-01 10:00..11:00"``).
    """
    spec = text.strip()
    if spec.lower() == "all":
        return (first if first is not None else 0.0), now + 1
    match = _LAST.match(spec)
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2).lower()], now + 1
    if ".." in spec:
        left, right = spec.split("..", 1)
        try:
            start = _moment(left, None)
            end = _moment(right, start.date())
        except ValueError as exc:
            raise ValueError(
                f"cannot read {exc.args[0]!r} in time range {text!r}: write "
                '"YYYY-MM-DD HH:MM..HH:MM" or "YYYY-MM-DD HH:MM..YYYY-MM-DD HH:MM"'
            ) from None
        if end <= start:
            raise ValueError(f"time range {text!r} ends before it starts")
        return start.timestamp(), end.timestamp()
    raise ValueError(
        f"time range {text!r} not understood: use last_30m, last_1h, last_2d, all, or "
        '"2026-12-01 10:00..11:00"'
    )
