"""Findings from a model's figures, and ``sordino profile --apply`` against a real server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.config import ModelConfig, SchedulerConfig, load_config
from sordino.control.client import request_json
from sordino.models.repository import builtin_sources
from sordino.operations.advice import advise, batch_sizes
from sordino.scheduling.settings import scheduling_for
from sordino.testing import serve_in_thread


def _stats(batches: int, rows: int, queue: float, staging: float, compute: float) -> dict[str, Any]:
    ns = {"queue": queue, "compute_input": staging, "compute_output": 0, "compute_infer": compute}
    return {
        "execution_count": batches,
        "inference_count": rows,
        "inference_stats": {key: {"ns": value} for key, value in ns.items()},
    }


def test_a_batch_that_never_fills_and_serialization() -> None:
    found = advise("m", _stats(100, 100, 1e6, 5e7, 2e7), {"max_batch_size": 64})
    titles = [f.title for f in found]
    assert titles == ["most time in serialization", "batch never fills"]
    assert found[0].settings == {}
    assert found[1].settings == {"models.m.scheduler_mode": "ultra_low_latency"}


def _cap_after(config: dict[str, Any], settings: dict[str, Any]) -> int:
    """The batch cap the scheduler resolves for ``config`` with ``settings`` applied."""
    changed = dict(config)
    for key, value in settings.items():
        path = key.removeprefix("models.m.").split(".")
        if len(path) == 2:
            changed[path[0]] = {**changed.get(path[0], {}), path[1]: value}
        else:
            changed[path[0]] = value
    model = ModelConfig(name="m", path=Path("m.onnx"), **changed)
    return scheduling_for(SchedulerConfig(), model, batched=True).policy.max_batch


@pytest.mark.parametrize(
    ("config", "settings"),
    [
        # max_batch_size alone: both grow, the cap being at the rows a request may carry.
        ({"max_batch_size": 16}, {"dynamic_batching.max_batch": 32, "max_batch_size": 32}),
        # The defaults, which the scheduler's max_batch (32) sets: raising max_batch_size
        # alone (as before) left the cap at 32, the change doing nothing.
        ({}, {"dynamic_batching.max_batch": 64, "max_batch_size": 64}),
        # A cap below max_batch_size: only the cap grows; clients' requests are untouched.
        ({"max_batch_size": 64, "dynamic_batching": {"max_batch": 16}},
         {"dynamic_batching.max_batch": 32}),
    ],
)  # fmt: skip
def test_queueing_behind_full_batches_doubles_the_batch_cap(
    config: dict[str, Any], settings: dict[str, Any]
) -> None:
    _, cap = batch_sizes(config, {})
    found = advise("m", _stats(100, 100 * cap, 9e8, 1e6, 1e8), config, {"max_batch": 32})
    assert [f.title for f in found] == ["queue dominates with full batches"]
    assert found[0].settings == {f"models.m.{key}": value for key, value in settings.items()}
    assert _cap_after(config, found[0].settings) == 2 * _cap_after(config, {})


def test_too_little_traffic_says_so() -> None:
    assert advise("m", _stats(3, 3, 0, 0, 1), {})[0].title == "not enough traffic"


def test_profile_apply_turns_the_finding_into_a_live_change() -> None:
    config = load_config(None, {"reconfigure.verify_window": "1s"})
    digits = [s for s in builtin_sources() if s.name == "digits-classifier"]
    body = {
        "inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 64}]
    }
    with serve_in_thread(config, digits) as server:
        for _ in range(30):
            request_json("POST", f"{server.url}/v2/models/digits-classifier/infer", body)
        result = CliRunner().invoke(
            cli,
            ["profile", "--url", server.url, "--model", "digits-classifier", "--seconds", "0.5",
             "--apply"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert "finding: batch never fills" in result.output
        assert "scheduler_mode: None -> 'ultra_low_latency'  (live)" in result.output
        assert server.runtime.get("digits-classifier").scheduling.mode == "ultra_low_latency"
