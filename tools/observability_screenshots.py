"""Regenerate the observability screenshots in docs/images/.

Serves the built-in models with a journal, sends traffic for about 40 s with a real
10 s latency fault (+120 ms, injected through the admin API on the digits classifier's
worker) in the middle, then captures:

- docs/images/dashboard.png       /dashboard in headless Chromium
- docs/images/monitor.png         the `sordino monitor` live view (rich's HTML export, in Chromium)
- docs/images/diagnose-report.png the first pages of `sordino diagnose` as HTML (Chromium)
- docs/images/diagnose-pdf.png    page 1 of the PDF report (pdftoppm)

Needs Debian's chromium and poppler-utils: `python tools/observability_screenshots.py`.
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
from click.testing import CliRunner
from playwright.sync_api import sync_playwright
from rich.console import Console
from rich.terminal_theme import MONOKAI

from sordino.cli.main import cli
from sordino.cli.monitor_view import live_view
from sordino.config import RuntimeConfig
from sordino.control.client import AdminClient
from sordino.testing import serve_in_thread

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"
TOKEN = "screenshots-admin-token"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def _traffic(url: str, stop: threading.Event, rows: int, pause: float) -> None:
    digits = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [rows, 64],
                          "data": [1.0] * 64 * rows}]}  # fmt: skip
    simple = {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": [1] * 16}
                         for n in ("INPUT0", "INPUT1")]}  # fmt: skip
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            client.post("/v2/models/digits-classifier/infer", json=digits)
            client.post("/v2/models/simple/infer", json=simple)
            time.sleep(pause)


def main() -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    data_dir = Path(tempfile.mkdtemp(prefix="sordino-shots-"))
    config = RuntimeConfig.model_validate({"server": {"admin_token": TOKEN}})
    stop = threading.Event()
    with serve_in_thread(config, data_dir=data_dir) as server:
        threads = [
            threading.Thread(target=_traffic, args=(server.url, stop, rows, pause))
            for rows, pause in ((1, 0.01), (3, 0.02), (2, 0.005))
        ]
        for thread in threads:
            thread.start()
        time.sleep(15)
        AdminClient(server.url, TOKEN).inject(
            "worker:digits-classifier", "latency", latency="120ms", duration="10s"
        )
        time.sleep(25)
        # Stop the load first: Chromium competing with it for 2 cores makes spikes of its own.
        stop.set()
        for thread in threads:
            thread.join()
        time.sleep(1.5)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{server.url}/dashboard")
            page.wait_for_function("window.sordino && window.sordino.updates >= 2")
            page.screenshot(path=str(IMAGES / "dashboard.png"), full_page=True)
            snap = httpx.get(f"{server.url}/v2/sordino/telemetry?seconds=180").json()
            console = Console(width=150, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
            metrics = ["qps", "latency", "error_rate", "mem_frag", "batch", "busy"]
            console.print(live_view(snap, metrics, server.url))
            screen = data_dir / "monitor.html"
            screen.write_text(console.export_html(theme=MONOKAI, inline_styles=True))
            page = browser.new_page(viewport={"width": 1240, "height": 400})
            page.goto(screen.as_uri())
            page.screenshot(path=str(IMAGES / "monitor.png"), full_page=True)
            html, pdf = data_dir / "report.html", data_dir / "report.pdf"
            for output in (html, pdf):
                result = CliRunner().invoke(
                    cli, ["diagnose", "--data-dir", str(data_dir), "--output", str(output)]
                )
                print(result.output)
            page = browser.new_page(viewport={"width": 1150, "height": 1500})
            page.goto(html.as_uri())
            page.screenshot(path=str(IMAGES / "diagnose-report.png"))
            browser.close()
    subprocess.run(
        ["pdftoppm", "-png", "-r", "80", "-f", "1", "-l", "1", "-singlefile", str(pdf),
         str(IMAGES / "diagnose-pdf")],
        check=True,
    )  # fmt: skip
    print(f"screenshots in {IMAGES}")


if __name__ == "__main__":
    main()
