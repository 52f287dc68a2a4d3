"""``sordino profile`` as a user runs it, against ``sordino start`` with its defaults."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.cli.conftest import sordino_start


def _profile(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sordino", "profile", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_profile_prints_the_top_operators_of_a_worker_process_model(tmp_path: Path) -> None:
    """The defaults run each model in worker processes; the profile reaches into them."""
    with sordino_start([], tmp_path) as server:
        result = _profile(server.url, "--model", "digits-classifier", "--seconds", "0.5")
        assert result.returncode == 0, result.stderr
        out = result.stdout
        assert "digits-classifier/1: 20 batches of zero-filled batches (no live traffic)" in out
        assert "operator" in out and "total ms" in out and "Gemm" in out
        assert "journaled as an operator_profile event" in out
        missing = _profile(server.url, "--model", "nope", "--seconds", "0.5")
        assert missing.returncode == 1 and "unknown model" in missing.stderr
