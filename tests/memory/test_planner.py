"""Greedy-by-size offset planning: co-live tensors never share bytes; steps reuse them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sordino.inference import ModelKey
from sordino.memory.planner import StepPlanner, plan_greedy_by_size, step_tensors
from sordino.records import RequestDone


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 1 << 20), st.integers(0, 30), st.integers(0, 10)),
        min_size=1,
        max_size=40,
    )
)
def test_co_live_tensors_never_overlap_and_the_peak_is_bounded(
    raw: list[tuple[int, int, int]],
) -> None:
    tensors = [(size, first, first + length) for size, first, length in raw]
    plan, peak = plan_greedy_by_size(tensors)
    for i, a in enumerate(plan):
        assert a.size >= tensors[i][0] and a.offset >= 0
        for b in plan[i + 1 :]:
            if a.first <= b.last and b.first <= a.last:  # alive at the same step
                assert a.offset + a.size <= b.offset or b.offset + b.size <= a.offset
    assert peak == max(p.offset + p.size for p in plan)
    assert peak <= sum(p.size for p in plan)  # never worse than no reuse
    # Never better than the bytes alive at the busiest step.
    steps = range(min(p.first for p in plan), max(p.last for p in plan) + 1)
    assert peak >= max(sum(p.size for p in plan if p.first <= s <= p.last) for s in steps)


def test_twenty_steps_fit_in_about_two_steps() -> None:
    steps = [(4096, 65536)] + [(65536 + 4096, 65536)] * 19  # carried state + own inputs
    tensors = step_tensors(steps)
    _, peak = plan_greedy_by_size(tensors)
    naive = sum(size for size, _, _ in tensors)
    assert naive == 4096 + 19 * 4096 + 20 * 65536
    assert peak <= 4096 + 2 * 65536 + 4096  # the request's inputs + two steps' outputs
    assert peak * 5 < naive


def test_the_planner_keeps_figures_per_model() -> None:
    planner = StepPlanner()
    key = ModelKey("countdown", "1")
    done = RequestDone(key, "success", "ok", 0, 0.0, 0.0, 0.0, None, ((64, 64),) * 10)
    planner.request_done(done)
    planner.request_done(RequestDone(key, "success", "ok", 0, 0.0, 0.0, 0.0))  # one-shot
    (stats,) = planner.statistics()
    assert stats.model == "countdown" and stats.requests == 1 and stats.steps == 10
    assert stats.naive_bytes == 11 * 64 and stats.planned_peak_bytes == 3 * 64
    assert stats.max_planned_peak_bytes == 3 * 64
