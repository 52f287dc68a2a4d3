"""``sordino tenants`` against a live server: changes apply at once and are journaled."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import pytest
from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.config import load_config
from sordino.config.tenants import hash_key
from sordino.models.repository import builtin_sources
from sordino.testing import RunningServer, serve_in_thread
from tests.tenants.test_auth import BODY

ADMIN_KEY = "admin-key-for-the-cli-test"


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    config = load_config(None, {"auth": {"required": True, "admin_keys": [hash_key(ADMIN_KEY)]}})
    sources = [s for s in builtin_sources() if s.name == "simple"]
    with serve_in_thread(config, sources) as running:
        yield running


def _run(server: RunningServer, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["tenants", *args, "--url", server.url, "--token", ADMIN_KEY])
    return result.exit_code, result.stdout, result.stderr


def _infer(server: RunningServer, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    url = f"{server.url}/v2/models/simple/infer"
    return httpx.post(url, json=BODY, headers=headers, timeout=30).status_code


def test_add_key_use_revoke(server: RunningServer) -> None:
    code, out, err = _run(server, "add", "studio", "--weight", "2", "--rate", "100/s")
    assert code == 0, err
    assert "studio: weight 2, rate 100/s" in out
    code, out, err = _run(server, "add-key", "studio")
    assert code == 0, err
    key = out.strip()
    assert key.startswith("sk-") and "shown once" in err
    assert _infer(server, key) == 200
    # Only the hash is kept: the listing shows a key id, never the key.
    code, out, _ = _run(server, "list")
    assert code == 0 and key not in out
    key_id = hash_key(key)[7:19]
    assert key_id in out and "1 admitted" in out
    code, out, _ = _run(server, "set", "studio", "--max-concurrency", "3")
    assert code == 0 and "max_concurrency 3" in out
    code, out, err = _run(server, "set", "studio", "--breaker-failures", "3")
    assert code == 0, err
    assert "opens after 3 failures for 10 s" in out  # the cooldown kept from the default
    code, out, err = _run(server, "set", "studio", "--breaker-cooldown", "30s")
    assert code == 0 and "opens after 3 failures for 30 s" in out, err
    code, _, err = _run(server, "set", "studio", "--breaker-cooldown", "soon")
    assert code == 1 and "breaker.cooldown" in err, err
    code, out, err = _run(server, "revoke-key", "studio", key_id)
    assert code == 0, err
    assert _infer(server, key) == 401
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        metadata = (("authorization", f"Bearer {key}"),)
        with pytest.raises(grpc.RpcError) as caught:
            channel.unary_unary("/inference.GRPCInferenceService/ServerMetadata")(
                b"", metadata=metadata, timeout=10
            )
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    calls = [e for e in server.runtime.events.recent("admin_call") if e.subject == "tenant:studio"]
    actions = ["add", "add-key", "set", "set", "set", "set", "revoke-key"]
    assert [e.payload["action"] for e in calls] == actions
    # The refused breaker setting is journaled too, as refused.
    assert [e.payload["outcome"] == "ok" for e in calls] == [True] * 5 + [False, True]


def test_bad_input_names_the_problem(server: RunningServer) -> None:
    code, _, err = _run(server, "add", "bad name!")
    assert code == 1 and "name" in err and "Traceback" not in err
    code, _, err = _run(server, "set", "nobody", "--weight", "2")
    assert code == 1 and "no tenant 'nobody'" in err
    code, _, err = _run(server, "add", "ok-name", "--rate", "fast")
    assert code == 1 and "800/s" in err
    code, _, err = _run(server, "set", "ok-name")
    assert code == 2 and "nothing to set" in err


def test_a_tenant_key_cannot_manage_tenants(server: RunningServer) -> None:
    code, out, err = _run(server, "add", "other")
    assert code == 0, err
    code, out, _ = _run(server, "add-key", "other")
    key = out.strip()
    result = CliRunner().invoke(cli, ["tenants", "list", "--url", server.url, "--token", key])
    assert result.exit_code == 1 and "403" in result.stderr
