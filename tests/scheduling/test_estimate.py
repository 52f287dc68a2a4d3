"""The scheduler's estimates alone: a batch's cost, the wait behind a backlog, arrivals."""

from __future__ import annotations

import math

import pytest

from sordino.scheduling.estimate import BURST_DEVIATIONS, Arrivals, BatchCost


def _cost(latency: float, per_row: float, sizes: list[int]) -> BatchCost:
    cost = BatchCost()
    for _ in range(30):
        for rows in sizes:
            cost.note(rows, latency + per_row * rows)
    return cost


def test_a_batch_cost_is_split_into_fixed_and_per_row_once_sizes_vary() -> None:
    fixed, per_row = _cost(0.05, 0.001, [1, 8]).split()
    assert fixed == pytest.approx(0.05, rel=0.02) and per_row == pytest.approx(0.001, rel=0.02)
    # One size only: the split cannot be seen, so all of it counts per row.
    fixed, per_row = _cost(0.05, 0.001, [4]).split()
    assert fixed == 0.0 and per_row == pytest.approx(0.054 / 4)


def test_the_wait_is_none_until_a_batch_ran_and_counts_full_batches() -> None:
    assert BatchCost().wait(10, instances=1, max_batch=8) is None
    cost = _cost(0.05, 0.001, [1, 8])
    # 48 rows in batches of 8: 6 × (0.05 + 0.008), two instances halve it; plus one batch.
    assert cost.mean_s is not None
    expected = 6 * 0.058 / 2 + cost.mean_s
    assert cost.wait(48, instances=2, max_batch=8) == pytest.approx(expected, rel=0.02)


def test_higher_arrivals_stretch_the_wait_by_the_busy_period() -> None:
    cost = _cost(0.0, 0.01, [1])  # 10 ms a row, no fixed part
    work, rate, row = 0.1, 40.0, 0.01  # 10 rows ahead; higher rows take 40 % of the time
    free = 1 - rate * row
    busy = work / free + BURST_DEVIATIONS * row * math.sqrt(rate * work) / free**1.5
    assert cost.wait(10, 1, 1, higher_rate=rate) == pytest.approx(busy + 0.01)
    assert cost.wait(0, 1, 1, higher_rate=rate) == pytest.approx(0.01)  # nothing ahead


def test_ride_along_follows_the_fixed_share_of_a_batch() -> None:
    assert BatchCost().ride_along(1) == 1 << 30  # nothing known: no bound
    assert _cost(0.0, 0.01, [4]).ride_along(1) == 1 << 30  # one size: the split is unseen
    assert _cost(0.0, 0.01, [1, 4]).ride_along(1) == 0  # all per row: none ride along
    assert _cost(0.05, 0.001, [1, 8]).ride_along(1) == 12  # a quarter of (50 + 1) rows


def test_arrivals_per_level_read_the_higher_rate_only() -> None:
    arrivals = Arrivals(priority_levels=3, now=0.0)
    for i in range(100):  # 1 s of 100 high and 100 low rows a second
        arrivals.note(i * 0.01, 1, 1, in_flight=1)
        arrivals.note(i * 0.01, 1, 3, in_flight=1)
    assert arrivals.higher_rate(1, 1.0) == 0.0  # nothing above the highest
    # Above level 3: the high rows only, read two deviations high over the second.
    assert 100 <= arrivals.higher_rate(3, 0.995) <= (100 + 2 * 10) / 0.995 + 1
    assert Arrivals(priority_levels=1, now=0.0).higher_rate(1, 0.0) == 0.0
