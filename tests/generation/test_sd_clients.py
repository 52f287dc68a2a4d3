"""``sordino generate`` and the playground on SD 1.x, SDXL and SD3 exports: the image each
shows is ``/generate``'s for the same request (same seed, same image), text to image and
image to image.

Neither client sends initial ``latents``, so diffusers' references (test_sd_paths.py)
do not apply; the same seed must give the same image on every path. The playground runs
as served (``/dashboard/static/playground.js``) in Node against a stub of the DOM with
Node's own ``fetch`` talking to the real server (a browser test with Chromium is
test_playground.py, where Debian's chromium is installed). One module-scoped server
serves the three tiny exports (no result cache: every request computes its image).
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from sordino.cli.main import cli
from sordino.testing import RunningServer
from tests.generation.sd_common import serve_exports

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sd"
EXPORTS = {"sd": "tiny-sd", "xl": "tiny-sdxl", "sd3": "tiny-sd3"}
NODE = shutil.which("node")
# (model, image to image) for every export, both ways.
CASES = [(model, image) for model in EXPORTS for image in (False, True)]
IDS = [f"{model}-{'image' if image else 'text'}" for model, image in CASES]


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with serve_exports({model: FIXTURES / export for model, export in EXPORTS.items()}) as running:
        yield running


@pytest.fixture(scope="module")
def start_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 64x32 PNG with detail (image to image answers at its size)."""
    path = tmp_path_factory.mktemp("start") / "start.png"
    pixels = (np.arange(32 * 64 * 3) * 7 % 251).astype(np.uint8).reshape(32, 64, 3)
    Image.fromarray(pixels).save(path)
    return path


def _expected(server: RunningServer, model: str, body: dict[str, Any]) -> np.ndarray:
    """``/generate``'s image for ``body`` [H, W, 3]."""
    with httpx.Client(base_url=server.url, timeout=120) as client:
        answer = client.post(f"/v2/models/{model}/generate", json=body)
    assert answer.status_code == 200, answer.text
    return _decode(answer.json()["png"])


def _decode(png: str | bytes) -> np.ndarray:
    data = base64.b64decode(png) if isinstance(png, str) else png
    image = Image.open(io.BytesIO(data))
    assert image.mode == "RGB"
    return np.asarray(image)


def _body(image: Path | None) -> dict[str, Any]:
    """What both clients send: prompt, negative prompt, steps, seed; a size, or an image
    and a strength (the model's default guidance)."""
    body: dict[str, Any] = {"prompt": "a red house", "negative_prompt": "fog", "steps": 4}
    body["seed"] = 7
    if image is None:
        body.update(width=48, height=32)
    else:
        body.update(image=base64.b64encode(image.read_bytes()).decode(), strength=0.6)
    return body


@pytest.mark.parametrize(("model", "image"), CASES, ids=IDS)
def test_sordino_generate_writes_generates_image(
    server: RunningServer, start_image: Path, tmp_path: Path, model: str, image: bool
) -> None:
    body = _body(start_image if image else None)
    out = tmp_path / "out.png"
    args = ["generate", body["prompt"], "--model", model, "--url", server.url, "-o", str(out)]
    args += ["--negative-prompt", body["negative_prompt"], "--steps", "4", "--seed", "7"]
    if image:
        args += ["--image", str(start_image), "--strength", "0.6"]
    else:
        args += ["--width", "48", "--height", "32"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    # int(4 x 0.6) = 2 steps; SD3 keeps 4 - int(4 - 2.4) = 3.
    steps = 4 if not image else 3 if model == "sd3" else 2
    assert f"{steps} steps" in result.output, result.output
    np.testing.assert_array_equal(_decode(out.read_bytes()), _expected(server, model, body))


HARNESS = r"""
const vm = require("vm");
const fs = require("fs");
const [script, base, given] = process.argv.slice(2);
const ask = JSON.parse(given);
const elements = {};
const canvas = () => ({
  width: 256, height: 256, imageSmoothingEnabled: true,
  getContext: () => ({
    createImageData: (w, h) => ({ width: w, height: h, data: new Uint8ClampedArray(w * h * 4) }),
    putImageData() {}, drawImage() {}, clearRect() {},
  }),
});
const element = (id) => elements[id] || (elements[id] = Object.assign(canvas(), {
  id, textContent: "", className: "", value: "", hidden: false, files: null, attributes: {},
  listeners: {},
  set src(v) { this.attributes.src = v; },
  get src() { return this.attributes.src; },
  getAttribute(name) { return name in this.attributes ? this.attributes[name] : null; },
  removeAttribute(name) { delete this.attributes[name]; },
  addEventListener(kind, fn) { this.listeners[kind] = fn; },
}));
class FileReader {
  readAsDataURL(file) {
    this.result = "data:image/png;base64," + fs.readFileSync(file.name).toString("base64");
    setImmediate(() => this.onload());
  }
}
const context = {
  window: { location: { search: "?model=" + encodeURIComponent(ask.model) } },
  document: { getElementById: element, createElement: canvas },
  performance, FileReader, TextDecoder, URLSearchParams, setImmediate,
  fetch: (url, options) => fetch(base + url, options),
};
vm.createContext(context);
vm.runInContext(fs.readFileSync(script, "utf8"), context);
const state = context.window.playground;
const until = async (ready) => {
  for (let i = 0; i < 6000 && !ready(); i++) await new Promise((r) => setTimeout(r, 10));
};
(async () => {
  await until(() => state.described);
  const fields = state.fields.slice();
  for (const [id, value] of Object.entries(ask.fields)) element(id).value = String(value);
  if (ask.image) element("image").files = [{ name: ask.image }];
  await element("form").listeners.submit({ preventDefault() {} });
  await until(() => !state.running);
  process.stdout.write(JSON.stringify({
    fields, png: state.png, steps: state.steps, error: state.error,
    progress: element("progress").textContent,
  }));
})();
"""


def _playground(server: RunningServer, tmp_path: Path, ask: dict[str, Any]) -> dict[str, Any]:
    """Run the served playground.js in Node with ``ask``'s fields typed in and submit it."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        script = client.get("/dashboard/static/playground.js")
    assert script.status_code == 200
    (tmp_path / "playground.js").write_text(script.text, encoding="utf-8")
    (tmp_path / "harness.js").write_text(HARNESS, encoding="utf-8")
    assert NODE is not None
    done = subprocess.run(
        [NODE, str(tmp_path / "harness.js"), str(tmp_path / "playground.js"), server.url,
         json.dumps(ask)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


@pytest.mark.skipif(NODE is None, reason="needs Node.js")
@pytest.mark.parametrize(("model", "image"), CASES, ids=IDS)
def test_the_playground_shows_generates_image(
    server: RunningServer, start_image: Path, tmp_path: Path, model: str, image: bool
) -> None:
    body = _body(start_image if image else None)
    fields = {"prompt": body["prompt"], "negative": "fog", "steps": 4, "seed": 7}
    ask: dict[str, Any] = {"model": model, "fields": fields}
    if image:
        fields["strength"] = 0.6
        ask["image"] = str(start_image)
    else:
        fields.update(width=48, height=32)
    shown = _playground(server, tmp_path, ask)
    assert shown["error"] is None, shown["error"]
    assert shown["fields"] == ["negative", "width", "height", "image", "strength"]
    steps = 4 if not image else 3 if model == "sd3" else 2
    assert shown["progress"] == f"done: {steps} steps"
    assert shown["steps"] >= 1  # previews were drawn before the image
    np.testing.assert_array_equal(_decode(shown["png"]), _expected(server, model, body))
