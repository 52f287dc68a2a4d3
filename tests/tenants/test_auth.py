"""API keys, admin keys and per-tenant limits over HTTP and gRPC, on a real server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from sordino.admission import tenants as tenants_module
from sordino.cli.monitor_view import tenant_lines
from sordino.config import load_config
from sordino.config.tenants import hash_key
from sordino.models.repository import builtin_sources
from sordino.testing import RunningServer, serve_in_thread

ACME_KEY = "acme-key-0123456789"
SMALL_KEY = "small-key-0123456789"
ADMIN_KEY = "admin-key-0123456789"
TINY_KEY = "tiny-key-0123456789"
BODY = {
    "inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
    ]
}


def _config(**extra: Any) -> Any:
    return load_config(
        None,
        {
            "tenants": [
                {
                    "name": "acme",
                    "keys": [hash_key(ACME_KEY)],
                    "weight": 4,
                    "max_priority": "normal",
                },
                {"name": "small", "keys": [hash_key(SMALL_KEY)], "rate": "2/s", "burst": 3},
                {"name": "tiny", "keys": [hash_key(TINY_KEY)], "memory_quota": 64},
            ],
            "auth": {"required": True, "admin_keys": [hash_key(ADMIN_KEY)]},
            **extra,
        },
    )


def _simple() -> list[Any]:
    return [s for s in builtin_sources() if s.name == "simple"]


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with serve_in_thread(_config(), _simple()) as running:
        yield running


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _infer(server: RunningServer, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v2/models/simple/infer", json=BODY, headers=headers, timeout=30
    )


def test_http_keys(server: RunningServer) -> None:
    ok = _infer(server, _auth(ACME_KEY))
    assert ok.status_code == 200, ok.text
    assert ok.json()["outputs"][0]["data"] == [i + 1 for i in range(16)]
    missing = _infer(server, {})
    assert missing.status_code == 401 and "requires an API key" in missing.json()["error"]
    wrong = _infer(server, _auth("not-a-key-at-all"))
    assert wrong.status_code == 401 and "wrong or revoked" in wrong.json()["error"]
    malformed = _infer(server, {"Authorization": "Basic abc"})
    assert malformed.status_code == 401 and "Bearer" in malformed.json()["error"]


def test_a_key_decides_the_tenant_not_the_header(server: RunningServer) -> None:
    before = server.runtime.tenants.describe("small")["requests"]
    claimed = _infer(server, {**_auth(ACME_KEY), "X-Sordino-Tenant": "small"})
    assert claimed.status_code == 200
    assert server.runtime.tenants.describe("small")["requests"] == before


def test_admin_endpoints_want_an_admin_key(server: RunningServer) -> None:
    url = f"{server.url}/v2/admin/chaos"
    assert httpx.get(url, headers=_auth(ADMIN_KEY)).status_code == 200
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers=_auth("wrong-key-123456")).status_code == 401
    tenant = httpx.get(url, headers=_auth(ACME_KEY))
    assert tenant.status_code == 403 and "tenant's, not an admin's" in tenant.json()["error"]
    # Model control and the journal follow the same rule: no loopback exception with keys.
    index = f"{server.url}/v2/repository/index"
    assert httpx.post(index).status_code == 401
    assert httpx.post(index, headers=_auth(ACME_KEY)).status_code == 403
    assert httpx.post(index, headers=_auth(ADMIN_KEY)).status_code == 200


def _grpc_auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}  # gRPC metadata keys are lower case


def _grpc_inputs() -> list[grpcclient.InferInput]:
    inputs = []
    for name, data in (("INPUT0", np.arange(16)), ("INPUT1", np.ones(16))):
        tensor = grpcclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(data.astype(np.int32).reshape(1, 16))
        inputs.append(tensor)
    return inputs


def test_grpc_keys(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        result = client.infer("simple", _grpc_inputs(), headers=_grpc_auth(ACME_KEY))
        assert result.as_numpy("OUTPUT0").tolist() == [[i + 1 for i in range(16)]]
        for headers in ({}, _grpc_auth("wrong-key-123456")):
            with pytest.raises(InferenceServerException) as caught:
                client.infer("simple", _grpc_inputs(), headers=headers)
            assert caught.value.status() == "StatusCode.UNAUTHENTICATED"
        with pytest.raises(InferenceServerException) as caught:
            client.get_model_repository_index(headers=_grpc_auth(SMALL_KEY))
        assert caught.value.status() == "StatusCode.PERMISSION_DENIED"
        client.get_model_repository_index(headers=_grpc_auth(ADMIN_KEY))
        # Health needs no key; metadata, config and statistics do.
        assert client.is_server_live() and client.is_server_ready()
        with pytest.raises(InferenceServerException) as caught:
            client.get_server_metadata()
        assert caught.value.status() == "StatusCode.UNAUTHENTICATED"
        with pytest.raises(InferenceServerException) as caught:
            client.get_model_metadata("simple", headers=_grpc_auth("wrong-key-123456"))
        assert caught.value.status() == "StatusCode.UNAUTHENTICATED"
        assert client.get_model_metadata("simple", headers=_grpc_auth(SMALL_KEY)).name == "simple"
        client.get_inference_statistics("simple", headers=_grpc_auth(SMALL_KEY))
    finally:
        client.close()


def test_a_request_key_is_hashed_once(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One authentication a request, over HTTP (where auth.required checks the key before
    the model is looked up) and gRPC: the service keeps the tenant it found."""
    hashed: list[str] = []

    def counting(key: str) -> str:
        hashed.append(key)
        return hash_key(key)

    monkeypatch.setattr(tenants_module, "hash_key", counting)
    assert _infer(server, _auth(ACME_KEY)).status_code == 200
    assert hashed == [ACME_KEY]
    hashed.clear()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    try:
        client.infer("simple", _grpc_inputs(), headers=_grpc_auth(ACME_KEY))
    finally:
        client.close()
    assert hashed == [ACME_KEY]


def test_rate_limit_answers_429_with_retry_after(server: RunningServer) -> None:
    answers = [_infer(server, _auth(SMALL_KEY)) for _ in range(8)]
    statuses = [a.status_code for a in answers]
    assert statuses.count(200) >= 3, statuses  # the burst
    limited = [a for a in answers if a.status_code == 429]
    assert limited, statuses
    assert int(limited[0].headers["Retry-After"]) >= 1
    assert "over its rate" in limited[0].json()["error"]
    # The other tenant is not limited by it.
    assert _infer(server, _auth(ACME_KEY)).status_code == 200


def test_max_priority_caps_a_claim(server: RunningServer) -> None:
    body = {**BODY, "parameters": {"priority": "high"}}
    before = server.runtime.tenants.describe("acme")["requests"]
    answer = httpx.post(
        f"{server.url}/v2/models/simple/infer", json=body, headers=_auth(ACME_KEY), timeout=30
    )
    assert answer.status_code == 200
    assert server.runtime.tenants.describe("acme")["requests"] == before + 1


def test_auth_required_covers_every_endpoint_but_health(server: RunningServer) -> None:
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200
    for path in ("/v2", "/v2/models/simple", "/metrics", "/v2/models/stats"):
        refused = httpx.get(server.url + path)
        assert refused.status_code == 401, path
        assert refused.headers["WWW-Authenticate"] == "Bearer"
        assert httpx.get(server.url + path, headers=_auth(SMALL_KEY)).status_code == 200
    assert httpx.get(f"{server.url}/v2", headers=_auth("wrong-key-1234")).status_code == 401


def test_a_tenant_reads_only_its_own_figures(server: RunningServer) -> None:
    assert _infer(server, _auth(ACME_KEY)).status_code == 200
    own = httpx.get(f"{server.url}/metrics", headers=_auth(SMALL_KEY)).text
    assert 'tenant="small"' in own  # its requests of the tests above
    assert 'tenant="acme"' not in own
    everyone = httpx.get(f"{server.url}/metrics", headers=_auth(ADMIN_KEY)).text
    assert 'tenant="acme"' in everyone
    me = httpx.get(f"{server.url}/v2/tenants/me", headers=_auth(ACME_KEY))
    assert me.status_code == 200 and me.json()["name"] == "acme"
    assert me.json()["requests"] >= 1 and "in_flight" in me.json()
    assert httpx.get(f"{server.url}/v2/admin/tenants", headers=_auth(ACME_KEY)).status_code == 403
    listed = httpx.get(f"{server.url}/v2/admin/tenants", headers=_auth(ADMIN_KEY)).json()
    assert {t["name"] for t in listed["tenants"]} == {"acme", "small", "tiny"}
    # Only key ids are shown, never the stored hashes.
    assert hash_key(ACME_KEY) not in str(listed)


def test_a_cached_answer_still_wants_the_key(server: RunningServer) -> None:
    cache = server.runtime.result_cache
    cache.enable("simple", True)
    try:
        assert _infer(server, _auth(ACME_KEY)).status_code == 200
        assert _infer(server, _auth(ACME_KEY)).status_code == 200  # from the cache
        assert len(cache._entries) >= 1
        assert _infer(server, _auth("wrong-key-1234")).status_code == 401
        assert _infer(server, {}).status_code == 401
    finally:
        cache.enable("simple", False)


def test_blocks_are_zeroed_between_tenants(server: RunningServer) -> None:
    assert server.runtime.config.memory.zeroes_on_free


def test_memory_quota_is_the_tenants_memory_quota(server: RunningServer) -> None:
    answer = _infer(server, _auth(TINY_KEY))
    assert answer.status_code == 400
    assert "more than the whole quota of tenant 'tiny'" in answer.json()["error"]
    assert _infer(server, _auth(ACME_KEY)).status_code == 200


def test_the_monitor_shows_tenants_to_whom_may_see_them(server: RunningServer) -> None:
    url = f"{server.url}/v2/sordino/telemetry"
    everyone = httpx.get(url, headers=_auth(ADMIN_KEY)).json()["tenants"]
    assert {t["tenant"] for t in everyone} == {"acme", "small", "tiny"}
    own = httpx.get(url, headers=_auth(SMALL_KEY)).json()
    assert [t["tenant"] for t in own["tenants"]] == ["small"]
    lines = tenant_lines(own)
    assert len(lines) == 1 and lines[0].startswith("tenant small (weight 1):")
    assert "refused" in lines[0] and "breaker closed" in lines[0]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory_regions_belong_to_the_key_not_a_claimed_tenant(
    server: RunningServer, protocol: str
) -> None:
    """acme registers a region; small, claiming to be acme by header, can neither see
    nor use it; acme can (its key, not the header, names the tenant)."""
    import os

    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    key = f"/sordino_test_tenant_{os.getpid()}_{protocol}"
    handle = shm.create_shared_memory_region("acme_in", key, 128)
    shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.int32), np.ones(16, np.int32)])
    claimed = {"x-sordino-tenant": "acme"}
    try:
        if protocol == "http":
            acme: Any = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
            small: Any = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
            mod: Any = httpclient
        else:
            acme = grpcclient.InferenceServerClient(server.grpc_url)
            small = grpcclient.InferenceServerClient(server.grpc_url)
            mod = grpcclient
        as_acme = {"authorization": f"Bearer {ACME_KEY}"}  # gRPC wants lower-case keys
        as_small = {"authorization": f"Bearer {SMALL_KEY}", **claimed}
        acme.register_system_shared_memory("acme_in", key, 128, headers=as_acme)
        try:
            seen = small.get_system_shared_memory_status(headers=as_small)
            names = [r["name"] for r in seen] if protocol == "http" else list(seen.regions)
            assert "acme_in" not in names

            def request() -> list[Any]:
                inputs = [mod.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]
                inputs[0].set_shared_memory("acme_in", 64, 0)
                inputs[1].set_shared_memory("acme_in", 64, 64)
                return inputs

            with pytest.raises(InferenceServerException, match="acme_in"):
                small.infer("simple", request(), headers=as_small)
            answer = acme.infer("simple", request(), headers=as_acme)
            assert answer.as_numpy("OUTPUT0").tolist() == [list(range(1, 17))]
        finally:
            acme.unregister_system_shared_memory(headers=as_acme)
            acme.close()
            small.close()
    finally:
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_tenant_cannot_take_or_drop_another_tenants_region(
    server: RunningServer, protocol: str
) -> None:
    """small can neither register the object acme holds (by its key), nor see acme's
    region by name, nor drop it by unregistering (success, as Triton answers an unknown
    name, but acme's region stays); once acme lets go, small may register the object."""
    import os

    import tritonclient.http as httpclient
    import tritonclient.utils.shared_memory as shm

    key = f"/sordino_test_take_{os.getpid()}_{protocol}"
    handle = shm.create_shared_memory_region("acme_in", key, 128)
    shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.int32), np.ones(16, np.int32)])
    as_acme = {"authorization": f"Bearer {ACME_KEY}"}
    as_small = {"authorization": f"Bearer {SMALL_KEY}"}
    if protocol == "http":
        client: Any = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        mod: Any = httpclient
    else:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        mod = grpcclient
    try:
        client.register_system_shared_memory("acme_in", key, 128, headers=as_acme)
        with pytest.raises(InferenceServerException, match="already registered by another"):
            client.register_system_shared_memory("mine", key, 128, headers=as_small)
        with pytest.raises(InferenceServerException, match="Unable to find system shared"):
            client.get_system_shared_memory_status("acme_in", headers=as_small)
        client.unregister_system_shared_memory("acme_in", headers=as_small)
        client.unregister_system_shared_memory(headers=as_small)
        inputs = [mod.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]
        inputs[0].set_shared_memory("acme_in", 64, 0)
        inputs[1].set_shared_memory("acme_in", 64, 64)
        answer = client.infer("simple", inputs, headers=as_acme)
        assert answer.as_numpy("OUTPUT0").tolist() == [list(range(1, 17))]
        client.unregister_system_shared_memory(headers=as_acme)
        client.register_system_shared_memory("mine", key, 128, headers=as_small)
        client.unregister_system_shared_memory(headers=as_small)
    finally:
        client.close()
        shm.destroy_shared_memory_region(handle)
