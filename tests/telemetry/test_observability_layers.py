"""The brief's observability layers in a short run of a real server.

Bandwidth saturation (resource layer), each instance's busy share (execution layer),
user satisfaction posted with ``POST /v2/feedback`` and correlated with latency
(business layer), and the next-hour forecast or what history it still needs
(prediction layer): each shows in /metrics, the snapshot the monitor reads, and
``sordino diagnose`` within seconds of start-up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sordino.cli.main import cli
from sordino.telemetry.feedback import MAX_REQUEST_ID
from sordino.testing import RunningServer, serve_in_thread
from tests.execution.load import BODY, digits
from tests.waiting import wait_for

MODEL = "digits-classifier"
INPUT_BYTES = 64 * 4  # one row of 64 FP32 pixels
OUTPUT_BYTES = 10 * 4  # ten FP32 scores


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    data_dir = tmp_path_factory.mktemp("layers")
    with serve_in_thread(sources=digits(instance_count=2), data_dir=data_dir) as server:
        yield server, data_dir


def _samples(server: RunningServer, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    text = generate_latest(server.runtime.metrics.registry).decode()
    out = {}
    for metric in text_string_to_metric_families(text):
        if metric.name == family:
            for sample in metric.samples:
                if sample.name in (family, family + "_total"):
                    out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def _bytes(server: RunningServer, path: str) -> float:
    return _samples(server, "sordino_bandwidth_bytes").get((("path", path),), 0.0)


def _infer(client: httpx.Client, url: str, request_id: str | None = None) -> None:
    body: dict[str, Any] = dict(BODY)
    if request_id is not None:
        body["id"] = request_id
    response = client.post(f"{url}/v2/models/{MODEL}/infer", json=body)
    assert response.status_code == 200, response.text


def test_bandwidth_counter_grows_with_bytes_served(served: tuple[RunningServer, Path]) -> None:
    server, _ = served
    wait_for(lambda: server.runtime.telemetry.utilisation.last() is not None, "a first sample")
    arena, hop = _bytes(server, "arena"), _bytes(server, "worker_hop")
    with httpx.Client(timeout=60) as client:
        for _ in range(20):
            _infer(client, server.url)
    # Every request's pixels are copied into the arena once; the worker reads them and
    # writes its scores back: at least that many bytes, on the next closed second.
    wait_for(
        lambda: (
            _bytes(server, "arena") >= arena + 20 * INPUT_BYTES
            and _bytes(server, "worker_hop") >= hop + 20 * (INPUT_BYTES + OUTPUT_BYTES)
        ),
        "the bandwidth counters to grow by the bytes served",
    )
    capacity = _samples(server, "sordino_bandwidth_capacity_bytes_per_second")
    assert next(iter(capacity.values())) > 1e8  # any machine copies faster than 100 MB/s
    saturation = list(_samples(server, "sordino_bandwidth_saturation_ratio").values())
    assert len(saturation) == 1 and 0 <= saturation[0] < 1


def test_each_instance_has_its_busy_share_in_metrics(served: tuple[RunningServer, Path]) -> None:
    server, _ = served
    with httpx.Client(timeout=60) as client:
        for _ in range(10):
            _infer(client, server.url)

    def busy_seconds() -> dict[str, float]:
        found = _samples(server, "sordino_instance_busy_seconds")
        return {dict(k)["instance"]: v for k, v in found.items() if dict(k)["model"] == MODEL}

    wait_for(lambda: sum(busy_seconds().values()) > 0, "busy time on the instances")
    assert sorted(busy_seconds()) == ["0", "1"]  # one series per instance
    ratios = _samples(server, "sordino_instance_busy_ratio")
    shares = [v for k, v in ratios.items() if dict(k)["model"] == MODEL]
    assert len(shares) == 2 and all(0 <= s <= 1 for s in shares)
    snap = httpx.get(f"{server.url}/v2/sordino/telemetry?seconds=5").json()
    assert {f"{MODEL}/1/0", f"{MODEL}/1/1"} <= set(snap["utilisation"]["instances"])


def test_feedback_is_validated_with_clear_errors(served: tuple[RunningServer, Path]) -> None:
    server, _ = served
    url = f"{server.url}/v2/feedback"
    with httpx.Client(timeout=60) as client:
        _infer(client, server.url, "checked-1")
        wait_for(
            lambda: server.runtime.telemetry.recent_requests.find("checked-1") is not None,
            "the request to be remembered",
        )
        cases = [
            ({"request_id": "checked-1", "rating": 6}, 400, "1 to 5"),
            ({"request_id": "checked-1", "rating": True}, 400, "1 to 5"),
            ({"rating": 3}, 400, "'request_id'"),
            ({"request_id": "checked-1", "rating": 3, "stars": 3}, 400, "stars"),
            ({"tag": "x" * 65, "rating": 3}, 400, "64"),
            ({"request_id": "never-sent", "rating": 3}, 404, "no recent request"),
        ]
        for body, status, words in cases:
            response = client.post(url, json=body)
            assert response.status_code == status, (body, response.text)
            assert words in response.json()["error"]
        assert client.post(url, content=b"[1]").status_code == 400
        first = client.post(url, json={"request_id": "checked-1", "rating": 4})
        assert first.status_code == 200, first.text
        assert first.json()["request"]["outcome"] == "success"
        again = client.post(url, json={"request_id": "checked-1", "rating": 5})
        assert again.status_code == 409 and "rated already" in again.json()["error"]


def test_long_request_ids_are_served_but_not_kept(served: tuple[RunningServer, Path]) -> None:
    """Ids of 1 MB, each kept among the last 10,000 for ratings, grew a server by 1 MB a
    request; ids past MAX_REQUEST_ID characters are now served and not remembered."""
    server, _ = served
    recent = server.runtime.telemetry.recent_requests
    kept, long = "k" * MAX_REQUEST_ID, "l" * (MAX_REQUEST_ID + 1)
    with httpx.Client(timeout=60) as client:
        _infer(client, server.url, long)
        _infer(client, server.url, kept)
        wait_for(lambda: recent.find(kept) is not None, "the request to be remembered")
        assert recent.find(long) is None
        response = client.post(f"{server.url}/v2/feedback", json={"request_id": long, "rating": 3})
    assert response.status_code == 400, response.text
    assert f"longer than {MAX_REQUEST_ID} characters" in response.json()["error"]


def test_a_rating_appears_in_the_correlation_of_diagnose(
    served: tuple[RunningServer, Path], tmp_path: Path
) -> None:
    server, data_dir = served
    with httpx.Client(timeout=60) as client:
        for i in range(3):
            _infer(client, server.url, f"rated-{i}")
        wait_for(
            lambda: server.runtime.telemetry.recent_requests.find("rated-2") is not None,
            "the requests to be remembered",
        )
        for i, rating in enumerate((5, 4, 2)):
            response = client.post(
                f"{server.url}/v2/feedback", json={"request_id": f"rated-{i}", "rating": rating}
            )
            assert response.status_code == 200, response.text
            assert response.json()["request"]["latency_ms"] > 0
        assert client.post(f"{server.url}/v2/feedback", json={"tag": "poster", "rating": 3})
    snap = httpx.get(f"{server.url}/v2/sordino/telemetry?seconds=5").json()
    assert snap["satisfaction"]["count"] >= 4 and snap["satisfaction"]["tags"]["poster"][0] == 1
    journal = server.runtime.telemetry.journal
    assert journal is not None

    def journaled() -> bool:
        # Bandwidth reaches the journal every 10 s (a `utilisation` event): a quiet
        # machine gets here sooner than that after start-up.
        assert journal.flush()
        query = f"start={time.time() - 600}&end={time.time() + 1}"
        window = httpx.get(f"{server.url}/v2/sordino/journal?{query}", timeout=30).json()
        return any(e["kind"] == "utilisation" for e in window["events"])

    wait_for(journaled, "the bandwidth in the journal", 30)
    out = tmp_path / "health.html"
    result = CliRunner().invoke(
        cli,
        ["diagnose", "--data-dir", str(data_dir), "--time-range", "last_1h", "--output", str(out)],
    )
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert "Business layer: user satisfaction" in page
    assert "mean rating by latency" in page and "tag poster: mean 3.00 (1)" in page
    assert "Resource layer: bandwidth saturation" in page and "of the measured copy" in page
    assert "<h3>User satisfaction</h3>" in page  # the chart of ratings against latency


def test_forecast_says_how_much_history_it_needs(served: tuple[RunningServer, Path]) -> None:
    server, _ = served
    wait_for(lambda: server.runtime.telemetry.forecast is not None, "the first forecast fit")
    snap = httpx.get(f"{server.url}/v2/sordino/telemetry?seconds=5").json()
    # A server a few seconds old has a minute or two of history: the forecast waits for more.
    assert (
        "needs" in snap["forecast_status"] and "more minutes of history" in snap["forecast_status"]
    )
    result = CliRunner().invoke(cli, ["monitor", "--url", server.url, "--once"])
    assert result.exit_code == 0, result.output
    assert "no forecast yet: needs" in result.output
    assert "bandwidth" in result.output and "instances busy" in result.output
