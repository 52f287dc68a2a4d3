"""A bounded memo for the few values worked out again and again from what arrives.

A server sees the same request lines, targets, answer heads and JSON headers over and
over (a worker the same request facts, a front end the same queue policies); working
each out once pays. What it keeps is bounded (a client chooses the keys): at ``limit``
entries everything is forgotten at once and kept afresh — no order to maintain on the
hot path, as ``functools.lru_cache`` keeps, and a hit is a plain ``dict`` lookup in C.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["Memo"]

K = TypeVar("K")
V = TypeVar("V")


class Memo(dict[K, V]):
    """``memo[key]``: the value ``make(key)`` gave, worked out on the first miss."""

    __slots__ = ("_limit", "_make")

    def __init__(self, make: Callable[[K], V], limit: int) -> None:
        super().__init__()
        if limit < 1:
            raise ValueError("a memo keeps at least one entry")
        self._make = make
        self._limit = limit

    def __missing__(self, key: K) -> V:
        value = self._make(key)
        if len(self) >= self._limit:
            self.clear()
        self[key] = value
        return value
