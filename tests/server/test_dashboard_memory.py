"""The dashboard's memory view in a real headless Chromium: tiers, owners, workers, pool."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sordino.config import RuntimeConfig
from sordino.config.memory import MemoryConfig
from sordino.models.repository import builtin_sources
from sordino.testing import RunningServer, serve_in_thread

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Debian's chromium (.ci/run installs it)"
)


@pytest.fixture(scope="module")
def tiered_server() -> Iterator[RunningServer]:
    config = RuntimeConfig(
        memory=MemoryConfig(
            strategy="fragmentation_aware",
            pool_size="16MB",
            quotas=[{"tenant": "gold", "max": "4MB"}],
        )
    )
    with serve_in_thread(
        config, [s for s in builtin_sources() if s.name == "digits-classifier"]
    ) as s:
        yield s


@pytest.mark.timeout(90)
def test_the_memory_view_shows_tiers_owners_and_workers(tiered_server: RunningServer) -> None:
    from playwright.sync_api import sync_playwright

    server = tiered_server
    body = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [2, 64],
                        "data": [1.0] * 128}], "parameters": {"tenant": "gold"}}  # fmt: skip
    for _ in range(3):
        r = httpx.post(f"{server.url}/v2/models/digits-classifier/infer", json=body, timeout=30)
        assert r.status_code == 200
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            page.goto(f"{server.url}/dashboard")
            page.wait_for_function(
                "window.sordino && window.sordino.memoryUpdates >= 1", timeout=30000
            )
            rows = page.evaluate(
                """() => Array.from(document.querySelectorAll("#memory-table tbody tr")).map(
                    (tr) => Array.from(tr.children).map((td) => td.textContent))"""
            )
            pool = page.evaluate("() => document.getElementById('memory-pool').textContent")
        finally:
            browser.close()
    assert problems == []
    parts = {(row[0], row[1]) for row in rows}
    assert ("tier", "medium/short") in parts or any(p[0] == "tier" for p in parts), rows
    assert ("owner", "gold") in parts, rows
    gold = next(row for row in rows if row[:2] == ["owner", "gold"])
    assert gold[3] == "4.0 MiB"  # its quota
    assert any(row[0] == "worker" and "MiB" in row[2] for row in rows), rows
    assert any(row[0] == "arena" for row in rows)
    assert "16.0 MiB fixed" in pool and "fragmentation_aware" in pool
