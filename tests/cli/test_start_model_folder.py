"""``sordino start --model [NAME=]FOLDER`` with a model folder that has a configuration
of its own — Triton's ``config.pbtxt`` (a Python model's ``backend: "python"``) or
sordino's ``config.yaml``: read as a repository's folder is. Before, the folder was
served with the defaults, its configuration unread: a Python model failed with
"no .onnx file in …/1 (expected model.onnx)", and a ``config.yaml`` was ignored."""

from __future__ import annotations

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
