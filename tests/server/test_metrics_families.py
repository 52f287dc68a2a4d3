"""/metrics after traffic: parses with prometheus-client and has the families of each layer."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sordino.testing import RunningServer
from tests.waiting import wait_for_closed_second

EXPECTED = {
    # execution
    "sordino_batches", "sordino_batch_size", "sordino_request_compute_seconds",
    "sordino_request_queue_seconds", "sordino_worker_busy_ratio",
    # resources
    "sordino_process_resident_memory_bytes",
    # business
    "sordino_requests", "sordino_tenant_requests", "sordino_request_seconds",
    "sordino_slo_target_seconds", "sordino_slo_attainment_ratio",
    # forecast (present as families; samples appear once the journal has history)
    "sordino_forecast_qps", "sordino_forecast_memory_bytes",
}  # fmt: skip


def test_metrics_parse_and_cover_every_layer(server: RunningServer) -> None:
    body = {
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [2, 64], "data": [1.0] * 128}]
    }
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for i in range(20):
            response = client.post(
                "/v2/models/digits-classifier/infer",
                json=body | {"parameters": {"priority": 1 + i % 2}},
                headers={"x-sordino-tenant": "acme"},
            )
            assert response.status_code == 200
        wait_for_closed_second(server)  # the per-second families are fed from closed rows
        text = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) >= EXPECTED, EXPECTED - set(families)
    # A tenant not in telemetry.tenant_labels is counted as "other" (a bounded label;
    # tests/server/test_metric_labels.py pins the rule), which other tests may share.
    tenant = [
        s for s in families["sordino_tenant_requests"].samples
        if s.name.endswith("_total") and s.labels["tenant"] == "other"
        and s.labels["model"] == "digits-classifier" and s.labels["outcome"] == "success"
    ]  # fmt: skip
    assert {s.labels["priority"] for s in tenant} >= {"1", "2"}
    assert sum(s.value for s in tenant) >= 20
    buckets = [s for s in families["sordino_request_seconds"].samples if s.name.endswith("_bucket")]
    assert len({s.labels["le"] for s in buckets}) >= 20  # fine enough for a p99
    rss = families["sordino_process_resident_memory_bytes"].samples[0].value
    assert rss > 10 << 20
    gpu = [name for name in families if name.startswith("sordino_gpu_")]
    assert gpu == [] or server.runtime.telemetry.resources.has_gpu  # absent, never faked
