"""A result cache the guardian turns on while the network is slow (cache_recent_results).

While on for a model, the HTTP inference path answers a request whose body (and binary
header length) is byte-for-byte the same as a recent successful one with that
response, without decoding or running it. Entries live ``ttl_s`` seconds; at most
``capacity`` are kept (least recently used first out). Off, it keeps nothing and costs
one dictionary lookup per request. Only HTTP ``/infer`` requests are cached.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CachedResponse", "ResultCache"]


@dataclass(frozen=True, slots=True)
class CachedResponse:
    payload: bytes
    headers: dict[str, str]
    stored: float


class ResultCache:
    """Recent successful responses by request body, per model, while enabled."""

    def __init__(
        self,
        *,
        capacity: int = 4096,
        ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._capacity = capacity
        self._ttl = ttl_s
        self._clock = clock
        self._enabled: set[str | None] = set()
        self._entries: OrderedDict[tuple[str, str, bytes], CachedResponse] = OrderedDict()
        self.hits = 0
        self.stores = 0

    def enable(self, model: str | None, on: bool) -> None:
        """Cache ``model``'s results (None: every model) from now on, or stop and forget."""
        if on:
            self._enabled.add(model)
            return
        self._enabled.discard(model)
        if not self._enabled:
            self._entries.clear()

    def active(self, model: str) -> bool:
        return bool(self._enabled) and (model in self._enabled or None in self._enabled)

    @staticmethod
    def key(
        model: str,
        version: str | None,
        body: bytes,
        header_length: bytes | None,
        tenant: str = "",
    ) -> tuple[str, str, bytes]:
        """The entry's key; ``tenant`` keeps each tenant's results its own."""
        digest = hashlib.blake2b(body, digest_size=16)
        if header_length is not None:
            digest.update(b"|" + header_length)
        if tenant:
            digest.update(b"|tenant:" + tenant.encode())
        return (model, version or "", digest.digest())

    def get(self, key: tuple[str, str, bytes]) -> CachedResponse | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if self._clock() - entry.stored > self._ttl:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: tuple[str, str, bytes], payload: bytes, headers: dict[str, str]) -> None:
        self._entries[key] = CachedResponse(payload, dict(headers), self._clock())
        self._entries.move_to_end(key)
        self.stores += 1
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
