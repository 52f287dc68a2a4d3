"""Schema-driven fuzzing: schemathesis over ``/v2/openapi.json`` against a live server.

Every operation the document lists is called with cases schemathesis generates from
its schema (path parameters, query, bodies), each sent with no key, a tenant's key or
an admin key, so the protected endpoints are exercised with and without credentials.
Half the cases name the served model, so inference and the model endpoints get past
the 404. Every answer must be no server error, a status code the document lists and,
for a 4xx, a JSON ``{"error": ...}`` that names the problem; afterwards the server still
serves. ``SORDINO_FUZZ_LONG=1`` (or ``python -m bench.fuzz --api``) runs thousands.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error, status_code_conformance

from sordino.config import load_config
from sordino.config.tenants import hash_key
from sordino.models.repository import builtin_sources
from sordino.testing import RunningServer, serve_in_thread

ADMIN_KEY = "schemathesis-admin-key-0123"
TENANT_KEY = "schemathesis-tenant-key-0123"
PROBE_KEY = "probe-key-0123456789"
SEED = 20261203  # the same cases on every run (bench/fuzz.py draws new ones)
MODEL = "simple"
SKIPPED = ("/v2/sordino/profile",)
"""Operations a fuzzer must not drive: a profile holds the model for seconds."""
CASES = 2000 if os.environ.get("SORDINO_FUZZ_LONG") else 12
"""Cases per operation (times three credentials): about 2,000 in all in CI."""


@dataclass
class ApiTally:
    """What a schemathesis run did: cases sent, status codes seen, and failures."""

    cases: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def api_config() -> Any:
    """A server with one tenant and an admin key, keys required."""
    return load_config(
        None,
        {
            "tenants": [
                {"name": "acme", "keys": [hash_key(TENANT_KEY)]},
                # Never used by the fuzzer: its breaker stays closed for the last check.
                {"name": "probe", "keys": [hash_key(PROBE_KEY)]},
            ],
            "auth": {"required": True, "admin_keys": [hash_key(ADMIN_KEY)]},
        },
    )


def fuzz_api(url: str, cases: int, run_seed: int | None = None) -> ApiTally:
    """Run schemathesis over every operation of ``url``'s OpenAPI document."""
    tally = ApiTally()
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    document = httpx.get(f"{url}/v2/openapi.json", headers=admin, timeout=30).json()
    schema = schemathesis.openapi.from_dict(document)
    credentials = st.sampled_from([None, TENANT_KEY, ADMIN_KEY, "not-a-key"])
    with httpx.Client(base_url=url, timeout=60) as client:
        for result in schema.get_all_operations():
            operation = result.ok()
            if operation.path in SKIPPED:
                continue

            @settings(
                max_examples=cases,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy(), key=credentials, served=st.booleans())
            def check(case: Any, key: str | None, served: bool) -> None:
                if served and "model" in (case.path_parameters or {}):
                    case.path_parameters["model"] = MODEL
                headers = {"Authorization": f"Bearer {key}"} if key else {}
                request = case.as_transport_kwargs(base_url=url, headers=headers)
                answer = client.request(
                    request["method"],
                    request["url"],
                    headers=request.get("headers"),
                    params=request.get("params"),
                    content=_content(request),
                )
                tally.cases += 1
                tally.statuses[answer.status_code] = tally.statuses.get(answer.status_code, 0) + 1
                where = f"{case.method} {request['url']} ({answer.status_code})"
                try:
                    case.validate_response(
                        answer, checks=[not_a_server_error, status_code_conformance]
                    )
                except Exception as error:  # schemathesis raises a group of failures
                    tally.failures.append(f"{where}: {error}"[:800])
                    return
                if 400 <= answer.status_code < 500 and answer.status_code != 404:
                    problem = _error_text(answer)
                    if not problem:
                        tally.failures.append(f"{where}: no error named: {answer.text[:200]}")

            if run_seed is None:
                check()
            else:
                seed(run_seed)(check)()
    return tally


def _content(request: dict[str, Any]) -> bytes | None:
    if request.get("json") is not None:
        import json

        return json.dumps(request["json"]).encode()
    data = request.get("data")
    if isinstance(data, str):
        return data.encode()
    return data if isinstance(data, bytes) else None


def _error_text(answer: httpx.Response) -> str:
    try:
        body = answer.json()
    except ValueError:
        return ""
    return str(body.get("error", "")) if isinstance(body, dict) else ""


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    sources = [s for s in builtin_sources() if s.name == MODEL]
    with serve_in_thread(api_config(), sources) as running:
        yield running


def test_schemathesis_finds_no_server_error(server: RunningServer) -> None:
    tally = fuzz_api(server.url, CASES, run_seed=SEED)
    assert not tally.failures, "\n".join(tally.failures[:10])
    assert tally.cases > 200
    # The cases reached past authentication and into the handlers.
    assert {200, 400, 401, 403, 404} <= set(tally.statuses), tally.statuses
    ready = httpx.get(f"{server.url}/v2/health/ready")
    assert ready.status_code == 200
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [2] * 16},
        ]
    }
    # acme's own breaker may well be open now (the fuzzer sent it bad requests in a
    # row, as it should be); another tenant is served as ever.
    answer = httpx.post(
        f"{server.url}/v2/models/{MODEL}/infer",
        json=body,
        headers={"Authorization": f"Bearer {PROBE_KEY}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [3] * 16
