"""Python models' custom metrics: the workers' snapshots, read into /metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from sordino.telemetry.model_metrics import ModelMetricsCollector


def _family(kind: str, series: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{"name": "m", "kind": kind, "description": "d", "series": series}]


def _scrape(folder: Path) -> str:
    registry = CollectorRegistry()
    registry.register(ModelMetricsCollector(folder))
    return generate_latest(registry).decode()


def test_counters_of_several_workers_add_up_and_a_dead_workers_snapshot_goes(
    tmp_path: Path,
) -> None:
    """Two live instances' counters are summed; the snapshot of a gone process is removed."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = tmp_path / f"{done.stdout.strip()}.json"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        series = [{"labels": {"model": "a"}, "value": 2.0}]
        (tmp_path / f"{os.getpid()}.json").write_text(json.dumps(_family("COUNTER", series)))
        (tmp_path / f"{live.pid}.json").write_text(json.dumps(_family("COUNTER", series)))
        dead.write_text(json.dumps(_family("COUNTER", series)))
        text = _scrape(tmp_path)
    finally:
        live.kill()
        live.wait()
    assert 'm{model="a"} 4.0' in text
    assert not dead.exists()


def test_a_histogram_is_shown_with_cumulative_buckets(tmp_path: Path) -> None:
    """Bucket counts become Prometheus's cumulative buckets, with count and sum."""
    state = {"labels": {}, "buckets": [1.0, 5.0], "counts": [1, 2, 1], "sum": 12.5}
    (tmp_path / f"{os.getpid()}.json").write_text(json.dumps(_family("HISTOGRAM", [state])))
    text = _scrape(tmp_path)
    assert 'm_bucket{le="1.0"} 1.0' in text
    assert 'm_bucket{le="5.0"} 3.0' in text
    assert 'm_bucket{le="+Inf"} 4.0' in text
    assert "m_count 4.0" in text and "m_sum 12.5" in text


def test_the_snapshot_folder_is_removed_when_its_process_exits() -> None:
    from sordino.telemetry.model_metrics import METRICS_DIR_ENV

    env = {k: v for k, v in os.environ.items() if k != METRICS_DIR_ENV}
    code = (
        "from sordino.telemetry.model_metrics import model_metrics_dir\n"
        "d = model_metrics_dir(); (d / '1.json').write_text('[]'); print(d)"
    )
    made = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()
    assert made and not Path(made).exists()
