"""Weighted deficit round robin within a priority level (scheduling/queue.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from sordino.memory.refs import Tensors
from sordino.scheduling.queue import RequestQueue
from sordino.scheduling.work import Request, WorkItem, signature_of

INPUTS = {"x": np.zeros((1, 4), dtype=np.float32)}
SIGNATURE = signature_of(INPUTS, True)


def _item(tenant: str, weight: int, priority: int = 1, rows: int = 1) -> WorkItem:
    request = Request(
        inputs=Tensors.of(INPUTS), priority=priority, arrival=0.0, tenant=tenant, weight=weight
    )
    return WorkItem(
        inputs=INPUTS,
        rows=rows,
        signature=SIGNATURE,
        priority=priority,
        arrival=0.0,
        request=request,
    )


def _queue() -> RequestQueue:
    return RequestQueue(priority_levels=2, max_size=10_000, delay_expired=False)


def test_weights_share_a_contended_level() -> None:
    queue = _queue()
    for _ in range(400):
        queue.put_nowait(_item("a", 4))
    for _ in range(100):
        queue.put_nowait(_item("b", 1))
    counts: Counter[str] = Counter()
    for _ in range(25):  # 200 rows of 500: both still queued throughout
        counts.update(i.request.tenant for i in queue.take(SIGNATURE, 8) if i.request)
    assert sum(counts.values()) == 200
    assert 150 <= counts["a"] <= 170 and 30 <= counts["b"] <= 50, counts


def test_a_flood_does_not_starve_a_late_small_tenant() -> None:
    queue = _queue()
    for _ in range(1000):
        queue.put_nowait(_item("big", 4))
    queue.put_nowait(_item("small", 1))  # arrives behind 1000 rows
    first = queue.take(SIGNATURE, 16)
    assert "small" in {i.request.tenant for i in first if i.request}


def test_work_conserving_and_priority_first() -> None:
    queue = _queue()
    for _ in range(20):
        queue.put_nowait(_item("a", 1, priority=2))
    queue.put_nowait(_item("b", 9, priority=1))
    batch = queue.take(SIGNATURE, 8)
    # b's higher priority goes first; a, alone on its level, fills the rest.
    assert [i.request.tenant for i in batch if i.request] == ["b"] + ["a"] * 7
    assert len(queue) == 13 and queue.rows == 13


def test_one_tenant_keeps_arrival_order() -> None:
    queue = _queue()
    items = [_item("", 1) for _ in range(10)]
    for item in items:
        queue.put_nowait(item)
    assert queue.take(SIGNATURE, 4) == items[:4]
    assert queue.take(SIGNATURE, 100) == items[4:]
    assert len(queue) == 0 and queue.rows == 0
