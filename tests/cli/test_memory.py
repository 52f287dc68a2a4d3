"""``sordino memory status|defrag`` and the memory flags of ``sordino start``."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.config import load_config
from sordino.models.repository import builtin_sources
from sordino.testing import serve_in_thread
from tests.cli.conftest import sordino_start

TOKEN = "memory-test-token-123"


def _memory(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["memory", *args])
    return result.exit_code, result.output


def test_start_flags_then_status_and_defrag(tmp_path: Path) -> None:
    """The issue's command line serves; status shows the strategy; defrag reports a run."""
    flags = ["--builtin", "--memory-strategy", "fragmentation_aware", "--enable-memory-pool",
             "--pool-size", "64MB", "--defrag-interval", "5m"]  # fmt: skip
    with sordino_start(flags, tmp_path) as server:
        code, out = _memory("status", "--url", server.url)
        assert code == 0, out
        assert "strategy fragmentation_aware" in out
        assert "of 64.0 MiB" in out and "fragmentation" in out
        assert "owner default" in out and "defrag: 0 runs" in out
        assert "pool: 64.0 MiB fixed; resizes: 0" in out
        code, out = _memory("defrag", "--url", server.url)
        assert code == 0, out
        assert out.startswith("moved ") and "fragmentation" in out
        code, out = _memory("--url", server.url, "status")
        assert "defrag: 1 runs" in out


def test_defrag_needs_the_admin_token_when_one_is_set() -> None:
    config = load_config(None, {"server.admin_token": TOKEN})
    digits = [s for s in builtin_sources() if s.name == "digits-classifier"]
    with serve_in_thread(config, digits) as server:
        code, out = _memory("defrag", "--url", server.url)
        assert code == 1 and "error:" in out and "Traceback" not in out
        code, out = _memory("defrag", "--url", server.url, "--token", TOKEN)
        assert code == 0, out
        code, out = _memory("status", "--url", server.url)
        assert code == 0 and "strategy best_fit" in out
        monitor = CliRunner().invoke(cli, ["monitor", "--url", server.url, "--once"])
        assert monitor.exit_code == 0, monitor.output
        assert "memory best_fit · defrag 1 runs, 0 MB moved" in monitor.output
        assert "overflow 0 shrunk, 0 × 503 · quota 0 × 429" in monitor.output
        assert "pool 256 MB, 0 resizes" in monitor.output


def test_no_server_is_a_clear_error() -> None:
    code, out = _memory("status", "--url", "http://127.0.0.1:9")
    assert code == 1 and "cannot reach" in out and "Traceback" not in out


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--pool-size", "auto", "--pool-min", "1GB", "--pool-max", "64MB"], "memory.pool_max"),
        (["--pool-size", "lots"], "memory.pool_size"),
        (["--defrag-interval", "soon"], "memory.defrag_interval"),
        (["--disable-memory-pool", "--memory-strategy", "simple"], "memory.enabled"),
    ],
)
def test_bad_memory_flags_stop_start_clearly(tmp_path: Path, flags: list[str], needle: str) -> None:
    result = CliRunner().invoke(
        cli, ["start", "--builtin", "--data-dir", str(tmp_path), "--http-port", "0", *flags]
    )
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output


def test_a_bad_strategy_names_the_choices(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["start", "--memory-strategy", "fast"])
    assert result.exit_code == 2
    assert "fragmentation_aware" in result.output


def test_start_with_an_auto_pool_shows_its_bounds(tmp_path: Path) -> None:
    flags = ["--builtin", "--pool-size", "auto", "--pool-min", "8MB", "--pool-max", "256MB"]
    with sordino_start(flags, tmp_path) as server:
        code, out = _memory("status", "--url", server.url)
        assert code == 0, out
        assert "pool auto: 8.0 MiB (bounds 8.0 MiB..256.0 MiB)" in out
        assert "predicted peak" in out and "real peak" in out
        code, out = _memory("resize", "1KB", "--url", server.url)
        assert code == 1 and "65536" in out and "Traceback" not in out
        code, out = _memory("resize", "16MB", "--url", server.url)
        assert code == 0 and "-> 16.0 MiB" in out, out
