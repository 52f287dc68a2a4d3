"""Detection → action time of the guardian, per trigger kind, on a real ``sordino start``.

For each trigger kind a fresh ``sordino start --guardian-mode true`` serves the built-in
digits classifier with that one trigger (window ``--window`` seconds);
a steady load runs; the condition is then caused for real at time T0:

- ``error_rate``: an ``error`` fault at rate 0.5 on its worker → ``restart_worker``;
- ``p99_latency``: a 60 ms ``latency`` fault → ``shed_low_priority``;
- ``device_temperature``: a ``temperature`` fault reading 90 °C → ``throttle_requests_by 20%``;
- ``qps sudden_rise``: the paced load (20 req/s) turns into 4 closed-loop clients →
  ``scale_workers +2``;
- ``qps sudden_drop``: the load stops → ``alert``;
- ``memory_fragmentation``: the arena is fragmented to 70 % (``sordino.testing.fragment_arena``,
  so this kind runs the server in this process, ``serve_in_thread``) → ``trigger_defrag``.

The action's start comes from its diagnostic record (``started``, from ``sordino
events``), as does the moment the loop first saw the condition hold (``detected``).
Reported: T0 → action, and detection → action. The issue bounds detection → action at 3 s once
the window has elapsed; here the window's mean crosses the threshold as soon as the
first closed second carries the condition (rows close once a second, 20 ms after
the boundary; the loop looks every 500 ms), so T0 → action bounds detection →
action from above.

    python -m bench.guardian_detect [--window 2] [--repeat 1] [--kinds error_rate ...]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import sordino
from bench.common import sordino_server

TOKEN = "guardian-bench-token"
BODY = json.dumps(
    {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}
).encode()

KINDS: dict[str, dict[str, Any]] = {
    "error_rate": {"threshold": "5%", "action": "restart_worker"},
    "p99_latency": {"threshold": "40ms", "action": "shed_low_priority"},
    "device_temperature": {"threshold": "80°C", "action": "throttle_requests_by 20%"},
    "qps sudden_rise": {"threshold": "sudden_rise>100% in {w}s", "action": "scale_workers +2"},
    "qps sudden_drop": {"threshold": "sudden_drop>40% in {w}s", "action": "alert"},
    "memory_fragmentation": {"threshold": "65%", "action": "trigger_defrag"},
}


def _call(url: str, method: str = "GET", body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


class Load:
    """Clients sending the digits request; ``pace`` seconds between requests (0: none)."""

    def __init__(self, url: str, clients: int, pace: float) -> None:
        self.stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(url, pace), daemon=True)
            for _ in range(clients)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, url: str, pace: float) -> None:
        target = url + "/v2/models/digits-classifier/infer"
        while not self.stop.is_set():
            request = urllib.request.Request(
                target, data=BODY, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    response.read()
            except OSError:
                pass  # injected errors answer 500; the load goes on
            if pace:
                time.sleep(pace)

    def close(self) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(30)


def run_fragmentation(window: int) -> dict[str, float]:
    """The arena fragmented for real inside a server in this process (the chaos API has
    no fault that fragments memory), then the same record as the other kinds."""
    from sordino.config import RuntimeConfig
    from sordino.models.repository import builtin_sources
    from sordino.testing import fragment_arena, serve_in_thread

    trigger = {"metric": "memory_fragmentation", "threshold": "65%", "window": f"{window}s",
               "action": "trigger_defrag", "cooldown": "120s"}  # fmt: skip
    config = RuntimeConfig.model_validate(
        {"self_healing": {"enabled": True, "triggers": [trigger]}}
    )
    sources = [s for s in builtin_sources() if s.name == "digits-classifier"]
    with serve_in_thread(config, sources) as server:
        runtime = server.runtime

        async def fragment() -> Any:
            return fragment_arena(runtime, 0.7)

        async def release(held: Any) -> None:
            held.release()

        time.sleep(window + 1)
        t0 = time.time()
        held = server.call(fragment())
        try:
            deadline = time.time() + 30 + 3 * window
            while time.time() < deadline:
                found = runtime.events.recent("guardian")
                if found:
                    payload = found[0].payload
                    started = (float(payload["started"]), float(payload["detected"]))
                    break
                time.sleep(0.1)
            else:
                raise RuntimeError("the guardian did not act in time")
        finally:
            server.call(release(held))
    return {"act_s": started[0] - t0, "detect_to_act_s": started[0] - started[1]}


def run_kind(kind: str, window: int) -> dict[str, float]:
    if kind == "memory_fragmentation":
        return run_fragmentation(window)
    spec = KINDS[kind]
    metric = kind.split()[0]
    trigger = {
        "metric": metric,
        "model": "digits-classifier",
        "threshold": spec["threshold"].format(w=window),
        "action": spec["action"],
        "cooldown": "120s",
    }
    if "sudden" not in kind:
        trigger["window"] = f"{window}s"
    with tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "runtime_config.yaml"
        config.write_text(json.dumps({"self_healing": {"triggers": [trigger]}}))
        env = {"SORDINO_ADMIN_TOKEN": TOKEN}
        digits = Path(sordino.__file__).parent / "models" / "builtin" / "digits-classifier.onnx"
        args = ["--config", str(config), "--guardian-mode", "true", "--model", str(digits)]
        with sordino_server(args, env=env) as server:
            url = server.http
            _call(url + "/v2/admin/chaos", "DELETE")
            pace = 0.05 if "sudden" in kind else 0.0
            load = Load(url, 1 if pace else 3, pace)
            try:
                time.sleep(2 * window + 2)  # a full baseline (two windows for a change)
                t0 = time.time()
                surge: Load | None = None
                if kind == "error_rate":
                    fault = {"target": "worker:digits-classifier", "fault": "error", "rate": 0.5}
                    _call(url + "/v2/admin/chaos", "POST", fault)
                elif kind == "p99_latency":
                    fault = {"target": "worker:digits-classifier", "fault": "latency",
                             "latency": "60ms"}  # fmt: skip
                    _call(url + "/v2/admin/chaos", "POST", fault)
                elif kind == "device_temperature":
                    fault = {"target": "device:cpu", "fault": "temperature", "celsius": 90}
                    _call(url + "/v2/admin/chaos", "POST", fault)
                elif kind == "qps sudden_rise":
                    surge = Load(url, 4, 0.0)
                else:
                    load.stop.set()
                started = _wait_started(url, 30 + 3 * window)
            finally:
                load.close()
                if surge is not None:
                    surge.close()
    return {"act_s": started[0] - t0, "detect_to_act_s": started[0] - started[1]}


def _wait_started(url: str, timeout: float) -> tuple[float, float]:
    """(when the action started, when the loop first saw the condition), from the record."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = _call(url + "/v2/sordino/guardian")
        if status["triggers"][0]["fired"]:
            found = _call(url + "/v2/sordino/events?kind=guardian&since=600")["events"]
            if found:
                payload = found[0]["payload"]
                return float(payload["started"]), float(payload["detected"])
        time.sleep(0.1)
    raise RuntimeError("the guardian did not act in time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=int, default=2, help="trigger window in seconds")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--kinds", nargs="*", default=list(KINDS))
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {}
    for kind in args.kinds:
        for _ in range(args.repeat):
            results.setdefault(kind, []).append(run_kind(kind, args.window))
            r = results[kind][-1]
            print(
                f"{kind:<20} T0 → action {r['act_s']:5.2f} s   "
                f"detection → action {r['detect_to_act_s'] * 1000:6.1f} ms",
                flush=True,
            )
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "guardian_detect.json").write_text(
        json.dumps({"window_s": args.window, "cpus": os.cpu_count(), "results": results}, indent=1)
    )


if __name__ == "__main__":
    main()
