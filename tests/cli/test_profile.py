"""``sordino profile`` as a user runs it, against ``sordino start`` with its defaults."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx

from sordino.cli.profile import profile_header
from sordino.config import RuntimeConfig
from sordino.models.repository import scan_repository
from sordino.telemetry.profile_data import OperatorProfile
from sordino.testing import serve_in_thread
from tests.cli.conftest import DIGITS, sordino_start

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _profile(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sordino", "profile", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_profile_prints_the_top_operators_of_a_worker_process_model(tmp_path: Path) -> None:
    """The defaults run each model in worker processes; the profile reaches into them."""
    with sordino_start(DIGITS, tmp_path) as server:
        result = _profile(server.url, "--model", "digits-classifier", "--seconds", "0.5")
        assert result.returncode == 0, result.stderr
        out = result.stdout
        assert "digits-classifier/1: 20 zero-filled batches (no live traffic) in " in out
        assert "operator" in out and "total ms" in out and "Gemm" in out
        assert "journaled as an operator_profile event" in out
        missing = _profile(server.url, "--model", "nope", "--seconds", "0.5")
        assert missing.returncode == 1 and "unknown model" in missing.stderr


def _result(batches: int, synthetic: bool) -> OperatorProfile:
    return OperatorProfile(
        model="m", version="1", started_at=0.0, seconds=2.0, batches=batches,
        synthetic=synthetic, total_ms=3.5, operators=(), nodes=(), kernel_launches=None,
    )  # fmt: skip


def test_header_says_what_ran_once() -> None:
    """Zero-filled batches are not "batches of zero-filled batches"; one batch is singular."""
    assert profile_header(_result(20, True)) == (
        "m/1: 20 zero-filled batches (no live traffic) in 2 s, 3.5 ms inside operators"
    )
    assert profile_header(_result(7, False)).startswith("m/1: 7 batches of live traffic in 2 s")
    assert profile_header(_result(1, False)).startswith("m/1: 1 batch of live traffic")


def test_a_python_model_is_refused_up_front(tmp_path: Path) -> None:
    """Before: 503 "could not profile …: add_sub/0: profile_start: RuntimeError: the
    PythonBackend backend cannot profile" after asking every instance — as if it might
    work later, with a class name for the reason."""
    shutil.copytree(FIXTURES / "triton_python_examples" / "add_sub", tmp_path / "add_sub")
    with serve_in_thread(RuntimeConfig(), scan_repository(tmp_path)) as server:
        result = _profile(server.url, "--model", "add_sub", "--seconds", "0.5")
        asked = httpx.post(f"{server.url}/v2/sordino/profile", json={"model": "add_sub"})
    assert result.returncode == 1
    assert "answered 400: model add_sub/1 runs on the python backend, which has no" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    assert asked.status_code == 400 and "python backend" in asked.text
