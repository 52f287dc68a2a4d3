"""The self_healing section: the brief's shapes load as written; mistakes say what fits."""

from __future__ import annotations

from pathlib import Path

import pytest

from sordino.config import load_config, parse_threshold
from sordino.config.self_healing import parse_action
from sordino.errors import ConfigError

BRIEF_SHAPES = {
    "guardian": """
self_healing:
  enabled: true
  triggers:
    - metric: "error_rate"
      threshold: "5%"
      window: "1m"
      action: "restart_worker"
    - metric: "memory_fragmentation"
      threshold: "70%"
      window: "5m"
      action: "trigger_defrag"
    - metric: "device_temperature"
      threshold: "85°C"
      window: "30s"
      action: "throttle_requests"
  recovery:
    warmup_requests: 10  # warm-up after recovery
    health_check: "/health?deep=true"
    rollback_on_failure: true
""",
    "presets": """
self_healing:
  triggers:
    - metric: "memory_fragmentation"
      threshold: "65%"
      action: "trigger_defrag"
    - metric: "qps"
      threshold: "sudden_drop>40% in 1m"
      action: "scale_workers +2"
    - metric: "device_temperature"
      threshold: "80°C"
      action: "throttle_requests_by 20%"
""",
    "rural": """
self_healing:
  triggers:
    - metric: "network_latency"
      threshold: "500ms"
      action: "cache_recent_results"
""",
    "game": """
self_healing:
  triggers:
    - metric: "frame_delay"
      threshold: "16ms"
      action: "skip_non_critical"
""",
}


@pytest.mark.parametrize("name", sorted(BRIEF_SHAPES))
def test_the_brief_shapes_load_unchanged(tmp_path: Path, name: str) -> None:
    """Every self_healing block of the brief is a valid configuration as written."""
    path = tmp_path / "runtime_config.yaml"
    path.write_text(BRIEF_SHAPES[name], encoding="utf-8")
    config = load_config(path, {})
    assert config.self_healing.triggers


def test_brief_values_are_read_in_their_units(tmp_path: Path) -> None:
    """85°C, 70%, 1m, 'sudden_drop>40% in 1m', 'scale_workers +2' mean what they say."""
    path = tmp_path / "c.yaml"
    path.write_text(BRIEF_SHAPES["guardian"], encoding="utf-8")
    error, frag, temp = load_config(path, {}).self_healing.triggers
    assert (error.window_s, error.parsed_threshold().value) == (60.0, 0.05)
    assert frag.parsed_threshold().value == pytest.approx(0.7) and frag.window_s == 300
    assert temp.parsed_threshold().value == 85 and temp.parsed_actions()[0].amount == 0.2
    drop = parse_threshold("sudden_drop>40% in 1m", "qps")
    assert (drop.change, drop.value, drop.window_s) == ("drop", pytest.approx(0.4), 60.0)
    assert parse_action("scale_workers +2").amount == 2


@pytest.mark.parametrize(
    ("text", "metric", "op", "value", "window"),
    [
        ("5%", "error_rate", ">", 0.05, 30.0),
        ("85°C", "device_temperature", ">", 85.0, 30.0),
        ("500ms", "p99_latency", ">", 0.5, 30.0),
        ("> 2000", "qps", ">", 2000.0, 30.0),
        ("above 0.7 for 5m", "worker_busy", ">", 0.7, 300.0),
        ("below 90%", "slo_attainment", "<", 0.9, 30.0),
        ("sudden_rise>200% in 1m", "qps", ">", 2.0, 60.0),
    ],
)
def test_trigger_threshold_forms(
    text: str, metric: str, op: str, value: float, window: float
) -> None:
    """Every form of the issue parses to the metric's base unit."""
    threshold = parse_threshold(text, metric)
    assert (threshold.op, threshold.window_s) == (op, window)
    assert threshold.value == pytest.approx(value)


def test_an_unknown_key_fails_loudly(tmp_path: Path) -> None:
    """A misspelt key under self_healing is an error, not a silently ignored value."""
    path = tmp_path / "c.yaml"
    path.write_text("self_healing:\n  trigers: []\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="trigers"):
        load_config(path, {})


@pytest.mark.parametrize(
    ("trigger", "message"),
    [
        ("{metric: errors, threshold: '5%', action: alert}", "unknown metric 'errors'"),
        ("{metric: error_rate, threshold: 'lots', action: alert}", "accepted forms: '5%'"),
        ("{metric: device_temperature, threshold: '85K', action: alert}", "degrees Celsius"),
        ("{metric: qps, threshold: '> 10', action: reboot}", "unknown action 'reboot'"),
        ("{metric: qps, threshold: '> 10', action: 'scale_workers 2'}", "scale_workers \\+N"),
        ("{metric: qps, threshold: '> 10'}", "needs 'action: NAME'"),
    ],
)
def test_mistakes_fail_with_the_accepted_forms(tmp_path: Path, trigger: str, message: str) -> None:
    """A bad metric, threshold or action names the key and what is allowed."""
    path = tmp_path / "c.yaml"
    path.write_text(f"self_healing:\n  triggers:\n    - {trigger}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=message) as raised:
        load_config(path, {})
    assert "self_healing.triggers" in str(raised.value)


# The step-2, edge and game blocks of the brief, as written there (no ``enabled:``).
BRIEF_BLOCKS_WITHOUT_ENABLED = {
    "step2": BRIEF_SHAPES["presets"],
    "edge": """
scheduler:
  mode: "conservative"  # conservative scheduling, for stability
self_healing:
  triggers:
    - metric: "network_latency"
      threshold: "500ms"
      action: "cache_recent_results"  # local cache while the network is poor
""",
    "game": BRIEF_SHAPES["game"],
}


@pytest.mark.parametrize("name", sorted(BRIEF_BLOCKS_WITHOUT_ENABLED))
def test_a_block_with_triggers_is_on_unless_it_says_enabled_false(
    tmp_path: Path, name: str
) -> None:
    """The brief's blocks list triggers without ``enabled: true``: their guardian runs."""
    path = tmp_path / "runtime_config.yaml"
    path.write_text(BRIEF_BLOCKS_WITHOUT_ENABLED[name], encoding="utf-8")
    assert load_config(path, {}).self_healing.enabled is True
    off = BRIEF_BLOCKS_WITHOUT_ENABLED[name].replace(
        "self_healing:\n", "self_healing:\n  enabled: false\n"
    )
    path.write_text(off, encoding="utf-8")
    assert load_config(path, {}).self_healing.enabled is False
    assert load_config(path, {"self_healing.enabled": True}).self_healing.enabled is True


def test_a_block_without_triggers_stays_off(tmp_path: Path) -> None:
    """Alert channels alone, or no block at all, do not start the guardian."""
    path = tmp_path / "c.yaml"
    path.write_text("self_healing:\n  alert_channels: [log]\n", encoding="utf-8")
    assert load_config(path, {}).self_healing.enabled is False
    path.write_text("server: {}\n", encoding="utf-8")
    assert load_config(path, {}).self_healing.enabled is False


@pytest.mark.parametrize("url", ["notaurl", "ftp://host/x", "http://", "http://host:port/x"])
def test_a_webhook_channel_without_an_http_address_is_refused_guardian_on_or_off(
    tmp_path: Path, url: str
) -> None:
    """Checked by the configuration, so a guardian left off does not hide it until the
    day it is turned on."""
    path = tmp_path / "c.yaml"
    path.write_text(f"self_healing:\n  alert_channels: ['webhook:{url}']\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="the webhook URL must be http:// or https:// with a"):
        load_config(path, {})
    path.write_text(
        "self_healing:\n  alert_channels: ['webhook:https://alerts.example.com/hook']\n",
        encoding="utf-8",
    )
    assert load_config(path, {}).self_healing.alert_channels == (
        "webhook:https://alerts.example.com/hook",
    )
