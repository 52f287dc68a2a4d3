"""Configuration documents: assignments, overlays, diffs and what may change live."""

from __future__ import annotations

import pytest

from sordino.errors import InvalidRequest
from sordino.operations.changes import (
    apply_assignments,
    deep_merge,
    diff,
    is_live,
    parse_assignment,
    strategies_as_list,
)

LIVE = {"scheduler": {"mode": "adaptive", "strategies": []}, "models": {"m": {"max_batch_size": 4}}}


def test_assignment_values_are_yaml_scalars() -> None:
    assert parse_assignment("a.b=16") == ("a.b", 16)
    assert parse_assignment("a.b=true") == ("a.b", True)
    assert parse_assignment("memory.pool_size=4GB") == ("memory.pool_size", "4GB")
    with pytest.raises(InvalidRequest, match="KEY=VALUE"):
        parse_assignment("scheduler.mode")


def test_model_keys_take_the_short_spelling_and_must_name_a_served_model() -> None:
    changed = apply_assignments(LIVE, {"models.m.max_batch": 8})
    assert changed["models"]["m"]["max_batch_size"] == 8
    with pytest.raises(InvalidRequest, match="no model 'x' is served"):
        apply_assignments(LIVE, {"models.x.max_batch": 8})


def test_batching_shorthand_becomes_the_strategy_entry() -> None:
    changed = strategies_as_list(
        apply_assignments(LIVE, {"scheduler.dynamic_batching.max_batch": 8})
    )
    assert changed["scheduler"]["strategies"] == [{"name": "dynamic_batching", "max_batch": 8}]
    keys = [c.key for c in diff(LIVE, changed)]
    assert keys == ["scheduler.strategies.dynamic_batching.max_batch"]
    assert all(is_live(key) for key in keys)


def test_a_file_overlay_merges_models_by_name() -> None:
    merged = deep_merge(LIVE, {"models": [{"name": "m", "scheduler_mode": "manual"}]})
    assert merged["models"]["m"] == {"max_batch_size": 4, "scheduler_mode": "manual"}


@pytest.mark.parametrize(
    ("key", "live"),
    [
        ("scheduler.mode", True),
        ("models.m.dynamic_batching.max_queue_delay_microseconds", True),
        ("models.m.dynamic_batching.priority_levels", False),
        ("models.m.instance_count", False),
        ("memory.pool_size", True),
        ("memory.defrag_interval", True),
        ("server.http_port", False),
        ("scheduler.strategies.fallback_chain.primary", False),
    ],
)
def test_what_changes_live(key: str, live: bool) -> None:
    assert is_live(key) is live
