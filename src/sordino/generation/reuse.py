"""Reuse of generation work: exact results (per tenant, LRU), identical requests in flight,
and cached intermediate states (approximate reuse, in the style of NIRVANA).

- :class:`ResultCache`: a finished image for (model version, condition, seed, steps,
  guidance, sampler) is the same bytes every time, so it is kept, bounded, per tenant.
- :class:`InFlight`: an identical request that arrives while the first still runs
  waits for that one's result instead of running its own.
- :class:`StateCache`: the clean-sample estimate a generation reached after a share of
  its schedule, per condition; a later request for the same condition starts there
  (re-noised with its own seed) and skips those steps.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

__all__ = ["Generated", "InFlight", "ResultCache", "ReusePolicy", "StateCache"]


@dataclass(frozen=True, slots=True)
class Generated:
    """A finished generation: the image, its PNG and how many steps it ran."""

    image: npt.NDArray[np.uint8]
    png: bytes
    steps_used: int
    steps_requested: int
    seed: int
    degraded: bool = False
    reused_steps: int = 0
    cached_steps: int = 0
    """Steps that reused the previous step's prediction (the step cache): no model call."""
    sample: npt.NDArray[np.float32] | None = None
    """The final sample before it became an image (for quality checks and tests)."""
    pngs: tuple[bytes, ...] = ()
    """With several images (a Stable Diffusion request's ``num_images``): each one's PNG."""


ReusePolicy = Literal["lru", "lfu", "largest"]
"""What a full cache gives back first (``memory.reuse_strategy``): the least recently
used entry, the least frequently used one (ties: the least recently used), or the
largest one (ties: the least recently used)."""


def _victim(entries: OrderedDict[Hashable, Any], uses: dict[Hashable, int],
            policy: str, nbytes: Callable[[Any], int]) -> Hashable:  # fmt: skip
    """The key ``policy`` evicts from ``entries`` (kept in least recently used order)."""
    keys: list[Hashable] = list(entries)
    if policy == "lfu":
        return min(keys, key=lambda k: uses.get(k, 0))  # min keeps the first (LRU) tie
    if policy == "largest":
        return max(keys, key=lambda k: int(nbytes(entries[k])))  # max keeps the first tie
    return keys[0]


def _generated_bytes(value: Generated) -> int:
    return (
        int(value.image.nbytes)
        + len(value.png)
        + (int(value.sample.nbytes) if value.sample is not None else 0)
    )


class ResultCache:
    """Exact results, at most ``entries`` per tenant; ``policy`` says which goes first
    (least recently used by default)."""

    def __init__(self, entries: int, policy: ReusePolicy = "lru") -> None:
        self.entries = entries
        self.policy = policy
        self._tenants: dict[str, OrderedDict[Hashable, Generated]] = {}
        self._uses: dict[tuple[str, Hashable], int] = {}
        self.hits = self.misses = 0
        self.evictions = 0

    def get(self, tenant: str, key: Hashable) -> Generated | None:
        if self.entries <= 0:
            return None
        entries = self._tenants.get(tenant)
        found = entries.get(key) if entries is not None else None
        if found is None or entries is None:
            self.misses += 1
            return None
        entries.move_to_end(key)
        self._uses[(tenant, key)] = self._uses.get((tenant, key), 0) + 1
        self.hits += 1
        return found

    def put(self, tenant: str, key: Hashable, value: Generated) -> None:
        if self.entries <= 0:
            return
        entries = self._tenants.setdefault(tenant, OrderedDict())
        while key not in entries and len(entries) >= self.entries:
            uses = {k: self._uses.get((tenant, k), 0) for k in entries}
            victim = _victim(entries, uses, self.policy, _generated_bytes)
            del entries[victim]
            self._uses.pop((tenant, victim), None)
            self.evictions += 1
        entries[key] = value
        entries.move_to_end(key)

    def size(self, tenant: str) -> int:
        return len(self._tenants.get(tenant, ()))


class InFlight:
    """Generations running now, by key: identical requests wait for the first one."""

    def __init__(self) -> None:
        self._running: dict[Hashable, asyncio.Future[Generated]] = {}
        self.coalesced = 0

    def join(self, key: Hashable) -> asyncio.Future[Generated] | None:
        """The running generation for ``key`` to wait for, or None (then :meth:`lead`)."""
        future = self._running.get(key)
        if future is not None and not future.done():
            self.coalesced += 1
            return future
        return None

    def lead(self, key: Hashable) -> asyncio.Future[Generated]:
        future: asyncio.Future[Generated] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        return future

    def settle(self, key: Hashable, future: asyncio.Future[Generated], result: Any) -> None:
        """End the lead of ``key``: a :class:`Generated`, or the exception that ended it."""
        if self._running.get(key) is future:
            del self._running[key]
        if future.done():
            return
        if isinstance(result, Generated):
            future.set_result(result)
        else:
            future.set_exception(result)
            future.exception()  # retrieved: nobody may be waiting


class StateCache:
    """Intermediate clean-sample estimates by key (condition, guidance, sampler);
    ``policy`` says which goes first when full (least recently used by default)."""

    def __init__(self, entries: int, policy: ReusePolicy = "lru") -> None:
        self.entries = entries
        self.policy = policy
        self._states: OrderedDict[Hashable, npt.NDArray[np.float32]] = OrderedDict()
        self._uses: dict[Hashable, int] = {}
        self.hits = self.misses = 0
        self.steps_saved = 0
        self.evictions = 0

    def get(self, key: Hashable) -> npt.NDArray[np.float32] | None:
        found = self._states.get(key)
        if found is None:
            self.misses += 1
            return None
        self._states.move_to_end(key)
        self._uses[key] = self._uses.get(key, 0) + 1
        self.hits += 1
        return found

    def put(self, key: Hashable, x0: npt.NDArray[np.float32]) -> None:
        while key not in self._states and self._states and len(self._states) >= self.entries:
            victim = _victim(self._states, self._uses, self.policy, lambda a: int(a.nbytes))
            del self._states[victim]
            self._uses.pop(victim, None)
            self.evictions += 1
        self._states[key] = np.array(x0, dtype=np.float32, copy=True)
        self._states.move_to_end(key)
