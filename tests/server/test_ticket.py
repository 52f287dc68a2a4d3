"""A ticket gives back what an admitted request holds exactly once, however often asked."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sordino.admission.chain import AdmissionContext
from sordino.config import validate_config
from sordino.config.tenants import hash_key
from sordino.inference import InferRequest
from sordino.records import QueueSettings
from sordino.server.runtime import Runtime
from sordino.server.ticket import Tickets


def _runtime() -> Runtime:
    config = validate_config(
        {"tenants": [{"name": "acme", "keys": [hash_key("acme-key-0123456789")],
                      "max_concurrency": 1}]}
    )  # fmt: skip
    return Runtime(config, [])


def _tenant_requests(runtime: Runtime, outcome: str) -> int:
    text = generate_latest(runtime.metrics.registry).decode()
    for family in text_string_to_metric_families(text):
        if family.name == "sordino_tenant_requests":
            return sum(
                int(s.value)
                for s in family.samples
                if s.name.endswith("_total") and s.labels.get("outcome") == outcome
            )
    return 0


def _admitted(runtime: Runtime) -> AdmissionContext:
    context = AdmissionContext(
        model="simple", settings=QueueSettings(), priority_rules={}, tenant="acme"
    )
    runtime.tenants(InferRequest(model="simple", inputs={}), context)  # takes the slot
    assert context.slot
    return context


def test_a_finished_request_gives_back_its_slot_and_is_counted_once() -> None:
    runtime = _runtime()
    tickets = Tickets(runtime.telemetry, tenants=runtime.tenants)
    ticket = tickets.issue("simple", _admitted(runtime))
    assert runtime.tenants.describe("acme")["in_flight"] == 1
    ticket.release("success")
    ticket.release("failure")  # a second way out: nothing more
    assert runtime.tenants.describe("acme")["in_flight"] == 0
    assert _tenant_requests(runtime, "success") == 1
    assert _tenant_requests(runtime, "failure") == 0
    # The slot is free again: the tenant's one concurrent request may be admitted.
    _admitted(runtime)


def test_a_request_refused_after_admission_is_left_to_the_refusal_count() -> None:
    runtime = _runtime()
    tickets = Tickets(runtime.telemetry, tenants=runtime.tenants)
    ticket = tickets.issue("simple", _admitted(runtime))
    ticket.release(None)  # refused (a full queue): the service counts it as rejected
    ticket.release("cancelled")
    assert runtime.tenants.describe("acme")["in_flight"] == 0
    assert _tenant_requests(runtime, "cancelled") == 0
    assert runtime.tenants.describe("acme")["breaker"] == "closed"
