"""``sordino start --model [NAME=]FOLDER`` with a model folder that has a configuration
of its own — Triton's ``config.pbtxt`` (a Python model's ``backend: "python"``) or
sordino's ``config.yaml``: read as a repository's folder is. Before, the folder was
served with the defaults, its configuration unread: a Python model failed with
"no .onnx file in …/1 (expected model.onnx)", and a ``config.yaml`` was ignored."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import httpx
import pytest

import sordino.models.builtin
from sordino.errors import ConfigError
from sordino.models.repository import sources_from_spec
from tests.cli.conftest import sordino_start

BUILTIN = Path(sordino.models.builtin.__file__).parent
ADD_SUB = Path(__file__).parent.parent / "fixtures" / "triton_python_examples" / "add_sub"


def test_a_python_model_folder_serves_with_its_config_pbtxt(tmp_path: Path) -> None:
    folder = tmp_path / "add_sub"
    shutil.copytree(ADD_SUB, folder)
    with sordino_start(["--model", f"add_sub={folder}"], tmp_path) as server:
        body = {
            "inputs": [
                {"name": name, "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}
                for name in ("INPUT0", "INPUT1")
            ]
        }
        answer = httpx.post(f"{server.url}/v2/models/add_sub/infer", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
        assert outputs == {"OUTPUT0": [2, 4, 6, 8], "OUTPUT1": [0, 0, 0, 0]}


def test_a_folders_config_yaml_is_read(tmp_path: Path) -> None:
    folder = tmp_path / "add_sub"
    shutil.copytree(ADD_SUB, folder)
    (folder / "config.yaml").write_text("backend: python\nisolation: thread\n")
    (source,) = sources_from_spec(str(folder))  # no NAME: the folder's
    assert (source.name, source.config.backend, source.config.isolation) == (
        "add_sub",
        "python",
        "thread",
    )


def test_another_name_for_a_folder_with_its_own_configuration_is_refused(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "add_sub"
    shutil.copytree(ADD_SUB, folder)
    with pytest.raises(ConfigError, match=f"give --model {folder}, or rename the folder"):
        sources_from_spec(f"adder={folder}")


def test_a_versioned_folder_without_one_keeps_the_defaults(tmp_path: Path) -> None:
    (tmp_path / "plain" / "1").mkdir(parents=True)
    shutil.copy(BUILTIN / "simple.onnx", tmp_path / "plain" / "1" / "model.onnx")
    (source,) = sources_from_spec(f"renamed={tmp_path / 'plain'}")
    assert (source.name, source.version, source.config.backend) == ("renamed", "1", "onnxruntime")


def test_a_file_name_that_is_no_model_name_says_how_to_name_it(tmp_path: Path) -> None:
    """A browser's download ("model (1).onnx") or a name in another script gave pydantic's
    "String should match pattern '^[A-Za-z0-9][A-Za-z0-9_.-]*$'" and a link."""
    folder = tmp_path / "dir with space"
    folder.mkdir()
    for name in ("model (1).onnx", "分类器.onnx"):
        shutil.copy(BUILTIN / "digits-classifier.onnx", folder / name)
        spec = str(folder / name)
        with pytest.raises(ConfigError) as info:
            sources_from_spec(spec)
        message = str(info.value)
        assert f"would name the model {Path(name).stem!r}, which is not a model name" in message
        assert f"name it: --model {shlex.quote('NAME=' + spec)}" in message
        assert "pydantic" not in message
        [source] = sources_from_spec(f"digits={spec}")  # named, it serves
        assert source.name == "digits"
    with pytest.raises(
        ConfigError, match=r"'my model' is not a model name \(ASCII letters, digits"
    ):
        sources_from_spec(f"my model={folder / 'model (1).onnx'}")
