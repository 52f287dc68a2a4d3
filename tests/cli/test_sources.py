"""What ``sordino start`` serves: an empty repository is never taken silently."""

from __future__ import annotations

import logging
import shutil
from importlib import resources
from pathlib import Path

import pytest
from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.cli.start import collect_sources
from sordino.config import load_config
from sordino.errors import ConfigError, ModelLoadError
from sordino.models.repository import ModelSource

DIGITS = Path(str(resources.files("sordino.models.builtin").joinpath("digits-classifier.onnx")))


def names(sources: list[ModelSource]) -> list[str]:
    return sorted(s.name for s in sources)


def test_an_empty_repository_alone_is_refused(tmp_path: Path) -> None:
    """Nothing at all would be served: the error says how to add a model."""
    config = load_config(None, {"model_repository": str(tmp_path)})
    with pytest.raises(ConfigError, match="holds no models, so there is nothing to serve") as err:
        collect_sources(config, (), None)
    assert str(tmp_path / "NAME" / "1" / "model.onnx") in str(err.value)
    assert "--builtin" in str(err.value)


def test_start_with_an_empty_repository_exits_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    result = CliRunner().invoke(
        cli, ["start", "--model-repository", str(tmp_path / "repo"),
              "--data-dir", str(tmp_path / "data")],
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.output.startswith(f"error: model repository {tmp_path / 'repo'} holds no models")


@pytest.mark.parametrize("mode", ["poll", "explicit"])
def test_an_empty_repository_that_can_fill_later_is_a_warning(
    mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = load_config(
        None, {"model_repository": str(tmp_path), "server.model_control_mode": mode}
    )
    assert collect_sources(config, (), None) == []
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith(f"model repository {tmp_path} holds no models")


def test_an_empty_repository_beside_other_models_is_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The demo models asked for still come; the empty repository is not silent."""
    config = load_config(None, {"model_repository": str(tmp_path / "repo")})
    (tmp_path / "repo").mkdir()
    assert "digits-classifier" in names(collect_sources(config, (), True))
    assert "holds no models" in caplog.text


def test_a_repository_replaces_the_demo_models(tmp_path: Path) -> None:
    (tmp_path / "digits" / "1").mkdir(parents=True)
    shutil.copy(DIGITS, tmp_path / "digits" / "1" / "model.onnx")
    config = load_config(None, {"model_repository": str(tmp_path)})
    assert names(collect_sources(config, (), None)) == ["digits"]


def test_triton_examples_come_with_the_flag_only(tmp_path: Path) -> None:
    config = load_config(None, {})
    assert "simple_string" not in names(collect_sources(config, (), None))
    served = names(collect_sources(config, (), None, triton_examples=True))
    assert {"simple", "simple_string", "simple_int8"} <= set(served)


def test_several_repositories_serve_their_models_together(tmp_path: Path) -> None:
    """--model-repository given twice serves the models of both, as Triton; a model
    name in both is refused, naming both."""
    for name, model in (("a", "one"), ("b", "two")):
        (tmp_path / name / model / "1").mkdir(parents=True)
        shutil.copy(DIGITS, tmp_path / name / model / "1" / "model.onnx")
    config = load_config(None, {"model_repository": [str(tmp_path / "a"), str(tmp_path / "b")]})
    assert names(collect_sources(config, (), None)) == ["one", "two"]
    (tmp_path / "b" / "one" / "1").mkdir(parents=True)
    shutil.copy(DIGITS, tmp_path / "b" / "one" / "1" / "model.onnx")
    with pytest.raises(ModelLoadError, match="'one' is in more than one model repository") as err:
        collect_sources(config, (), None)
    assert str(tmp_path / "a") in str(err.value) and str(tmp_path / "b") in str(err.value)
    result = CliRunner().invoke(
        cli, ["start", "--model-repository", str(tmp_path / "a"),
              "--model-repository", str(tmp_path / "b"), "--data-dir", str(tmp_path / "d")],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "more than one model repository" in result.output
    assert "Traceback" not in result.output
