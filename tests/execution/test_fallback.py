"""A real device chain on a CPU-only machine: three devices, one of them absent.

``gpu`` (CUDA) is missing here and is skipped with one log line; ``cpu_fast`` (one
thread) is the working primary and ``cpu_wide`` (two threads) the fallback.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import httpx
import pytest

from sordino.config import RuntimeConfig
from sordino.control.client import AdminClient
from sordino.testing import RunningServer, serve_in_thread
from tests.execution.load import Load, digits, events, mark, wait_until

TOKEN = "test-admin-token"


def device_batches(server: RunningServer, device: str) -> int:
    return sum(
        w.batches for w in server.runtime.executor.statistics().workers if w.device == device
    )


@pytest.fixture(scope="module")
def chain() -> Iterator[RunningServer]:
    config = RuntimeConfig.model_validate(
        {
            "server": {"admin_token": TOKEN},
            "devices": [
                {"name": "gpu", "provider": "cuda", "device_id": 0},
                {"name": "cpu_fast", "provider": "cpu", "intra_op_threads": 1},
                {"name": "cpu_wide", "provider": "cpu", "intra_op_threads": 2},
            ],
            "scheduler": {
                "strategies": [
                    {
                        "name": "fallback_chain",
                        "primary": "gpu",
                        "fallbacks": ["cpu_fast", "cpu_wide"],
                        "switch_threshold": "error_rate>5% for 30s",
                        "min_requests": 5,
                        "cooldown": "1s",
                        "half_open_probes": 3,
                    }
                ]
            },
        }
    )
    with serve_in_thread(config, digits()) as server:
        yield server


def test_absent_device_is_skipped_with_one_line(chain: RunningServer) -> None:
    """The CUDA device is reported unavailable once and the chain goes on without it."""
    (event,) = events(chain, "device_unavailable")
    assert event.subject == "device:gpu"
    assert "CUDAExecutionProvider is not in this onnxruntime build" in event.cause
    devices = {w.device for w in chain.runtime.executor.statistics().workers}
    assert devices == {"cpu_fast", "cpu_wide"}
    metrics = httpx.get(chain.url + "/metrics").text
    assert 'sordino_device_available{device="gpu"} 0.0' in metrics


def test_error_on_primary_moves_traffic_and_clearing_brings_it_back(
    chain: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Errors on the primary: no client error, traffic on the fallback; cleared: it returns."""
    caplog.set_level(logging.INFO, logger="sordino")
    start = mark(chain)
    admin = AdminClient(chain.url, TOKEN)
    with Load(chain.url, clients=4) as load:
        load.wait_ok(20)
        assert device_batches(chain, "cpu_fast") > 0
        admin.inject("device:cpu_fast", "error", rate=1.0)
        wait_until(lambda: events(chain, "breaker_open", start), 60, "the breaker to open")
        wide = device_batches(chain, "cpu_wide")
        # 60 answers: the 4 clients' requests may share batches (adaptive batching waits
        # while they are coming), so 30 could be fewer than 10 batches.
        load.wait_ok(60)
        assert device_batches(chain, "cpu_wide") >= wide + 10  # traffic moved
        admin.clear()
        wait_until(lambda: events(chain, "breaker_closed", start), 60, "the breaker to close")
        fast = device_batches(chain, "cpu_fast")
        load.wait_ok(60)
        assert device_batches(chain, "cpu_fast") >= fast + 10  # traffic returned
    assert load.errors == []
    opened = events(chain, "breaker_open", start)[0]
    assert opened.subject == "device:cpu_fast" and "crossed 'error_rate>5% for 30s'" in opened.cause
    states = [e.kind for e in chain.runtime.events.recent()[start:] if e.kind.startswith("breaker")]
    assert states[-2:] == ["breaker_half_open", "breaker_closed"]
    closed = events(chain, "breaker_closed", start)[0]
    assert closed.cause == "3 probe batches succeeded"
    switches = events(chain, "device_switch", start)
    assert switches and {(e.payload["from_device"], e.payload["to_device"]) for e in switches} == {
        ("cpu_fast", "cpu_wide")
    }
    assert all(0 <= e.payload["dispatch_s"] <= e.payload["switch_s"] < 10 for e in switches)
    metrics = httpx.get(chain.url + "/metrics").text
    assert 'sordino_device_breaker_state{device="cpu_fast",state="closed"} 1.0' in metrics
    count = re.search(
        r'sordino_device_switches_total\{from_device="cpu_fast",model="digits-classifier",'
        r'to_device="cpu_wide"\} (\S+)',
        metrics,
    )
    assert count is not None and float(count.group(1)) == len(switches)
    assert any("breaker closed -> open" in r.getMessage() for r in caplog.records)
