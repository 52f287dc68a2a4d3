"""``sordino chaos`` against a real server: options before or after the subcommand."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.config import load_config
from sordino.models.repository import builtin_sources
from sordino.testing import RunningServer, serve_in_thread

TOKEN = "chaos-test-token"


@pytest.fixture(scope="module")
def admin_server() -> Iterator[RunningServer]:
    config = load_config(None, {"server.admin_token": TOKEN})
    digits = [s for s in builtin_sources() if s.name == "digits-classifier"]
    with serve_in_thread(config, digits) as server:
        yield server


def _chaos(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["chaos", *args])
    return result.exit_code, result.output


def test_inject_list_clear_with_options_after_the_subcommand(admin_server: RunningServer) -> None:
    where = ["--url", admin_server.url, "--token", TOKEN]
    code, out = _chaos(
        "inject", *where, "--target", "worker:digits-classifier", "--fault", "latency",
        "--latency", "20ms", "--duration", "60s",
    )  # fmt: skip
    assert code == 0, out
    assert "latency on worker:digits-classifier" in out and "+20 ms" in out
    code, out = _chaos("list", *where)
    assert code == 0 and "worker:digits-classifier" in out
    code, out = _chaos("clear", *where)
    assert code == 0 and "cleared 1 fault(s)" in out
    assert "no active faults" in _chaos("list", *where)[1]
    kinds = [e.kind for e in admin_server.runtime.events.recent()]
    assert "fault_injected" in kinds and "fault_cleared" in kinds


def test_options_before_the_subcommand(admin_server: RunningServer) -> None:
    code, out = _chaos("--url", admin_server.url, "--token", TOKEN, "list")
    assert code == 0, out


def test_wrong_token_is_refused_clearly(admin_server: RunningServer) -> None:
    code, out = _chaos("list", "--url", admin_server.url, "--token", "not-the-token")
    assert code == 1
    assert "error:" in out and "Traceback" not in out
