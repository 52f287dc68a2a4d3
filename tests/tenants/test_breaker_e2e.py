"""A chaos fault scoped to tenant A: A's breaker opens, B is unaffected (a real server)."""

from __future__ import annotations

import asyncio

import httpx
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from sordino.admission.tenants import BREAKER_FAILURES
from sordino.cli.main import cli
from sordino.config import load_config
from sordino.config.tenants import hash_key
from sordino.models.repository import builtin_sources
from sordino.testing import serve_in_thread
from tests.tenants.test_auth import BODY

A_KEY = "breaker-a-key-012345"
B_KEY = "breaker-b-key-012345"
ADMIN_KEY = "breaker-admin-key-0123"


def test_a_tenant_scoped_fault_trips_only_that_tenants_breaker() -> None:
    config = load_config(
        None,
        {
            "tenants": [
                {"name": "a", "keys": [hash_key(A_KEY)]},
                {"name": "b", "keys": [hash_key(B_KEY)]},
            ],
            "auth": {"required": True, "admin_keys": [hash_key(ADMIN_KEY)]},
        },
    )
    sources = [s for s in builtin_sources() if s.name == "simple"]
    with serve_in_thread(config, sources) as server:
        command = ["chaos", "inject", "--target", "worker:simple", "--fault", "error"]
        command += ["--tenant", "a", "--url", server.url, "--token", ADMIN_KEY]
        injected = CliRunner().invoke(cli, command)
        assert injected.exit_code == 0, injected.output
        assert "only tenant a" in injected.stdout
        url = f"{server.url}/v2/models/simple/infer"

        async def round_of(client: httpx.AsyncClient) -> list[tuple[str, int, str]]:
            async def one(name: str, key: str) -> tuple[str, int, str]:
                answer = await client.post(
                    url, json=BODY, headers={"Authorization": f"Bearer {key}"}
                )
                return name, answer.status_code, answer.text

            # Sent together, so A's and B's requests may share a batch.
            calls = [one("a", A_KEY), one("b", B_KEY), one("b", B_KEY)]
            return list(await asyncio.gather(*calls))

        async def run() -> list[tuple[str, int, str]]:
            async with httpx.AsyncClient(timeout=30) as client:
                answers = []
                for _ in range(BREAKER_FAILURES + 2):
                    answers += await round_of(client)
                return answers

        answers = asyncio.run(run())
        state = server.runtime.tenants.describe("a")
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        exposition = httpx.get(f"{server.url}/metrics", headers=admin).text
        own = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {B_KEY}"}).text
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }
    assert samples[("sordino_tenant_breaker_open", (("tenant", "a"),))] == 1.0
    assert samples[("sordino_tenant_breaker_open", (("tenant", "b"),))] == 0.0
    assert samples[("sordino_tenant_breaker_trips_total", (("tenant", "a"),))] == 1.0
    refused = (("limit", "breaker"), ("tenant", "a"))
    assert samples[("sordino_tenant_refused_total", refused)] >= 1
    # B's key reads B's series only.
    assert 'tenant="b"' in own and 'tenant="a"' not in own
    b = [status for name, status, _ in answers if name == "b"]
    assert b == [200] * len(b), answers
    a = [(status, text) for name, status, text in answers if name == "a"]
    assert all(status >= 500 for status, _ in a), a
    assert all(status != 503 for status, _ in a[:BREAKER_FAILURES]), a
    assert a[-1][0] == 503 and "breaker is open" in a[-1][1], a[-1]
    assert state["breaker"] == "open" and state["breaker_trips"] == 1
    assert state["refused_breaker"] >= 1
