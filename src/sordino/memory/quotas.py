"""Per-tenant quotas on the shared-memory arena: bytes in flight, accounted to owners.

A request's staged bytes (inputs and fixed-size outputs, estimated from shapes) are
accounted to its owner — the tenant, or ``default`` — from acceptance until it ends.
A tenant with a quota that would go over it waits (first come, first served, at most
``wait_s``) for its own requests to finish, then gets :class:`RateLimited` (429).
Only that tenant waits: the others' accounts are separate, so a tenant flooding the
server cannot make another one fail. A request larger than its tenant's whole quota
can never run and is refused at once (400).

Owners are the configured tenants, ``default``, and ``other`` for every tenant
without a quota (so client-chosen names never grow the table).

The same ledger keeps the node pools (``nodes[].runtime.memory_pool``): there the
owners are models, and ``name`` says in messages which node a model is.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sordino.errors import InvalidRequest, RateLimited
from sordino.records import OwnerStatistics

__all__ = ["QuotaLedger"]

OTHER = "other"


@dataclass(slots=True)
class _Account:
    quota: int | None
    in_use: int = 0
    peak: int = 0
    waits: int = 0
    rejections: int = 0
    waiters: deque[tuple[int, asyncio.Future[None]]] = field(default_factory=deque)


class QuotaLedger:
    """Bytes in flight per owner, and the quotas that bound them."""

    def __init__(
        self,
        quotas: dict[str, int],
        *,
        wait_s: float,
        name: Callable[[str], str] = lambda owner: f"tenant {owner!r}",
        setting: str = "memory.quotas",
    ) -> None:
        """``name`` names an owner in messages, ``setting`` where its quota is set."""
        self._wait_s = wait_s
        self._name = name
        self._setting = setting
        self._accounts = {tenant: _Account(limit) for tenant, limit in quotas.items()}
        self._accounts.setdefault("default", _Account(None))
        self._accounts.setdefault(OTHER, _Account(None))

    def owner(self, tenant: str) -> str:
        """The account ``tenant`` is charged to."""
        return tenant if tenant in self._accounts else OTHER

    async def acquire(self, tenant: str, nbytes: int) -> str:
        """Charge ``nbytes`` to ``tenant``'s account, waiting for room; return the owner.

        Raises :class:`RateLimited` when the quota stays full for ``wait_s`` and
        :class:`InvalidRequest` when ``nbytes`` alone exceeds the quota.
        """
        owner = self.owner(tenant)
        account = self._accounts[owner]
        quota = account.quota
        if quota is not None and nbytes > quota:
            account.rejections += 1
            raise InvalidRequest(
                f"the request needs {nbytes} bytes of shared memory, more than the whole "
                f"quota of {self._name(owner)} ({quota} bytes, {self._setting}); send fewer "
                "rows per request or raise the quota"
            )
        if quota is None or (not account.waiters and account.in_use + nbytes <= quota):
            self._charge(account, nbytes)
            return owner
        account.waits += 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        account.waiters.append((nbytes, future))
        try:
            async with asyncio.timeout(max(self._wait_s, 0.0)):
                await future
        except BaseException as exc:
            if future.done() and not future.cancelled():
                self.release(owner, nbytes)  # room came just as the wait ended
            if not isinstance(exc, TimeoutError):
                raise
            account.rejections += 1
            raise RateLimited(
                f"{self._name(owner)} has {account.in_use} of its {quota} bytes of shared "
                f"memory ({self._setting}) in flight and this request needs {nbytes} more; "
                f"it waited {self._wait_s:g} s. Retry later or raise the quota",
                retry_after_s=max(1.0, self._wait_s),
            ) from None
        finally:
            if not future.done():
                future.cancel()
            account.waiters = deque(w for w in account.waiters if w[1] is not future)
        return owner

    def _charge(self, account: _Account, nbytes: int) -> None:
        account.in_use += nbytes
        account.peak = max(account.peak, account.in_use)

    def release(self, owner: str, nbytes: int) -> None:
        """Give ``nbytes`` back to ``owner``'s account and let its waiters in, in order."""
        account = self._accounts[owner]
        account.in_use -= nbytes
        quota = account.quota
        while account.waiters and quota is not None:
            need, future = account.waiters[0]
            if future.done():
                account.waiters.popleft()
                continue
            if account.in_use + need > quota:
                break
            account.waiters.popleft()
            self._charge(account, need)
            future.set_result(None)

    def statistics(self, *, limited_only: bool = False) -> tuple[OwnerStatistics, ...]:
        """Every account (``limited_only``: those with a quota), by owner."""
        return tuple(
            OwnerStatistics(
                owner=owner,
                in_use_bytes=a.in_use,
                peak_bytes=a.peak,
                quota_bytes=a.quota,
                waits=a.waits,
                rejections=a.rejections,
            )
            for owner, a in sorted(self._accounts.items())
            if a.quota is not None or not limited_only
        )
