"""``sordino tune``: a short real sweep, the Pareto front, a YAML reconfigure accepts."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml
from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.config import load_config
from sordino.errors import ConfigError
from sordino.loadtest.tune import Candidate, Objective, Point, pareto, parse_objective, recommend
from sordino.models.repository import builtin_sources
from sordino.testing import serve_in_thread


def _point(batch: int, throughput: float, p99: float) -> Point:
    return Point(Candidate(batch, 0, "manual"), throughput, p99, ())


def test_objectives_parse_or_say_what_is_accepted() -> None:
    assert parse_objective("max throughput with p99<50ms") == Objective("throughput", 50.0)
    assert parse_objective("min p99") == Objective("p99", None)
    with pytest.raises(ConfigError, match="max throughput with p99<50ms"):
        parse_objective("fast please")


def test_the_pareto_front_and_the_recommendation() -> None:
    points = [_point(1, 100, 5), _point(8, 300, 20), _point(32, 280, 30), _point(4, 300, 10)]
    assert [p.candidate.max_batch for p in pareto(points)] == [4, 1]  # type: ignore[union-attr]
    assert recommend(points, Objective("throughput", 50)).candidate.max_batch == 4  # type: ignore[union-attr]
    assert recommend(points, Objective("p99", None)).candidate.max_batch == 1  # type: ignore[union-attr]


def test_tune_sweeps_a_live_server_and_restores_it(tmp_path: Path) -> None:
    config = load_config(None, {"server.admin_token": "tune-test-token"})
    digits = [s for s in builtin_sources() if s.name == "digits-classifier"]
    with serve_in_thread(config, digits) as server:
        before = server.runtime.get("digits-classifier").scheduling
        result = CliRunner().invoke(
            cli,
            ["tune", "--url", server.url, "--token", "tune-test-token",
             "--model", "digits-classifier", "--max-batch", "1,16,128", "--delay-us", "0",
             "--modes", "manual", "--rates", "50", "--seconds", "1", "--refine", "0",
             "--objective", "max throughput with p99<500ms"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert "live settings (baseline)" in result.output
        assert "Pareto front" in result.output and "recommended for" in result.output
        assert "skipping max_batch 128: above digits-classifier's max_batch_size 64" in (
            result.output
        )
        tuned = tmp_path / "tuned.yaml"
        tuned.write_text(result.output.split("# sordino reconfigure --file tuned.yaml\n")[1])
        # The batch cap, not the rows a request may carry (max_batch_size): applying a
        # smaller batch refuses no client's larger request.
        recommended = yaml.safe_load(tuned.read_text())["models"][0]
        assert "max_batch_size" not in recommended
        assert recommended["dynamic_batching"]["max_batch"] in (1, 16)
        assert server.runtime.get("digits-classifier").scheduling == before
        applied = CliRunner().invoke(
            cli,
            ["reconfigure", "--url", server.url, "--token", "tune-test-token",
             "--file", str(tuned), "--verify-window", "0s"],
        )  # fmt: skip
        assert applied.exit_code == 0, applied.output
        assert "applied" in applied.output or "unchanged" in applied.output


def test_tune_moves_a_poor_start_to_a_setting_that_meets_the_objective() -> None:
    """Every batch waiting 600 ms misses p99<300ms at any rate; tune recommends another
    setting, and its side-by-side runs show that one meeting the bound where the live
    one does not."""
    token = "tune-test-token"
    config = load_config(None, {"server.admin_token": token})
    digits = [s for s in builtin_sources() if s.name == "digits-classifier"]
    prefix = "models.digits-classifier"
    with serve_in_thread(config, digits) as server:
        poor = CliRunner().invoke(
            cli,
            ["reconfigure", "--url", server.url, "--token", token, "--verify-window", "0s",
             "--set", f"{prefix}.scheduler_mode=manual",
             "--set", f"{prefix}.dynamic_batching.max_queue_delay_microseconds=600000"],
        )  # fmt: skip
        assert poor.exit_code == 0, poor.output
        start = server.runtime.get("digits-classifier").scheduling
        result = CliRunner().invoke(
            cli,
            ["tune", "--url", server.url, "--token", token, "--model", "digits-classifier",
             "--max-batch", "64", "--delay-us", "0", "--modes", "manual",
             "--rates", "40", "--seconds", "0.5", "--refine", "1", "--json",
             "--objective", "max throughput with p99<300ms"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        report = json.loads(result.output[result.output.index("\n{") :])
        assert report["refined"] is True
        live, chosen = report["baseline"], report["recommended"]
        assert live["throughput"] == 0  # the start met the bound at no rate it was run at
        assert chosen["candidate"] == "max_batch 64, delay 0 µs, manual"
        assert chosen["throughput"] > 0 and chosen["p99_ms"] < 300
        assert server.runtime.get("digits-classifier").scheduling == start  # restored


def test_a_smaller_batch_set_live_refuses_no_larger_request() -> None:
    """What tune sweeps and recommends: ``dynamic_batching.max_batch`` changes live and
    leaves the rows a request may carry alone. tune swept ``max_batch_size`` before, so
    a client's 8-row request was refused (400) while a candidate of 1 ran, and after
    its recommendation was applied."""
    token = "tune-test-token"
    config = load_config(None, {"server.admin_token": token})
    digits = [s for s in builtin_sources() if s.name == "digits-classifier"]
    with serve_in_thread(config, digits) as server:
        applied = CliRunner().invoke(
            cli,
            ["reconfigure", "--url", server.url, "--token", token, "--verify-window", "0s",
             "--set", "models.digits-classifier.dynamic_batching.max_batch=1"],
        )  # fmt: skip
        assert applied.exit_code == 0, applied.output
        assert "dynamic_batching.max_batch: None -> 1  (live)" in applied.output
        scheduling = server.runtime.get("digits-classifier").scheduling
        assert (scheduling.policy.max_batch, scheduling.max_batch_size) == (1, 64)
        rows = {"name": "pixels", "shape": [8, 64], "datatype": "FP32", "data": [0.0] * 512}
        answer = httpx.post(
            f"{server.url}/v2/models/digits-classifier/infer", json={"inputs": [rows]}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["shape"] == [8, 10]
