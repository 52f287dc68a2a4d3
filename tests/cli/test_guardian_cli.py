"""``sordino start --guardian-mode true --alert-channel ...``, ``sordino events``,
``sordino guardian status`` against a real ``sordino start`` process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sordino.cli.main import cli
from tests.cli.conftest import sordino_start
from tests.waiting import wait_for

TOKEN = "guardian-cli-token"
CONFIG = """
self_healing:
  triggers:
    - metric: device_temperature
      threshold: "80°C"
      window: 2s
      action: "throttle_requests_by 20%"
"""


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_guardian_mode_acts_records_and_alerts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A temperature fault makes the guardian act; events, status and the file channel show it."""
    monkeypatch.setenv("SORDINO_ADMIN_TOKEN", TOKEN)
    config = tmp_path / "runtime_config.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    alerts = tmp_path / "alerts.jsonl"
    args = ["--config", str(config), "--model", str(_digits()), "--guardian-mode", "true",
            "--alert-channel", f"file:{alerts}", "--alert-channel", "log"]  # fmt: skip
    with sordino_start(args, tmp_path) as server:
        url = ["--url", server.url]
        code, out = _run("guardian", "status", *url)
        assert code == 0 and "device_temperature" in out and "vs 80°C over 2 s" in out, out
        code, out = _run("chaos", "inject", *url, "--target", "device:cpu", "--fault",
                         "temperature", "--celsius", "90")  # fmt: skip
        assert code == 0 and "reads 90 °C" in out, out
        wait_for(
            lambda: "throttle_requests_by 20%" in _run("events", *url, "--kind", "guardian")[1],
            "sordino events to show the guardian's record",
            60,
        )
        code, out = _run("events", *url, "--kind", "guardian", "--since", "10m")
        assert code == 0 and "device_temperature of" in out and "was 90 °C over 2 s" in out
        code, out = _run("guardian", "status", *url)
        assert "HOLDS" in out and "throttle" in out, out
        wait_for(alerts.exists, "the file channel to be written", 30)
        record = json.loads(alerts.read_text(encoding="utf-8").splitlines()[0])
        assert record["action"] == "throttle_requests_by 20%"


def test_a_slack_channel_without_its_webhook_starts_warns_and_logs_the_alerts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The brief's ``--alert-channel "slack:#runtime-guard"`` with no webhook URL set: the
    server starts, says once which variable to set, and writes the channel's alerts to
    its log rather than dropping them."""
    monkeypatch.setenv("SORDINO_ADMIN_TOKEN", TOKEN)
    monkeypatch.delenv("SORDINO_SLACK_WEBHOOK", raising=False)
    config = tmp_path / "runtime_config.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    args = ["--config", str(config), "--model", str(_digits()), "--guardian-mode", "true",
            "--alert-channel", "slack:#runtime-guard"]  # fmt: skip
    with sordino_start(args, tmp_path) as server:
        code, out = _run("chaos", "inject", "--url", server.url, "--target", "device:cpu",
                         "--fault", "temperature", "--celsius", "90")  # fmt: skip
        assert code == 0, out
        wait_for(
            lambda: any("guardian alert for slack:#runtime-guard" in line for line in server.lines),
            "the Slack alert to be written to the log",
            60,
        )
        (logged,) = [line for line in server.lines if "guardian alert for slack" in line][:1]
        assert "was 90 °C over 2 s" in logged and "Traceback" not in "".join(server.lines)
        warnings = [line for line in server.lines if "$SORDINO_SLACK_WEBHOOK is not set" in line]
        assert len(warnings) == 1, server.lines
        assert "slack:#runtime-guard" in warnings[0] and "set SORDINO_SLACK_WEBHOOK" in warnings[0]


@pytest.mark.parametrize(
    ("trigger", "message"),
    [
        ("{metric: p95_latency, threshold: '200ms', action: alert}",
         "p95_latency is not supported in this build"),
        ("{metric: qps, threshold: 'sudden_drop>40% in 10m', action: alert}",
         "raise telemetry.recent_window"),
    ],
)  # fmt: skip
def test_start_refuses_what_this_build_cannot_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trigger: str, message: str
) -> None:
    """A trigger this build cannot serve stops start-up with exit 2 and a clear line."""
    config = tmp_path / "c.yaml"
    config.write_text(f"self_healing:\n  triggers:\n    - {trigger}\n", encoding="utf-8")
    monkeypatch.delenv("SORDINO_SLACK_WEBHOOK", raising=False)
    done = subprocess.run(
        [sys.executable, "-m", "sordino", "start", "--config", str(config), "--guardian-mode",
         "true", "--http-port", "0", "--grpc-port", "0", "--data-dir", str(tmp_path / "d"),
         "--model", str(_digits())],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def _digits() -> Path:
    import sordino.models.builtin as builtin

    return Path(builtin.__file__).parent / "digits-classifier.onnx"


def test_the_brief_network_and_game_shapes_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """network_latency → cache_recent_results and frame_delay → skip_non_critical, as the
    brief writes them, start and are watched."""
    monkeypatch.setenv("SORDINO_ADMIN_TOKEN", TOKEN)
    config = tmp_path / "runtime_config.yaml"
    config.write_text(
        "scheduler:\n  mode: conservative\nself_healing:\n  triggers:\n"
        '    - metric: "network_latency"\n      threshold: "500ms"\n'
        '      action: "cache_recent_results"\n'
        '    - metric: "frame_delay"\n      threshold: "16ms"\n'
        '      action: "skip_non_critical"\n',
        encoding="utf-8",
    )
    args = ["--config", str(config), "--model", str(_digits()), "--guardian-mode", "true"]
    with sordino_start(args, tmp_path) as server:
        code, out = _run("guardian", "status", "--url", server.url)
        assert code == 0, out
        assert "network_latency: " in out and "vs 500ms over 30 s [ok]" in out
        assert "frame_delay: " in out and "next: skip_non_critical" in out


def test_the_brief_step2_block_runs_the_guardian_without_guardian_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 2 of the brief lists triggers without ``enabled: true``: started without
    --guardian-mode, the guardian watches them (issue 31)."""
    monkeypatch.setenv("SORDINO_ADMIN_TOKEN", TOKEN)
    config = tmp_path / "runtime_config.yaml"
    config.write_text(
        """\
self_healing:
  triggers:
    - metric: "memory_fragmentation"
      threshold: "65%"  # early warning (was 70%)
      action: "trigger_defrag"

    - metric: "qps"
      threshold: "sudden_drop>40% in 1m"
      action: "scale_workers +2"

    - metric: "device_temperature"
      threshold: "80°C"  # cool down early
      action: "throttle_requests_by 20%"
""",
        encoding="utf-8",
    )
    with sordino_start(["--config", str(config), "--model", str(_digits())], tmp_path) as server:
        code, out = _run("guardian", "status", "--url", server.url)
    assert code == 0, out
    assert "guardian is off" not in out
    assert "memory_fragmentation" in out and "qps" in out and "device_temperature" in out
