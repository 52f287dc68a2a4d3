"""dashboard.js without a browser: Node runs it against stubs of the DOM and of uPlot.

The Chromium test (``test_dashboard.py``) draws the real page where Debian's chromium
is installed; this one checks, wherever Node is, what the script hands uPlot and
the figures it writes from a telemetry snapshot.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources
from typing import Any

import pytest

from sordino.cli.monitor_view import plain_snapshot

NODE = shutil.which("node")
SCRIPT = resources.files("sordino.server").joinpath("static", "dashboard.js")

pytestmark = pytest.mark.skipif(NODE is None, reason="needs Node.js")

HARNESS = r"""
const vm = require("vm");
const fs = require("fs");
const charts = [];
const elements = {};
const element = (id) => elements[id] || (elements[id] = {
  id, textContent: "", className: "", innerHTML: "", clientWidth: 540,
  querySelector: () => element(id + "/child"),
});
const snapshot = JSON.parse(process.argv[3]);
const context = {
  window: { addEventListener() {} },
  document: { getElementById: element },
  fetch: async () => ({ ok: true, json: async () => snapshot }),
  setInterval() {},
  uPlot: function (opts, data) {
    charts.push(opts);
    return { setData() {}, destroy() {}, setSize() {} };
  },
  Date, Math, Number, String, Array, Set, Map, Object, JSON, Promise,
};
vm.createContext(context);
vm.runInContext(fs.readFileSync(process.argv[2], "utf8"), context);
setTimeout(() => {
  const t = 1764702000;  // 2025-12-02 19:00:00 UTC, a whole minute in every time zone
  const label = context.window.sordino.clockLabels;
  const x = (c) => c.axes[0];
  console.log(JSON.stringify({
    ready: context.window.sordino.ready,
    figures: element("figures").innerHTML,
    xAxes: charts.map((c) => ({
      space: x(c).space,
      labels: x(c).values(null, [t, t + 60], 0, 80, 60),
    })),
    seconds: label(null, [t, t + 15], 0, 80, 15),
  }));
}, 50);
"""


def _snapshot() -> dict[str, Any]:
    ts = [1764702000 + i for i in range(3)]
    series = {k: [1.0, 2.0, 3.0] for k in ("qps", "p50_ms", "p99_ms", "batch_size", "errors")}
    resources_series: dict[str, list[Any]] = {"t": ts}
    for key in ("rss_bytes", "pool_reserved_bytes", "pool_in_use_bytes", "fragmentation"):
        resources_series[key] = [None] * 3
    return {
        "server": {"name": "sordino", "version": "0", "started_at": ts[0]},
        "time": ts[-1],
        "models": [{"name": "m", "current": {"qps": 2.0}, "series": {"t": ts, **series}}],
        "resources": {
            "current": {
                "rss_bytes": 1 << 20, "cpu_temp_c": None, "pool_in_use_bytes": None,
                "fragmentation": None,
            },
            "gpus": [],
            "series": resources_series,
        },
        "workers": {"instances": 2, "busy": 1},
        "events": [],
    }  # fmt: skip


def _run(tmp_path: Any, snapshot: dict[str, Any] | None = None) -> dict[str, Any]:
    harness = tmp_path / "harness.js"
    harness.write_text(HARNESS)
    result = subprocess.run(
        [str(NODE), str(harness), str(SCRIPT), json.dumps(snapshot or _snapshot())],
        capture_output=True, text=True, timeout=60, env={"TZ": "Asia/Kolkata", "PATH": ""},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    assert out["ready"], out
    return out


def test_time_axes_show_the_time_of_day_only_with_room_between_ticks(tmp_path: Any) -> None:
    """No date on the x axis, one line per tick, 80 px apart: labels no longer overlap."""
    out = _run(tmp_path)
    assert len(out["xAxes"]) == 6  # qps, latency, batch, errors, memory, events
    for axis in out["xAxes"]:
        assert axis["space"] >= 80
        assert axis["labels"] == ["00:30", "00:31"]  # 19:00 UTC in Asia/Kolkata (+05:30)
    assert out["seconds"] == ["00:30:00", "00:30:15"]


def test_the_workers_card_shows_busy_over_instances(tmp_path: Any) -> None:
    out = _run(tmp_path)
    assert "workers busy" in out["figures"] and ">1/2<" in out["figures"]


def test_the_workers_card_and_the_monitor_show_the_same_busy_figure(tmp_path: Any) -> None:
    """Between two short batches the instantaneous count is 0 while 1.4 workers were busy
    on average: both views show the mean, so they agree whenever they look."""
    snapshot = _snapshot() | {"workers": {"instances": 5, "busy": 0, "busy_mean": 1.4}}
    snapshot["models"][0]["version"] = "1"
    out = _run(tmp_path, snapshot)
    assert ">1.4/5<" in out["figures"]
    assert "workers 1.4/5 busy" in plain_snapshot(snapshot, ["qps"], "http://x")
