"""The product brief's operator commands, as written: stress-test, postmortem, share-strategy.

The brief (issue 31) runs ``stress-test --profile "black_friday_2024"``, then
``postmortem --event "black_friday_2024" --metrics "all" --output
bf2024_retrospective.pdf`` with no data directory, expecting "0 manual interventions",
then ``share-strategy --name … --tags … --description … --license …`` from the live
configuration. Here the server runs with its defaults: its data directory is
``~/.sordino`` under a temporary ``$HOME``.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result
from pypdf import PdfReader

from sordino.cli.main import cli
from sordino.config import load_config
from sordino.errors import ConfigError
from sordino.loadtest.profiles import load_profile
from sordino.models.repository import builtin_sources
from sordino.testing import RunningServer, serve_in_thread


def _cli(*args: str) -> Result:
    result = CliRunner().invoke(cli, list(args))
    assert "Traceback" not in result.output, result.output
    return result


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A $HOME of its own, so that ``~/.sordino`` is this module's."""
    root = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(root))
        yield root


@pytest.fixture(scope="module")
def server(home: Path) -> Iterator[RunningServer]:
    """A server on the default data directory (``~/.sordino``), no admin token."""
    config = load_config(None, {"memory.defrag_interval": "3m"})
    digits = [s for s in builtin_sources() if s.name == "digits-classifier"]
    with serve_in_thread(config, digits, data_dir=home / ".sordino") as running:
        yield running


def test_a_profile_named_with_a_year_is_the_builtin_profile() -> None:
    assert load_profile("black_friday_2024") == load_profile("black_friday")
    with pytest.raises(ConfigError, match="one of them with a year: black_friday_2024"):
        load_profile("black_friday_24")


@pytest.mark.timeout(180)
def test_stress_test_then_postmortem_of_its_event_as_the_brief_writes_them(
    server: RunningServer, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    stress = _cli(
        "stress-test", "--url", server.url, "--model", "digits-classifier",
        "--profile", "black_friday_2024", "--duration", "2s", "--peak-rate", "20",
        "--output", "stress_report.html",
    )  # fmt: skip
    assert stress.exit_code == 0, stress.output
    assert (tmp_path / "stress_report.html").is_file()
    journal = home / ".sordino" / "journal.sqlite3"
    assert f"marked the run as event 'black_friday_2024' in {journal}" in stress.output
    report = _cli(
        "postmortem", "--event", "black_friday_2024", "--metrics", "all",
        "--output", "bf2024_retrospective.pdf",
    )  # fmt: skip
    assert report.exit_code == 0, report.output
    assert "postmortem of black_friday_2024 written to bf2024_retrospective.pdf" in report.output
    assert "0 manual intervention(s)" in report.output  # the marks are not interventions
    pdf = PdfReader(tmp_path / "bf2024_retrospective.pdf")
    assert "black_friday_2024" in "".join(page.extract_text() for page in pdf.pages)


@pytest.mark.timeout(180)
def test_a_model_file_run_is_marked_in_the_default_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --url, the server stress-test starts journals where postmortem looks."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "digits.onnx"
    builtin = resources.files("sordino.models.builtin").joinpath("digits-classifier.onnx")
    shutil.copyfile(str(builtin), model)
    stress = _cli(
        "stress-test", "--model", str(model), "--profile", "black_friday_2024",
        "--duration", "2s", "--peak-rate", "20", "--output", "stress_report.html",
    )  # fmt: skip
    assert stress.exit_code == 0, stress.output
    assert "marked the run as event 'black_friday_2024'" in stress.output
    report = _cli(
        "postmortem", "--event", "black_friday_2024", "--metrics", "all",
        "--output", "bf2024_retrospective.pdf",
    )  # fmt: skip
    assert report.exit_code == 0, report.output
    assert "0 manual intervention(s)" in report.output


def test_share_strategy_takes_the_live_configuration(
    server: RunningServer, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SORDINO_URL", server.url)
    shared = _cli(
        "share-strategy",
        "--name", "ecommerce_peak_guard",
        "--tags", "black_friday,high_traffic,sd3",
        "--description", "电商大促内存与流量守护策略",
        "--license", "apache-2.0",
    )  # fmt: skip
    assert shared.exit_code == 0, shared.output
    folder = home / ".sordino" / "strategies" / "ecommerce_peak_guard"
    assert f"shared ecommerce_peak_guard in {folder}" in shared.output
    metadata = yaml.safe_load((folder / "metadata.yaml").read_text("utf-8"))
    assert metadata["tags"] == ["black_friday", "high_traffic", "sd3"]
    assert metadata["description"] == "电商大促内存与流量守护策略"
    assert metadata["license"] == "Apache-2.0"
    fragment = yaml.safe_load((folder / "config.yaml").read_text("utf-8"))
    assert fragment["memory"]["defrag_interval"] in (180, 180.0, "3m")  # the live value
    listed = _cli("strategy", "search", "sd3")  # the registry's copy, not the built-in one
    assert listed.output.startswith("ecommerce_peak_guard 1.0.0 (registry, Apache-2.0)")
    # Only the live configuration: a file is what `strategy share --from` is for.
    refused = _cli("share-strategy", "--name", "x", "--license", "mit", "--from", "a.yaml")
    # click 8.4 quotes the option ("No such option '--from'"); 8.1-8.3 did not.
    assert refused.exit_code == 2 and re.search(r"No such option:? '?--from", refused.output)
