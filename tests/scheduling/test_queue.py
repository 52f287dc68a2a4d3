"""RequestQueue: priority order, limits, deadlines, batch extraction."""

from __future__ import annotations

import numpy as np
import pytest

from sordino.errors import QueueFull
from sordino.records import LevelQueue
from sordino.scheduling.queue import RequestQueue
from sordino.scheduling.work import WorkItem, signature_of


def _item(
    priority: int = 2,
    rows: int = 1,
    width: int = 4,
    arrival: float = 0.0,
    deadline: float | None = None,
) -> WorkItem:
    inputs = {"x": np.zeros((rows, width), dtype=np.float32)}
    return WorkItem(
        inputs=inputs,
        rows=rows,
        signature=signature_of(inputs, True),
        priority=priority,
        arrival=arrival,
        deadline=deadline,
    )


def _queue(max_size: int = 100, delay: bool = False) -> RequestQueue:
    return RequestQueue(priority_levels=3, max_size=max_size, delay_expired=delay)


def test_high_priority_jumps_queue() -> None:
    q = _queue()
    low, high = _item(priority=3), _item(priority=1)
    q.put_nowait(low)
    q.put_nowait(high)
    assert q.head() is high
    assert q.take(high.signature, 1) == [high]
    assert q.take(low.signature, 1) == [low]


def test_same_priority_keeps_arrival_order() -> None:
    q = _queue()
    items = [_item() for _ in range(5)]
    for item in items:
        q.put_nowait(item)
    assert q.take(items[0].signature, 5) == items


def test_full_queue_refuses_at_once() -> None:
    q = _queue(max_size=2)
    q.put_nowait(_item())
    q.put_nowait(_item())
    with pytest.raises(QueueFull, match="queue is full"):
        q.put_nowait(_item())
    assert len(q) == 2


def test_take_skips_items_with_other_shapes() -> None:
    q = _queue()
    a1, other, a2 = _item(width=4), _item(width=8), _item(width=4)
    for item in (a1, other, a2):
        q.put_nowait(item)
    assert q.take(a1.signature, 10) == [a1, a2]
    assert q.head() is other
    assert len(q) == 1


def test_take_respects_row_limit_but_always_takes_head() -> None:
    q = _queue()
    big, small = _item(rows=5), _item(rows=1)
    q.put_nowait(big)
    q.put_nowait(small)
    assert q.take(big.signature, 3) == [big]
    assert q.rows == 1


def test_take_does_not_split_past_limit() -> None:
    q = _queue()
    items = [_item(rows=2) for _ in range(3)]
    for item in items:
        q.put_nowait(item)
    assert q.take(items[0].signature, 5) == items[:2]


def test_expire_rejects_past_deadline() -> None:
    q = _queue()
    late, fine = _item(deadline=1.0), _item(deadline=5.0)
    q.put_nowait(late)
    q.put_nowait(fine)
    assert q.next_deadline() == 1.0
    assert q.expire(2.0) == [late]
    assert len(q) == 1
    assert q.next_deadline() == 5.0


def test_delay_action_moves_expired_behind_their_level() -> None:
    q = _queue(delay=True)
    expired, fresh, lower = _item(deadline=1.0), _item(), _item(priority=3)
    for item in (expired, fresh, lower):
        q.put_nowait(item)
    assert q.expire(2.0) == []
    assert q.take(expired.signature, 3) == [fresh, expired, lower]


def test_remove_takes_cancelled_item_out() -> None:
    q = _queue()
    a, b = _item(), _item()
    q.put_nowait(a)
    q.put_nowait(b)
    assert q.remove(a)
    assert not q.remove(a)
    assert q.take(b.signature, 5) == [b]


def test_statistics_count_by_priority() -> None:
    q = _queue()
    q.put_nowait(_item(priority=1, arrival=3.0))
    q.put_nowait(_item(priority=3, arrival=2.0))
    stats = q.statistics()
    assert stats.depth == 2
    assert stats.depth_by_priority == (1, 0, 1)
    assert stats.oldest_arrival == 2.0


def test_a_level_with_its_own_limit_refuses_past_it() -> None:
    """Triton's priority_queue_policy max_queue_size: that level's items alone; the other
    levels and the whole queue's limit as before (refused before: not supported)."""
    q = _queue(max_size=5)
    q.set_levels((None, LevelQueue(max_queue_size=1), None))
    q.put_nowait(_item(priority=2))
    with pytest.raises(QueueFull, match=r"queue of priority 2 is full \(1 requests waiting\)"):
        q.put_nowait(_item(priority=2))
    q.put_nowait(_item(priority=2), force=True)  # a step of accepted work: never refused
    for priority in (1, 3, 1):
        q.put_nowait(_item(priority=priority))
    with pytest.raises(QueueFull, match=r"the queue is full \(5 requests waiting\)"):
        q.put_nowait(_item(priority=1))
    q.set_levels(())
    assert len(q) == 5


def test_a_level_with_its_own_action_delays_or_rejects_at_its_deadline() -> None:
    q = _queue(delay=False)
    q.set_levels((LevelQueue(timeout_action="DELAY"), None, None))
    kept, dropped = _item(priority=1, deadline=1.0), _item(priority=2, deadline=1.0)
    q.put_nowait(kept)
    q.put_nowait(dropped)
    assert q.expire(2.0) == [dropped]
    assert kept.delayed and q.head() is kept


def test_a_served_model_shows_its_levels_policies() -> None:
    """``GET …/config`` over HTTP and gRPC, as Triton shows them (compared side by side
    in bench.triton_python_parity, with the requests each refuses)."""
    from pathlib import Path

    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from sordino.config import RuntimeConfig
    from sordino.models.repository import scan_repository
    from sordino.testing import serve_in_thread

    fixture = Path(__file__).parent.parent / "fixtures" / "triton_python_answers"
    sources = [s for s in scan_repository(fixture) if s.name == "level_queues"]
    with serve_in_thread(RuntimeConfig(), sources) as running:
        http = httpclient.InferenceServerClient(running.url.removeprefix("http://"))
        levels = http.get_model_config("level_queues")["dynamic_batching"]
        http.close()
        grpc = grpcclient.InferenceServerClient(running.grpc_url)
        by_grpc = grpc.get_model_config("level_queues", as_json=True)["config"]
        grpc.close()
    assert levels["priority_queue_policy"] == {
        "2": {"timeout_action": "REJECT", "default_timeout_microseconds": 0,
              "allow_timeout_override": False, "max_queue_size": 1},
        "3": {"timeout_action": "REJECT", "default_timeout_microseconds": 200000,
              "allow_timeout_override": False, "max_queue_size": 0},
    }  # fmt: skip
    policies = by_grpc["dynamic_batching"]["priority_queue_policy"]
    assert policies["2"]["max_queue_size"] == 1
    assert policies["3"]["default_timeout_microseconds"] == "200000"  # (uint64: text)
