"""Client-chosen model names and tenants never grow /metrics: one ``other`` label each.

The drill sent 60,000 made-up model names: every one became a permanent series
(+89 MB, a 29.6 MB /metrics). Only loaded models and configured tenants are labels.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sordino.config import RuntimeConfig
from sordino.models.repository import builtin_sources
from sordino.telemetry.labels import OTHER, MetricLabels
from sordino.telemetry.metrics import Metrics
from sordino.testing import RunningServer, serve_in_thread

MANY = 300
BODY = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    config = RuntimeConfig.model_validate({"telemetry": {"tenant_labels": ["acme"]}})
    digits = [s for s in builtin_sources() if s.name == "digits-classifier"]
    with serve_in_thread(config, digits) as running:
        yield running


def _series(text: str, family: str) -> list[dict[str, str]]:
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return [s.labels for s in families[family].samples if s.name.endswith("_total")]


def _keys(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_made_up_tenants_share_one_label(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for i in range(MANY):
            tenant = "acme" if i % 10 == 0 else f"tenant-{i}"
            response = client.post(
                "/v2/models/digits-classifier/infer",
                json=BODY | {"parameters": {"tenant": tenant}} if i % 2 else BODY,
                headers={"x-sordino-tenant": tenant} if not i % 2 else {},
            )
            assert response.status_code == 200
        # Refused requests (a wrong input name) of made-up tenants too.
        for i in range(MANY // 3):
            bad = {"inputs": [{**BODY["inputs"][0], "name": "nope"}]}
            response = client.post(
                "/v2/models/digits-classifier/infer",
                json=bad,
                headers={"x-sordino-tenant": f"bad-{i}"},
            )
            assert response.status_code == 400
        text = client.get("/metrics").text
    series = _series(text, "sordino_tenant_requests")
    assert {labels["tenant"] for labels in series} == {"acme", OTHER}
    assert len(series) <= 2 * 3 * 4  # tenants x priorities x outcomes, whatever was sent
    by_tenant = {t: 0.0 for t in ("acme", OTHER)}
    for sample in text_string_to_metric_families(text):
        if sample.name == "sordino_tenant_requests":
            for s in sample.samples:
                if s.name.endswith("_total"):
                    by_tenant[s.labels["tenant"]] += s.value
    assert by_tenant == {"acme": MANY / 10, OTHER: MANY - MANY / 10 + MANY // 3}
    assert "tenant-1" not in text and "bad-1" not in text


def test_made_up_model_names_share_one_label(server: RunningServer) -> None:
    """Whatever path counts a refusal for an unknown model, its label is ``other``."""
    before = _keys(httpx.get(server.url + "/metrics").text)
    for i in range(MANY):
        server.runtime.metrics.request_rejected(f"no-such-model-{i}", "not_found")
        server.runtime.telemetry.request_finished(f"no-such-model-{i}", "default", 0, "rejected")
    text = httpx.get(server.url + "/metrics").text
    assert "no-such-model" not in text
    rejected = _series(text, "sordino_rejected_requests")
    assert {labels["model"] for labels in rejected} <= {"digits-classifier", OTHER}
    # One new series a family (requests, rejected, tenant requests), not three
    # hundred. Series of the loaded model or of no model at all (the samplers that
    # run once a second) may appear meanwhile: CI saw them land between the scrapes.
    new = {
        key
        for key in _keys(text) - before
        if dict(key[1]).get("model") not in (None, "digits-classifier")
    }
    assert {dict(labels)["model"] for _, labels in new} == {OTHER}
    families = {name.removesuffix("_created").removesuffix("_total") for name, _ in new}
    assert len(new) <= 2 * len(families) <= 2 * 3  # a _total and a _created each
    tenant_models = {labels["model"] for labels in _series(text, "sordino_tenant_requests")}
    assert tenant_models <= {"digits-classifier", OTHER}


def test_a_loaded_model_keeps_its_name() -> None:
    loaded = {"digits"}
    labels = MetricLabels(loaded.__contains__, tenants=("acme",))
    metrics = Metrics(labels)
    metrics.request_rejected("digits", "bad_tensor")
    metrics.request_rejected("made-up", "not_found")
    metrics.request_rejected("made-up-too", "not_found")
    models = {
        labels["model"]
        for labels in _series(metrics.exposition().decode(), "sordino_rejected_requests")
    }
    assert models == {"digits", OTHER}
    assert (labels.tenant("default"), labels.tenant("acme"), labels.tenant("x")) == (
        "default",
        "acme",
        OTHER,
    )
