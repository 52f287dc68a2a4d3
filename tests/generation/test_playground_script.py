"""playground.js without a browser: Node runs it against a stub of the DOM.

The Chromium test (``test_playground.py``) drives the real page where Debian's chromium
is installed; this one checks, wherever Node is, what a failed prompt leaves on the page.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

NODE = shutil.which("node")
SCRIPT = resources.files("sordino.server").joinpath("static", "playground.js")

pytestmark = pytest.mark.skipif(NODE is None, reason="needs Node.js")

HARNESS = r"""
const vm = require("vm");
const fs = require("fs");
const elements = {};
const cleared = [];
const element = (id) => elements[id] || (elements[id] = {
  id, textContent: "", className: "", value: "", width: 256, height: 256, attributes: {},
  listeners: {},
  set src(v) { this.attributes.src = v; },
  get src() { return this.attributes.src; },
  getAttribute(name) { return name in this.attributes ? this.attributes[name] : null; },
  removeAttribute(name) { delete this.attributes[name]; },
  addEventListener(kind, fn) { this.listeners[kind] = fn; },
  getContext: () => ({ clearRect: (...area) => cleared.push(area) }),
});
const context = {
  window: {},
  document: { getElementById: element },
  performance: { now: () => 0 },
  fetch: async () => ({
    ok: false, status: 400,
    json: async () => ({ error: "the prompt names no digit; say one, e.g. 'a 7'" }),
  }),
  Number, String, Object, JSON, Promise, Math, Error,
};
vm.createContext(context);
vm.runInContext(fs.readFileSync(process.argv[2], "utf8"), context);
// The previous prompt's answer is on the page.
element("png").src = "data:image/png;base64,AAAA";
context.window.playground.png = "AAAA";
element("prompt").value = "a banana";
element("steps").value = "8";
element("model").value = "digits-diffusion";
element("form").listeners.submit({ preventDefault() {} }).then(() => {
  console.log(JSON.stringify({
    state: context.window.playground,
    src: element("png").getAttribute("src"),
    result: element("result").textContent,
    resultClass: element("result").className,
    cleared,
  }));
});
"""


def test_a_failed_prompt_clears_the_previous_image_and_shows_the_error(
    tmp_path: Path,
) -> None:
    harness = tmp_path / "harness.js"
    harness.write_text(HARNESS)
    result = subprocess.run(
        [str(NODE), str(harness), str(SCRIPT)],
        capture_output=True, text=True, timeout=60, env={"PATH": ""},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    assert out["src"] is None and out["state"]["png"] is None
    assert out["cleared"], "the canvas keeps the previous preview"
    assert "names no digit" in out["result"] and out["resultClass"] == "error"
    assert out["state"]["error"] == out["result"] and not out["state"]["running"]
