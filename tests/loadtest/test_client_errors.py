"""Requests the server refuses as client errors (issue 27, item 15), end to end.

A real server journals two stress runs against digits-diffusion: one with its example
prompts (the default) and one whose prompts name no digit. The refused requests must
show as client errors in the stress report (with the server's message, exit 4), the
telemetry snapshot and ``sordino monitor``, diagnose and the postmortem.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.generation.prompts import parse_digit_prompt
from sordino.loadtest.payloads import EXAMPLE_PROMPTS
from sordino.models.repository import builtin_sources
from sordino.testing import serve_in_thread
from tests.waiting import wait_for_closed_second

MODEL = "digits-diffusion"
_REST = {"seed": [1], "steps": [2], "guidance": [1.0]}


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.output


def _stress(url: str, *extra: str) -> tuple[int, str]:
    return _cli(
        "stress-test", "--url", url, "--model", MODEL, "--profile", "steady",
        "--duration", "2s", "--peak-rate", "4", "--arrivals", "constant", *extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data = tmp_path_factory.mktemp("live")
    bad = tmp_path_factory.mktemp("input") / "bad.json"
    bad.write_text(
        json.dumps({"data": [dict(_REST, prompt=["a cat"]), dict(_REST, prompt=["3f9a0c"])]})
    )
    sources = [s for s in builtin_sources() if s.name == MODEL]
    recorded: dict[str, Any] = {}
    with serve_in_thread(None, sources, data_dir=data) as server:
        assert _cli("event", "mark", "drill", "--start", "--data-dir", str(data))[0] == 0
        recorded["examples"] = _stress(server.url)
        report = tmp_path_factory.mktemp("report") / "bad.json"
        recorded["bad"] = _stress(server.url, "--data", str(bad), "--json", str(report))
        recorded["bad_json"] = json.loads(report.read_text())

        wait_for_closed_second(server)
        snap = httpx.get(f"{server.url}/v2/sordino/telemetry?seconds=60").json()
        (recorded["snapshot"],) = [m for m in snap["models"] if m["name"] == MODEL]
        recorded["monitor"] = _cli(
            "monitor", "--url", server.url, "--once", "--metrics", "qps,error_rate"
        )
        assert _cli("event", "mark", "drill", "--end", "--data-dir", str(data))[0] == 0
    copy = tmp_path_factory.mktemp("copy") / "data"
    shutil.copytree(data, copy)
    recorded["data_dir"] = copy
    return recorded


@pytest.mark.timeout(180)
def test_stress_sends_the_models_example_prompts_by_default(runs: dict[str, Any]) -> None:
    code, out = runs["examples"]
    assert code == 0, out
    assert "client errors" not in out
    assert "its 8 example prompts" in out


@pytest.mark.timeout(180)
def test_stress_names_client_errors_with_the_servers_message_and_fails(
    runs: dict[str, Any],
) -> None:
    code, out = runs["bad"]
    assert code == 4, out  # CLIENT_ERRORS: most answers were client errors
    assert "8 of 8 answers were client errors (100.0%; 400 ×8)" in out
    assert "names no digit" in out and "'a cat'" in out  # the server's own message
    assert "refused by the server under load" not in out
    assert re.search(r"\d+ requests refused by the server as client errors \(4xx\)", out)
    document = runs["bad_json"]
    assert document["errors_by_class"]["client_error"] == {"400": 8}
    assert {m["count"] for m in document["error_messages"]} == {4}


@pytest.mark.timeout(180)
def test_the_snapshot_and_the_monitor_count_client_errors(runs: dict[str, Any]) -> None:
    model = runs["snapshot"]
    assert sum(model["series"]["client_errors"]) == 8
    assert sum(model["series"]["errors"]) == 0  # no server error: the client's mistake
    code, out = runs["monitor"]
    assert code == 0, out
    assert "4xx" in out


@pytest.mark.timeout(180)
def test_diagnose_and_the_postmortem_show_client_errors(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    data = str(runs["data_dir"])
    out = tmp_path / "health.html"
    code, text = _cli(
        "diagnose", "--data-dir", data, "--time-range", "last_1h", "--output", str(out)
    )
    assert code == 0, text
    html = out.read_text()
    assert "client errors (4xx)" in html
    assert "refused 8 of 16 requests as client errors (50.0%; invalid_request 8)" in html
    pm = tmp_path / "pm.html"
    code, text = _cli("postmortem", "--event", "drill", "--data-dir", data, "--output", str(pm))
    assert code == 0, text
    html = pm.read_text()
    assert "availability (successful / received, 4xx client errors excluded)" in html
    assert "8 of 16 received (50.0%)" in html


@pytest.mark.parametrize("prompt", EXAMPLE_PROMPTS)
def test_every_example_prompt_is_one_the_generator_takes(prompt: str) -> None:
    """The load test's example prompts live on the client's side of the layers; the
    generator's own parser must take each of them."""
    assert 0 <= parse_digit_prompt(prompt) <= 9
