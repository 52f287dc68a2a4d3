"""Every client command finds the server through ``$SORDINO_URL`` when ``--url`` is not given.

One server (with a journal and an admin token) answers every command; each test sets
only ``SORDINO_URL``, so a command that ignored it would knock at the default
``http://127.0.0.1:8000`` instead and fail.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sordino.cli.main import cli
from sordino.cli.server_url import DEFAULT_URL, URL_ENV, server_url
from sordino.config import RuntimeConfig
from sordino.control.admin import TOKEN_ENV
from sordino.models.repository import builtin_sources
from sordino.telemetry.journal import Journal
from sordino.telemetry.series import SecondRow
from sordino.testing import RunningServer, serve_in_thread

TOKEN = "server-url-test-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The digits model, an admin token, and a journal that already holds a minute."""
    data_dir = tmp_path_factory.mktemp("data")
    journal = Journal(data_dir / "journal.sqlite3")
    journal.open()
    start = int(time.time()) - 600
    for t in range(start, start + 60):
        row = SecondRow(
            t=t, model="digits-classifier", version="1", requests=10, errors=0,
            errors_by_reason={}, p50_ms=1.0, p99_ms=2.0, queue_ms=0.1, compute_ms=0.5,
            batches=3, batch_size=3.3, queue_depth=1, busy=0.4, slo_met=10,
        )  # fmt: skip
        journal.write_rows([row], None)
    assert journal.flush()
    journal.close()
    config = RuntimeConfig.model_validate({"server": {"admin_token": TOKEN}})
    digits = [s for s in builtin_sources() if s.name == "digits-classifier"]
    with serve_in_thread(config, digits, data_dir=data_dir) as running:
        yield running


def sordino(server: RunningServer, *args: str) -> Result:
    """Run ``sordino ARGS`` with only ``$SORDINO_URL`` naming the server (and its token)."""
    return CliRunner().invoke(cli, list(args), env={URL_ENV: server.url, TOKEN_ENV: TOKEN})


def test_models(server: RunningServer) -> None:
    result = sordino(server, "models", "list")
    assert result.exit_code == 0, result.output
    assert "digits-classifier" in result.output


def test_chaos(server: RunningServer) -> None:
    result = sordino(server, "chaos", "list", "--token", TOKEN)
    assert result.exit_code == 0, result.output
    assert "no active faults" in result.output


def test_monitor(server: RunningServer) -> None:
    result = sordino(server, "monitor", "--once", "--retries", "1")
    assert result.exit_code == 0, result.output
    assert "digits-classifier/1" in result.output
    assert server.url in result.output


def test_profile(server: RunningServer) -> None:
    result = sordino(server, "profile", "--model", "digits-classifier", "--seconds", "0.2")
    assert result.exit_code == 0, result.output
    assert "digits-classifier/1:" in result.output


def test_diagnose_reads_the_server_when_no_data_dir_is_given(
    server: RunningServer, tmp_path: Path
) -> None:
    out = tmp_path / "report.html"
    result = sordino(server, "diagnose", "--time-range", "all", "--output", str(out))
    assert result.exit_code == 0, result.output
    assert f"source {server.url}" in out.read_text()


def test_diagnose_data_dir_wins_over_the_environment(server: RunningServer, tmp_path: Path) -> None:
    """``--data-dir`` with ``$SORDINO_URL`` set reads the folder (and is no conflict)."""
    missing = tmp_path / "none"
    result = sordino(
        server, "diagnose", "--data-dir", str(missing), "--output", str(tmp_path / "r.html")
    )
    assert result.exit_code == 1
    assert f"no journal at {missing}" in result.output


def test_the_option_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(URL_ENV, "http://127.0.0.1:9")
    assert server_url("http://127.0.0.1:7", "http://127.0.0.1:8") == "http://127.0.0.1:7"
    assert server_url(None, "http://127.0.0.1:8") == "http://127.0.0.1:8"
    assert server_url(None, None) == "http://127.0.0.1:9"
    monkeypatch.setenv(URL_ENV, "")
    assert server_url(None) == DEFAULT_URL


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["--url", "http://[::1"], {}, "--url 'http://[::1' is not a server address"),
        (["--url", "ftp://host"], {}, "it must start with http:// or https://"),
        (["--url", "http://host:port"], {}, "--url 'http://host:port' is not a server address"),
        ([], {URL_ENV: "localhost:8000"}, "$SORDINO_URL 'localhost:8000' is not a server"),
    ],
)
def test_a_malformed_address_is_a_usage_error(
    args: list[str], env: dict[str, str], said: str
) -> None:
    """A bad --url or $SORDINO_URL is refused with exit 2 and the reason, never a traceback."""
    for command in (["models", "list"], ["memory", "status"], ["monitor", "--once"]):
        result = CliRunner().invoke(cli, [*command, *args], env=env)
        assert result.exit_code == 2, (command, result.output, result.exception)
        assert said in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["models", "load", ""],
        ["models", "unload", " "],
        ["profile", "--model", ""],
        ["tune", "--model", ""],
        ["generate", "--model", "", "a prompt"],
        ["stress-test", "--model", "", "--duration", "1s"],
    ],
)
def test_a_blank_model_name_is_refused_before_any_server_is_asked(args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*args, "--url", "http://127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert "give a model's name (see `sordino models list`)" in result.output
    assert "cannot reach" not in result.output and "is a file" not in result.output
