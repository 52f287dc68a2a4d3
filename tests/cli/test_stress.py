"""``sordino stress-test`` end to end: reports, exit codes, suggestions, any KServe v2 server."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from base64 import b64decode
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from sordino.cli.main import cli
from sordino.cli.stress import FAILED_CONDITION
from sordino.config import load_config
from sordino.control.client import AdminClient
from sordino.loadtest.findings import Suggestion, apply_suggestions
from sordino.models.repository import builtin_sources
from sordino.testing import RunningServer, serve_in_thread, serve_tiny_kserve

TOKEN = "stress-cli-test-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    config = load_config(None, {"server.admin_token": TOKEN})
    digits = [s for s in builtin_sources() if s.name == "digits-classifier"]
    with serve_in_thread(config, digits, data_dir=tmp_path_factory.mktemp("data")) as running:
        yield running


def _invoke(*args: str) -> Result:
    result = CliRunner().invoke(cli, ["stress-test", *args])
    assert "Traceback" not in result.output, result.output
    return result


def _stress(*args: str) -> tuple[int, str]:
    result = _invoke(*args)
    return result.exit_code, result.output


def _pngs(html: str) -> list[bytes]:
    return [b64decode(m) for m in re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", html)]


@pytest.mark.timeout(120)
def test_report_json_slo_and_fail_on(server: RunningServer, tmp_path: Path) -> None:
    report, measured = tmp_path / "stress_report.html", tmp_path / "stress.json"
    AdminClient(server.url, TOKEN).inject(
        "worker:digits-classifier", "latency", latency="20ms", duration="2s"
    )
    code, out = _stress(
        "--url", server.url, "--model", "digits-classifier", "--profile", "spike",
        "--duration", "6s", "--peak-rate", "90", "--output", str(report), "--json", str(measured),
        "--slo", "p99<2s", "--fail-on", "max>1ms", "--token", TOKEN,
    )  # fmt: skip
    assert code == FAILED_CONDITION, out
    assert "fail-on: max>1ms held" in out
    assert re.search(r"^all\s+\d+\s+0\s", out, re.M), out  # the headline table, no errors
    html = report.read_text()
    assert "<h2>Headline</h2>" in html and "SLO attainment" in html and "Findings" in html
    assert "http" not in html.replace(server.url, "")  # self-contained: no CDN, no links
    pngs = _pngs(html)
    assert len(pngs) == 4  # rate, latency, errors, server side
    assert all(p.startswith(b"\x89PNG\r\n\x1a\n") and len(p) > 5000 for p in pngs)
    document = json.loads(measured.read_text())
    assert document["server"]["observed"] and document["server"]["samples"]
    assert document["rate"]["intended_mean"] == pytest.approx(
        document["client"]["scheduled"] / 6, rel=0.01
    )
    # The spike: the middle fifth is three times the rest.
    rates = document["rate"]["intended"]
    assert max(rates) > 2 * min(rates[:2])
    (slo,) = document["slos"]
    assert slo["met"] is True and slo["attainment"] > 0.99
    assert document["latency"]["count"] == document["client"]["answered"]
    assert any("p99" in line for line in document["findings"])
    # The server's journal, read after the run: the fault injected as it started.
    kinds = [e["kind"] for e in document["server"]["events"]]
    assert "fault_injected" in kinds and "fault_cleared" in kinds, document["server"]
    assert "Server events during the run" in html and "fault_injected" in html


@pytest.mark.timeout(120)
def test_a_condition_that_does_not_hold_exits_zero_and_suggestions_merge(
    server: RunningServer, tmp_path: Path
) -> None:
    config = tmp_path / "sordino.yaml"
    config.write_text("server:\n  http_port: 9000\nscheduler:\n  mode: conservative\n")
    code, out = _stress(
        "--url", server.url, "--model", "digits-classifier", "--duration", "3s",
        "--peak-rate", "40", "--slo", "p99<50ms", "--fail-on", "p99>30s",
        "--apply-suggestions", str(config),
    )  # fmt: skip
    assert code == 0, out
    assert f"merged into {config}" in out
    loaded = load_config(config)
    # The strictest target tested, stricter than the server's own 100 ms (a looser one
    # is never suggested: issue 27).
    assert loaded.scheduler.slo_p99_ms == 50.0
    assert loaded.server.http_port == 9000 and loaded.scheduler.mode == "conservative"


def test_suggested_batching_merges_into_the_strategies_list(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "scheduler:\n  strategies:\n    - {name: dynamic_batching, timeout_ms: 5}\n"
        "    - {name: stream_priority, rules: [{tag: premium, priority: high}]}\n"
    )
    apply_suggestions(
        config, [Suggestion("scheduler.strategies.dynamic_batching.max_batch", 64, "full")]
    )
    strategies = {s.name: s for s in load_config(config).scheduler.strategies}
    assert strategies["dynamic_batching"].max_batch == 64  # type: ignore[union-attr]
    assert strategies["dynamic_batching"].timeout_ms == 5  # type: ignore[union-attr]
    assert "stream_priority" in strategies
    before = config.read_text()
    with pytest.raises(Exception, match="would not load"):
        apply_suggestions(config, [Suggestion("scheduler.slo_p99_ms", -1, "bad")])
    assert config.read_text() == before  # nothing written


@pytest.mark.timeout(120)
def test_runs_unchanged_against_another_kserve_v2_server(tmp_path: Path) -> None:
    report = tmp_path / "tiny.html"
    with serve_tiny_kserve() as tiny:
        result = _invoke(
            "--url", tiny.url, "--model", "adder", "--duration", "3s", "--peak-rate", "40",
            "--output", str(report), "--json", "-",
        )  # fmt: skip
        served = tiny.requests
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)  # with --json -, standard output is only the JSON
    assert "p99 ms" in result.stderr  # the headline table went to standard error
    assert document["latency"]["count"] == served == document["client"]["sent"] > 80
    assert document["errors"] == {} and document["server"]["observed"] is False
    assert "not observed" in report.read_text() and len(_pngs(report.read_text())) == 3


@pytest.mark.timeout(180)
def test_a_model_file_without_url_gets_its_own_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # its server journals in ~/.sordino
    model = tmp_path / "digits.onnx"
    builtin = resources.files("sordino.models.builtin").joinpath("digits-classifier.onnx")
    shutil.copyfile(str(builtin), model)
    result = _invoke("--model", str(model), "--profile", "ramp", "--duration", "3s",
                     "--peak-rate", "30", "--json", "-")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "started a server for" in result.stderr
    document = json.loads(result.stdout)
    assert document["groups"]["model"]["digits"]["count"] > 20
    assert document["errors"] == {}


def test_clear_errors_for_what_a_user_gets_wrong(server: RunningServer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"segments": [{"duration": "1m", "rate": "lots"}]}))
    code, out = _stress("--url", server.url, "--model", "digits-classifier", "--profile", str(bad))
    assert code == 2 and "segments.0.rate" in out and "'lots'" in out
    code, out = _stress("--url", server.url, "--model", "nope", "--duration", "1s")
    assert code == 1 and "has no model 'nope'" in out
    code, out = _stress("--url", "http://127.0.0.1:9", "--model", "m", "--duration", "1s")
    assert code == 1 and "cannot reach" in out
    code, out = _stress("--url", server.url, "--model", "m", "--fail-on", "p99<1s")
    assert code == 2 and "must use '>'" in out
    code, out = _stress("--url", server.url, "--model", "m", "--duration", "soon")
    assert code == 2 and "invalid duration" in out


def test_without_hdrhistogram_it_says_what_to_install() -> None:
    """hdrhistogram is a new dependency: an environment without it gets one clear line."""
    script = (
        "import sys; sys.modules['hdrh'] = None; sys.argv = ['sordino', *sys.argv[1:]]; "
        "from sordino.cli.main import main; main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, "stress-test", "--url", "http://127.0.0.1:9",
         "--model", "m", "--duration", "1s"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().endswith("pip install hdrhistogram")
