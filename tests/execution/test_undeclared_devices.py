"""The brief's fallback chain names devices it never declares; they resolve by name.

``cpu*`` is the CPU; any other undeclared name is an accelerator and takes the next
accelerator present, in chain order; a name left without one is unavailable (one
warning line, a ``device_unavailable`` event) and the chain skips it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from sordino.config import load_config
from sordino.execution import devices as devices_module
from sordino.execution.devices import accelerators_present, chain_devices, missing_provider
from sordino.testing import serve_in_thread
from tests.execution.load import BODY, digits, events

# The brief's scheduler block, as written there (the arrows included).
BRIEF_SCHEDULER = """\
scheduler:
  mode: "adaptive"  # adaptive mode (auto/manual/hybrid)

  strategies:
    - name: "dynamic_batching"
      enabled: true
      min_batch: 1
      max_batch: 16
      timeout_ms: 50  # batching wait

    - name: "stream_priority"
      rules:
        - tag: "premium_user" → priority: "high"
        - tag: "batch_job" → priority: "low"

    - name: "fallback_chain"
      primary: "accelerator_v3"
      fallbacks: ["accelerator_v2", "cpu_fallback"]
      switch_threshold: "error_rate>5% for 30s"
"""


def _brief(tmp_path: Path, text: str = BRIEF_SCHEDULER) -> Path:
    path = tmp_path / "runtime_config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.skipif(accelerators_present() != (), reason="asserts a machine without accelerators")
def test_the_brief_chain_serves_on_the_cpu_and_reports_the_absent_accelerators(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The brief's block loads as written; on a CPU-only machine both accelerators are
    reported unavailable and skipped, and cpu_fallback answers every request."""
    caplog.set_level(logging.INFO, logger="sordino")
    config = load_config(_brief(tmp_path))
    with serve_in_thread(config, digits()) as server:
        for _ in range(3):
            response = httpx.post(server.url + "/v2/models/digits-classifier/infer", json=BODY)
            assert response.status_code == 200, response.text
        unavailable = {e.subject: e.cause for e in events(server, "device_unavailable")}
        workers = {w.device for w in server.runtime.executor.statistics().workers}
    assert set(unavailable) == {"device:accelerator_v3", "device:accelerator_v2"}
    assert all("no accelerator is left for it" in cause for cause in unavailable.values())
    assert workers == {"cpu_fallback"}
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(line.startswith("device accelerator_v3 is unavailable") for line in lines)


def test_accelerator_names_take_the_accelerators_present_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With two CUDA devices visible: v3 is device 0, v2 device 1, cpu_fallback the CPU;
    a third accelerator name finds none left and is unavailable, not an error."""
    monkeypatch.setattr(
        devices_module,
        "available_providers",
        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"],
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    text = BRIEF_SCHEDULER.replace(
        '["accelerator_v2", "cpu_fallback"]', '["accelerator_v2", "accelerator_v1", "cpu_fallback"]'
    )
    chain = chain_devices(load_config(_brief(tmp_path, text)))
    assert chain is not None
    assert [(d.name, d.target) for d in chain] == [
        ("accelerator_v3", "cuda:0"),
        ("accelerator_v2", "cuda:1"),
        ("accelerator_v1", "cpu"),
        ("cpu_fallback", "cpu"),
    ]
    reasons = [missing_provider(d) for d in chain]
    assert reasons[0] is None and reasons[1] is None and reasons[3] is None
    assert reasons[2] is not None and "2 accelerator(s) present" in reasons[2]


def test_declared_devices_keep_their_accelerator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A declared CUDA device keeps its device_id; undeclared names take the others."""
    monkeypatch.setattr(
        devices_module,
        "available_providers",
        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"],
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    text = "devices: [{name: accelerator_v2, provider: cuda, device_id: 0}]\n" + BRIEF_SCHEDULER
    chain = chain_devices(load_config(_brief(tmp_path, text)))
    assert chain is not None
    assert [d.target for d in chain] == ["cuda:1", "cuda:0", "cpu"]
