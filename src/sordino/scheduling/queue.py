"""The per-model request queue: priority levels, a size limit, deadlines.

Triton semantics: priority 1 is the highest; within a level, arrival order. Items
whose deadline passed are either removed (REJECT) or kept behind the items of their
level that have not expired (DELAY). The queue never grows past ``max_size`` items.

**Fair share.** When one level holds the items of more than one tenant, a batch takes
that level's rows by weighted deficit round robin over the tenants (each round a
tenant earns ``weight`` quanta of rows and spends them on its oldest items), so a tenant
sending many times its weight gets its weight's share under contention and none
starves; a tenant with nothing queued earns nothing, so its share goes to the others
(work conserving). Priority still comes first: a level is served before the next. With
one tenant per level (the usual case) ``take`` is plain arrival order, as before.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable
from itertools import chain

from sordino.errors import QueueFull
from sordino.records import LevelQueue, QueueStatistics
from sordino.scheduling.work import Signature, WorkItem

__all__ = ["RequestQueue"]


class RequestQueue:
    """Priority-ordered work items with a hard size limit.

    The queue does no waiting of its own: the scheduler asks it for the batch to run
    and for items whose deadlines have passed.
    """

    def __init__(self, *, priority_levels: int, max_size: int, delay_expired: bool) -> None:
        if priority_levels < 1:
            raise ValueError("priority_levels must be >= 1")
        self._levels: list[deque[WorkItem]] = [deque() for _ in range(priority_levels)]
        self._delayed: list[deque[WorkItem]] = [deque() for _ in range(priority_levels)]
        # The order levels run in: delayed items of a level after that level's unexpired
        # items but before the next lower priority level, as Triton's DELAY action does.
        # A list, not a generator: walked several times a request, it costs no call.
        self._order: list[deque[WorkItem]] = [
            level for pair in zip(self._levels, self._delayed, strict=True) for level in pair
        ]
        self._deadlines: list[tuple[float, int, WorkItem]] = []
        self._queued: set[WorkItem] = set()
        self._rows = 0
        self._level_rows = [0] * priority_levels
        # Items per tenant on each level (regular and delayed): fair share only when >1.
        self._level_tenants: list[Counter[str]] = [Counter() for _ in range(priority_levels)]
        self._deficit: dict[str, float] = {}
        self._resume: str | None = None  # whose turn the last fair batch ended before
        self.max_size = max_size
        self.delay_expired = delay_expired
        self._limits: list[int] | None = None
        """Each level's own limit (0: none), where some level has one."""
        self._delays: list[bool | None] | None = None
        """Each level's own timeout action (True: DELAY; None: the queue's
        ``delay_expired``), where some level has one."""

    def set_levels(self, levels: tuple[LevelQueue | None, ...]) -> None:
        """Give levels policies of their own (``QueueSettings.levels``): a level's limit
        on its items, and its action at a deadline; () for none."""
        if not levels:
            self._limits = self._delays = None
            return
        self._limits = [0 if p is None else p.max_queue_size for p in levels]
        self._delays = [None if p is None else p.timeout_action == "DELAY" for p in levels]

    def __len__(self) -> int:
        return len(self._queued)

    @property
    def rows(self) -> int:
        """Total batch rows of every queued item."""
        return self._rows

    def rows_ahead(self, priority: int) -> int:
        """Rows queued that run before a new item of ``priority`` (its level and higher)."""
        return sum(self._level_rows[:priority])

    def put_nowait(self, item: WorkItem, *, force: bool = False) -> None:
        """Queue ``item``, or raise :class:`QueueFull` at once if the queue is at its limit.

        ``force`` queues past the limit: the next step of a request already accepted is
        never refused (the limit bounds new requests, not the work promised to them).
        """
        if len(self._queued) >= self.max_size and not force:
            raise QueueFull(
                f"the queue is full ({self.max_size} requests waiting); retry later or raise "
                "max_queue_size in the model's queue policy",
            )
        if not 1 <= item.priority <= len(self._levels):
            raise ValueError(f"priority {item.priority} outside 1..{len(self._levels)}")
        if self._limits is not None and not force:
            index = item.priority - 1
            limit = self._limits[index]
            if limit and len(self._levels[index]) + len(self._delayed[index]) >= limit:
                raise QueueFull(
                    f"the queue of priority {item.priority} is full ({limit} requests "
                    "waiting); retry later, at another priority, or raise max_queue_size "
                    f"in priority_queue_policy {item.priority}",
                )
        self._levels[item.priority - 1].append(item)
        self._queued.add(item)
        self._rows += item.rows
        self._level_rows[item.priority - 1] += item.rows
        request = item.request
        if request is not None and request.tenant:  # untenanted work costs nothing here
            self._level_tenants[item.priority - 1][request.tenant] += 1
        if item.deadline is not None:
            heapq.heappush(self._deadlines, (item.deadline, item.seq, item))

    def remove(self, item: WorkItem) -> bool:
        """Take ``item`` out of the queue (cancellation). Return False if it was not queued."""
        if item not in self._queued:
            return False
        level = (self._delayed if item.delayed else self._levels)[item.priority - 1]
        level.remove(item)
        self._forget(item)
        return True

    def next_deadline(self) -> float | None:
        """Return the earliest deadline of an item that is still queued and not yet delayed."""
        while self._deadlines:
            _, _, item = self._deadlines[0]
            if item in self._queued and not item.delayed:
                return self._deadlines[0][0]
            heapq.heappop(self._deadlines)
        return None

    def expire(self, now: float) -> list[WorkItem]:
        """Handle every item whose deadline is ``<= now``.

        Under REJECT they are removed and returned (the caller fails them); under
        DELAY they move behind the unexpired items of their level and nothing is
        returned.
        """
        rejected: list[WorkItem] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, item = heapq.heappop(self._deadlines)
            if item not in self._queued or item.delayed:
                continue
            self._levels[item.priority - 1].remove(item)
            own = None if self._delays is None else self._delays[item.priority - 1]
            if self.delay_expired if own is None else own:
                item.delayed = True
                self._delayed[item.priority - 1].append(item)
            else:
                self._forget(item)
                rejected.append(item)
        return rejected

    def oldest_arrival(self) -> float | None:
        """Return the arrival time of the longest-waiting queued item."""
        arrivals = [level[0].arrival for level in self._order if level]
        return min(arrivals) if arrivals else None

    def head(self) -> WorkItem | None:
        """Return the item that runs next: highest priority, then arrival order."""
        for level in self._order:
            if level:
                return level[0]
        return None

    def compatible_rows(self, signature: Signature, limit: int) -> int:
        """Count the rows of queued items matching ``signature``, stopping once past ``limit``."""
        total = 0
        for item in chain.from_iterable(self._order):
            if item.signature == signature:
                total += item.rows
                if total >= limit:
                    break
        return total

    def take(
        self, signature: Signature, max_rows: int, ride_along: Callable[[int], int] | None = None
    ) -> list[WorkItem]:
        """Remove and return items for one batch, in priority order.

        Takes items matching ``signature`` while their rows fit in ``max_rows``; the
        first matching item is always taken, even if it alone exceeds the limit.
        Items that do not match or do not fit stay queued in place.

        ``ride_along(rows)``: how many rows of lower priority may join a batch that
        holds ``rows`` of its first item's priority (None: as many as fit). The
        scheduler bounds them where each row costs the batch time (a CNN on a CPU),
        so a high-priority request does not wait for the low ones batched with it.
        """
        taken: list[WorkItem] = []
        rows = 0
        shared = [len(counts) > 1 for counts in self._level_tenants]
        fair = any(shared)
        first_level: int | None = None  # the priority level of the batch's first item
        for index, level in enumerate(self._order):
            if first_level is None and taken:
                first_level = (index - 1) // 2  # taken from the level iterated last
            if first_level is not None and ride_along is not None and index // 2 > first_level:
                max_rows = min(max_rows, rows + max(0, ride_along(rows)))
                ride_along = None  # bounded once, by the rows of the first level
                if rows >= max_rows:
                    break
            if fair and shared[index // 2] and level:
                rows = self._take_fair(index // 2, level, signature, max_rows, taken, rows)
                if rows >= max_rows:
                    break
                continue
            kept: list[WorkItem] = []
            while level:
                item = level.popleft()
                if item.signature == signature and (not taken or rows + item.rows <= max_rows):
                    taken.append(item)
                    rows += item.rows
                    self._forget(item)
                    if rows >= max_rows:
                        break
                else:
                    kept.append(item)
            level.extendleft(reversed(kept))
            if rows >= max_rows:
                break
        return taken

    def _take_fair(
        self,
        level_index: int,
        level: deque[WorkItem],
        signature: Signature,
        max_rows: int,
        taken: list[WorkItem],
        rows: int,
    ) -> int:
        """Take matching items of ``level`` by weighted deficit round robin; return the rows."""
        # Scan only the prefix that can matter: until every tenant on the level has a
        # batch's worth of matching rows collected (or the level ends).
        queues: dict[str, deque[WorkItem]] = {}
        collected: dict[str, int] = {}
        wanting = len(self._level_tenants[level_index])
        scanned = 0
        for item in level:
            scanned += 1
            if item.signature != signature:
                continue
            tenant = _tenant(item)
            have = collected.get(tenant, 0)
            if have >= max_rows:
                continue
            queues.setdefault(tenant, deque()).append(item)
            collected[tenant] = have + item.rows
            if have + item.rows >= max_rows:
                wanting -= 1
                if wanting <= 0:
                    break
        if not queues:
            return rows
        chosen: set[WorkItem] = set()
        active = list(queues)  # in order of each tenant's oldest item
        if self._resume in queues:
            # The round goes on where the last batch cut it: the next tenant in turn first.
            start = active.index(self._resume)
            active = active[start:] + active[:start]
        while active and rows < max_rows:
            quantum = min(queues[t][0].rows for t in active)
            for tenant in list(active):
                queue = queues[tenant]
                weight = queue[0].request.weight if queue[0].request is not None else 1
                deficit = self._deficit.get(tenant, 0.0) + weight * quantum
                while queue and queue[0].rows <= deficit:
                    item = queue[0]
                    if taken and rows + item.rows > max_rows:
                        break
                    queue.popleft()
                    deficit -= item.rows
                    taken.append(item)
                    chosen.add(item)
                    rows += item.rows
                    if rows >= max_rows:
                        break
                if not queue:
                    # An idle tenant keeps no credit: its share goes to the others.
                    self._deficit.pop(tenant, None)
                    active.remove(tenant)
                    continue
                if taken and rows + queue[0].rows > max_rows:
                    active.remove(tenant)  # its next item does not fit this batch
                self._deficit[tenant] = deficit
                if rows >= max_rows:
                    later = active[active.index(tenant) + 1 :] if tenant in active else []
                    self._resume = later[0] if later else (active[0] if active else None)
                    break
        if chosen:
            prefix = [level.popleft() for _ in range(scanned)]
            level.extendleft(reversed([item for item in prefix if item not in chosen]))
            for item in chosen:
                self._forget(item)
        return rows

    def drain(self) -> list[WorkItem]:
        """Remove and return every queued item (shutdown)."""
        items = list(chain.from_iterable(self._order))
        for level in self._order:
            level.clear()
        self._queued.clear()
        self._deadlines.clear()
        self._rows = 0
        self._level_rows = [0] * len(self._levels)
        for counts in self._level_tenants:
            counts.clear()
        return items

    def statistics(self) -> QueueStatistics:
        """Return a snapshot of the queue."""
        by_priority = tuple(
            len(a) + len(b) for a, b in zip(self._levels, self._delayed, strict=True)
        )
        return QueueStatistics(
            depth=len(self._queued),
            rows=self._rows,
            max_size=self.max_size,
            depth_by_priority=by_priority,
            oldest_arrival=self.oldest_arrival(),
        )

    def _forget(self, item: WorkItem) -> None:
        self._queued.discard(item)
        self._rows -= item.rows
        self._level_rows[item.priority - 1] -= item.rows
        request = item.request
        if request is not None and request.tenant:
            counts = self._level_tenants[item.priority - 1]
            counts[request.tenant] -= 1
            if counts[request.tenant] <= 0:
                del counts[request.tenant]


def _tenant(item: WorkItem) -> str:
    return item.request.tenant if item.request is not None else ""
