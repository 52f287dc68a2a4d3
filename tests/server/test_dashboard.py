"""The web dashboard in a real headless Chromium: loads cleanly, charts the traffic sent."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from sordino.testing import RunningServer
from tests.waiting import wait_for_closed_second

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Debian's chromium (.ci/run installs it)"
)


def _send(url: str, model_rows: int, seconds: float) -> int:
    body = {
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [model_rows, 64],
                    "data": [1.0] * 64 * model_rows}]
    }  # fmt: skip
    sent = 0
    end = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=30) as client:
        while time.monotonic() < end:
            assert client.post("/v2/models/digits-classifier/infer", json=body).status_code == 200
            sent += 1
    return sent


def test_dashboard_assets_are_served_without_a_cdn(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url) as client:
        page = client.get("/dashboard")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert "http://" not in page.text and "https://" not in page.text
        for asset in ("uplot.iife.min.js", "uplot.min.css", "dashboard.js", "dashboard.css"):
            assert client.get(f"/dashboard/static/{asset}").status_code == 200
        assert client.get("/dashboard/static/..%2Fobserve.py").status_code == 404


@pytest.mark.timeout(90)
def test_dashboard_charts_the_traffic_just_sent(server: RunningServer) -> None:
    from playwright.sync_api import sync_playwright

    sent = _send(server.url, 3, 2.5)
    wait_for_closed_second(server)
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            page.goto(f"{server.url}/dashboard")
            page.wait_for_function("window.sordino && window.sordino.updates >= 2", timeout=30000)
            charted = page.evaluate(
                """() => {
                    const chart = window.sordino.charts.qps;
                    const i = chart.series.findIndex((s) => s.label === "digits-classifier");
                    const batch = window.sordino.charts.batch;
                    const j = batch.series.findIndex((s) => s.label === "digits-classifier");
                    return {
                        requests: chart.data[i].reduce((a, v) => a + (v || 0), 0),
                        batch: Math.max(...batch.data[j].map((v) => v || 0)),
                        canvases: document.querySelectorAll("canvas").length,
                        events: document.querySelectorAll("#events tbody tr").length,
                    };
                }"""
            )
            shot = os.environ.get("SORDINO_DASHBOARD_SCREENSHOT")
            if shot:
                page.screenshot(path=shot, full_page=True)
        finally:
            browser.close()
    assert problems == []
    assert charted["requests"] >= sent  # the session server may have served others too
    assert charted["batch"] >= 3
    assert charted["canvases"] >= 6 and charted["events"] >= 1


def _luminance(rgb: str) -> float:
    """WCAG relative luminance of a computed ``rgb(r, g, b)`` colour."""
    channels = [int(v) / 255 for v in rgb[rgb.index("(") + 1 : rgb.index(")")].split(",")[:3]]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


@pytest.mark.timeout(90)
def test_header_links_are_legible_on_the_navy_header(server: RunningServer) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            for path in ("/dashboard", "/dashboard/playground"):
                page.goto(f"{server.url}{path}")
                colours = page.evaluate(
                    "() => ({link: getComputedStyle(document.querySelector('header a')).color,"
                    " header: getComputedStyle(document.querySelector('header'))"
                    ".backgroundColor})"
                )
                # Not the browser's default link blue (or visited purple) ...
                assert colours["link"] not in ("rgb(0, 0, 238)", "rgb(85, 26, 139)"), colours
                # ... and WCAG AA contrast for normal text against the header.
                light, dark = sorted(map(_luminance, colours.values()), reverse=True)
                assert (light + 0.05) / (dark + 0.05) >= 4.5, (path, colours)
        finally:
            browser.close()
