"""``/v2/openapi.json`` lists every route, and every listed operation answers without a 5xx.

A schema-driven sweep in the spirit of schemathesis (not a dependency): each operation
of the document is called with its path parameters filled and an empty JSON body (and,
for inference, a body the schema allows but the model refuses).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from sordino.config import load_config
from sordino.config.tenants import hash_key
from sordino.models.repository import builtin_sources
from sordino.testing import RunningServer, serve_in_thread

ADMIN_KEY = "openapi-admin-key-0123"
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
FILL = {"model": "simple", "version": "1", "name": "nobody", "key_id": "0000", "id": "x"}


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    config = load_config(None, {"auth": {"required": True, "admin_keys": [hash_key(ADMIN_KEY)]}})
    with serve_in_thread(config, [s for s in builtin_sources() if s.name == "simple"]) as running:
        yield running


def test_the_document_lists_the_routes(server: RunningServer) -> None:
    assert httpx.get(f"{server.url}/v2/openapi.json").status_code == 401
    document = httpx.get(f"{server.url}/v2/openapi.json", headers=AUTH).json()
    assert document["openapi"] == "3.1.0"
    paths = document["paths"]
    for expected in (
        "/v2/models/{model}/infer",
        "/v2/health/ready",
        "/v2/admin/tenants",
        "/v2/admin/tenants/{name}/keys/{key_id}",
        "/v2/openapi.json",
        "/metrics",
    ):
        assert expected in paths, expected
    infer = paths["/v2/models/{model}/infer"]["post"]
    assert infer["requestBody"]["content"]["application/json"]["schema"]["required"] == ["inputs"]
    # The admin API's bodies are the pydantic models its handlers validate with.
    add = paths["/v2/admin/tenants"]["post"]
    schema = add["requestBody"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["name"] and "weight" in schema["properties"]
    assert schema["additionalProperties"] is False
    breaker = schema["properties"]["breaker"]["anyOf"][0]["$ref"]
    assert breaker == "#/components/schemas/BreakerConfig"
    assert "cooldown" in document["components"]["schemas"]["BreakerConfig"]["properties"]
    assert "201" in add["responses"] and "200" not in add["responses"]
    change = paths["/v2/admin/tenants/{name}"]["patch"]
    partial = change["requestBody"]["content"]["application/json"]["schema"]
    assert "required" not in partial and "name" not in partial["properties"]
    assert {"weight", "breaker"} <= set(partial["properties"])
    assert {"400", "401", "403", "404", "429", "503"} <= set(infer["responses"])


def test_every_operation_answers_without_a_server_error(server: RunningServer) -> None:
    document = httpx.get(f"{server.url}/v2/openapi.json", headers=AUTH).json()
    calls = 0
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as client:
        for path, operations in document["paths"].items():
            url = path.format(**FILL)
            for method in operations:
                if path.endswith("/unload") or path.endswith("/profile"):
                    continue  # would stop the model or profile for seconds: not a sweep
                bodies = [b"{}"]
                if path.endswith("/infer"):
                    bodies.append(b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}')
                for body in bodies if method in ("post", "patch") else [None]:
                    answer = client.request(method.upper(), url, content=body)
                    calls += 1
                    assert answer.status_code < 500, (
                        method,
                        url,
                        answer.status_code,
                        answer.text,
                    )
    assert calls > 30
    ready = httpx.get(f"{server.url}/v2/health/ready")
    assert ready.status_code == 200
