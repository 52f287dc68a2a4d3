"""``sordino models export-builtin``: the built-in models as a repository to serve."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.models.repository import builtin_sources, scan_repository


def _export(target: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["models", "export-builtin", str(target)])
    return result.exit_code, result.output


def test_export_writes_a_repository_that_serves_what_the_builtins_serve(tmp_path: Path) -> None:
    """Every built-in comes back from the repository with its file and settings."""
    code, out = _export(tmp_path / "models")
    assert code == 0, out
    assert f"--model-repository {tmp_path / 'models'}" in out
    exported = {source.name: source for source in scan_repository(tmp_path / "models")}
    builtins = {source.name: source for source in builtin_sources()}
    assert exported.keys() == builtins.keys()
    for name, builtin in builtins.items():
        source = exported[name]
        assert source.path == tmp_path / "models" / name / "1" / "model.onnx"
        assert source.path.read_bytes() == builtin.path.read_bytes()
        assert source.config.max_batch_size == builtin.config.max_batch_size
        assert source.config.streaming == builtin.config.streaming
        assert source.config.iterative == builtin.config.iterative
    header = (tmp_path / "models" / "countdown" / "config.yaml").read_text().splitlines()[0]
    assert header.startswith("# countdown: streams one response per step")


def test_an_empty_folder_is_accepted(tmp_path: Path) -> None:
    code, out = _export(tmp_path)
    assert code == 0, out
    assert (tmp_path / "simple" / "1" / "model.onnx").is_file()


def test_a_folder_with_files_is_refused_and_left_alone(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep me")
    code, out = _export(tmp_path)
    assert code == 2
    assert f"error: {tmp_path} is not empty; give a new or empty folder" in out
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "models").write_text("")
    code, out = _export(tmp_path / "models")
    assert code == 2
    assert "is a file; give a new or empty folder" in out
    assert "Traceback" not in out


def test_an_unwritable_place_is_one_line(tmp_path: Path) -> None:
    """A folder that cannot be created is an error line, not a traceback."""
    (tmp_path / "file").write_text("")
    code, out = _export(tmp_path / "file" / "models")
    assert code == 2
    assert out.startswith(f"error: cannot write to {tmp_path / 'file' / 'models'}")
    assert "Traceback" not in out
