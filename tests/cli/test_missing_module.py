"""A module missing from the environment ends a command with one line, never a traceback.

matplotlib and statsmodels are regular dependencies now; a user who lacks one anyway
(uninstalled, or a broken environment) is told what to install. The missing module
is simulated in a child process with ``sys.modules[name] = None``, which makes
``import name`` raise ``ModuleNotFoundError`` as if it were not installed.
"""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from sordino.telemetry.journal import Journal
from sordino.telemetry.series import ResourceRow, SecondRow

ROOT = Path(__file__).resolve().parents[2]
WITHOUT = (
    "import sys; sys.modules[sys.argv[1]] = None; sys.argv = ['sordino', *sys.argv[2:]]; "
    "from sordino.cli.main import main; main()"
)


def sordino_without(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``sordino ARGS`` in a child process where ``module`` cannot be imported."""
    return subprocess.run(
        [sys.executable, "-c", WITHOUT, module, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def journal_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A journal with a quarter of an hour of traffic: enough for charts and a forecast."""
    folder = tmp_path_factory.mktemp("data")
    journal = Journal(folder / "journal.sqlite3")
    journal.open()
    now = int(time.time()) - 3600
    for minute in range(15):
        t = now + minute * 60
        row = SecondRow(
            t=t, model="m", version="1", requests=10 + minute % 4, errors=0,
            errors_by_reason={}, p50_ms=1.0, p99_ms=2.0, queue_ms=0.1, compute_ms=0.5,
            batches=3, batch_size=3.3, queue_depth=1, busy=0.4, slo_met=10,
        )  # fmt: skip
        journal.write_rows([row], ResourceRow(t, (100 + minute) << 20, 12.5, *[None] * 7))
    assert journal.flush()
    journal.close()
    return folder


@pytest.mark.parametrize("module", ["matplotlib", "statsmodels"])
def test_diagnose_without_a_report_module_says_what_to_install(
    module: str, journal_dir: Path, tmp_path: Path
) -> None:
    result = sordino_without(
        module, "diagnose", "--data-dir", str(journal_dir), "--time-range", "all",
        "--output", str(tmp_path / "report.html"),
    )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        f"error: this command needs the Python package '{module}', which is not installed: "
        f"pip install {module}"
    )


def test_diagnose_runs_with_them(journal_dir: Path, tmp_path: Path) -> None:
    """The same journal makes a report when nothing is missing (the failures above are real)."""
    result = sordino_without(
        "no_such_module_at_all", "diagnose", "--data-dir", str(journal_dir),
        "--time-range", "all", "--output", str(tmp_path / "report.html"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "report.html").stat().st_size > 0


def test_report_modules_are_regular_dependencies() -> None:
    """A plain install brings what reports need; the old extra still resolves."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = {dep.split(">")[0].split("=")[0].split(";")[0] for dep in project["dependencies"]}
    assert {"matplotlib", "statsmodels"} <= names
    assert project["optional-dependencies"]["reports"] == []


def test_onnx_is_a_regular_dependency() -> None:
    """Issue 27: `sordino quantize` failed on the README's install: onnx came only with [test]."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = {dep.split(">")[0].split("=")[0].split(";")[0] for dep in project["dependencies"]}
    assert "onnx" in names


def test_quantize_without_onnx_says_what_to_install(tmp_path: Path) -> None:
    """A broken environment still gets one line naming the package, not ONNX Runtime's text."""
    model = Path(str(resources.files("sordino.models.builtin"))) / "digits-classifier.onnx"
    result = sordino_without(
        "onnx", "quantize", str(model), "--int8", "--dynamic", "-o", str(tmp_path / "q.onnx")
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        "error: this command needs the Python package 'onnx', which is not installed: "
        "pip install onnx"
    )
