"""The dashboard's generation playground in a real headless Chromium: no console errors,
the steps arrive, the image and its latency are shown; a bad prompt shows the 400's text;
for a Stable Diffusion export, the fields the model takes (negative prompt, size, an
image upload and a strength where it has a VAE encoder) and the image at its size."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sordino.config import ModelConfig
from sordino.models.repository import builtin_sources, sources_for
from sordino.testing import RunningServer, serve_in_thread

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sd"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    sources = [s for s in builtin_sources() if s.name == "digits-diffusion"]
    for name, export in (("sd", "tiny-sd"), ("xl", "tiny-sdxl")):
        config = ModelConfig(name=name, path=FIXTURES / export, isolation="thread")
        sources.extend(sources_for(config))
    with serve_in_thread(sources=sources) as running:
        yield running


def test_playground_page_and_assets_are_served(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url) as client:
        page = client.get("/dashboard/playground")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert "http://" not in page.text and "https://" not in page.text
        for asset in ("playground.js", "playground.css"):
            assert client.get(f"/dashboard/static/{asset}").status_code == 200
        assert "/dashboard/playground" in client.get("/dashboard").text


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium")
@pytest.mark.timeout(90)
def test_playground_shows_the_steps_and_the_image(server: RunningServer) -> None:
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            page.goto(f"{server.url}/dashboard/playground")
            page.fill("#prompt", "draw a three")
            page.fill("#steps", "8")
            page.fill("#seed", "5")
            page.click("#go")
            page.wait_for_function("window.playground.done", timeout=30000)
            state = page.evaluate(
                "() => ({steps: window.playground.steps, latency: window.playground.latencyMs,"
                " png: window.playground.png, shown: document.querySelector('#png').naturalWidth,"
                " text: document.querySelector('#result').textContent})"
            )
            assert state["steps"] == 7  # progress events for steps 1..7, then the image
            assert state["latency"] > 0 and state["png"]
            assert "ms, seed 5" in state["text"]
            page.wait_for_function("document.querySelector('#png').naturalWidth === 32")
            page.fill("#prompt", "a banana")
            page.click("#go")
            page.wait_for_function("window.playground.error !== null", timeout=30000)
            error = page.evaluate("window.playground.error")
            assert "names no digit" in error
            # The failed prompt's answer is its error, not the previous prompt's image.
            after = page.evaluate(
                "() => ({png: window.playground.png, src: document.querySelector('#png')"
                ".getAttribute('src'), result: document.querySelector('#result').textContent,"
                " lit: Array.from(document.querySelector('#canvas').getContext('2d')"
                ".getImageData(0, 0, 256, 256).data).some((v) => v !== 0)})"
            )
            assert after == {"png": None, "src": None, "result": error, "lit": False}
        finally:
            browser.close()
    # The refused request is the server's 400 (the browser logs a failed fetch); nothing else.
    assert [p for p in problems if "400" not in p] == []


_FIELDS = "() => window.playground.described && window.playground.fields.join(',')"
_SHOWN = (
    "() => ['negative', 'width', 'height', 'image', 'strength']"
    ".filter((f) => !document.getElementById(f + '-field').hidden).join(',')"
)
_IMAGE = (
    "() => ({w: document.querySelector('#png').naturalWidth,"
    " h: document.querySelector('#png').naturalHeight,"
    " progress: document.querySelector('#progress').textContent,"
    " error: window.playground.error})"
)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium")
@pytest.mark.timeout(120)
def test_playground_offers_an_exports_fields_and_shows_its_image(
    server: RunningServer, tmp_path: Path
) -> None:
    from PIL import Image
    from playwright.sync_api import sync_playwright

    start = tmp_path / "start.png"
    Image.new("RGB", (64, 32), (30, 120, 200)).save(start)
    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            page.goto(f"{server.url}/dashboard/playground?model=sd")
            page.wait_for_function(_FIELDS, timeout=30000)
            assert page.evaluate(_SHOWN) == "negative,width,height,image,strength"
            # The model's defaults: its size (the UNet's sample_size x 8) and its multiple.
            assert page.input_value("#width") == "64"
            assert page.get_attribute("#width", "step") == "16"
            page.fill("#prompt", "a red house")
            page.fill("#negative", "blurry")
            page.fill("#width", "48")
            page.fill("#height", "32")
            page.fill("#steps", "3")
            page.fill("#seed", "5")
            page.click("#go")
            page.wait_for_function("window.playground.done", timeout=60000)
            page.wait_for_function("document.querySelector('#png').naturalWidth > 0")
            shown = page.evaluate(_IMAGE)
            assert shown == {"w": 48, "h": 32, "progress": "done: 3 steps", "error": None}
            # Previews drawn: PNDM (the export's scheduler) makes one UNet call more.
            assert page.evaluate("window.playground.steps") == 3
            # The image drawn on the canvas at the asked aspect (256 wide), in colour.
            canvas = page.evaluate(
                "() => { const c = document.querySelector('#canvas');"
                " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
                " return {h: c.height, colour: d.some((v, i) => i % 4 === 0 && v !== d[i + 1])}; }"
            )
            assert canvas == {"h": 171, "colour": True}
            # Image to image: the upload's size, int(4 x 0.5) steps.
            page.set_input_files("#image", str(start))
            page.fill("#strength", "0.5")
            page.fill("#steps", "4")
            page.click("#go")
            page.wait_for_function("window.playground.done", timeout=60000)
            page.wait_for_function("document.querySelector('#png').naturalWidth > 0")
            shown = page.evaluate(_IMAGE)
            assert shown == {"w": 64, "h": 32, "progress": "done: 2 steps", "error": None}
            # An SDXL export with its VAE encoder takes an image too; digits-diffusion none
            # of these fields.
            page.fill("#model", "xl")
            page.dispatch_event("#model", "change")
            page.wait_for_function(_FIELDS, timeout=30000)
            assert page.evaluate(_SHOWN) == "negative,width,height,image,strength"
            page.fill("#model", "digits-diffusion")
            page.dispatch_event("#model", "change")
            page.wait_for_function("window.playground.described", timeout=30000)
            assert page.evaluate(_SHOWN) == ""
        finally:
            browser.close()
    assert problems == []
