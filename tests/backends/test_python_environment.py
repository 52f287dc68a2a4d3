"""Triton's ``EXECUTION_ENV_PATH``: a Python model's packed environment, first on its
worker's ``sys.path`` (``backends/python/environment.py``)."""

from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from sordino.config import load_config
from sordino.errors import ModelLoadError
from sordino.models.repository import load_repository_model
from sordino.testing import serve_in_thread
from tests.backends.python_models import load_python_backend

VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"

CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_INT32, dims: [ 1 ] } ]
parameters: { key: "EXECUTION_ENV_PATH", value: { string_value: "%s" } }
"""

MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils

import envonly_package
import envonly_by_pth


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            y = x + envonly_package.VALUE + envonly_by_pth.VALUE
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return answers
"""


def _files(version: str = VERSION) -> dict[str, bytes]:
    """An environment's files: a package in site-packages, another a .pth file adds."""
    site = f"lib/{version}/site-packages"
    return {
        f"{site}/envonly_package/__init__.py": b"VALUE = 40\n",
        f"{site}/extra.pth": b"extra_path\n",
        f"{site}/extra_path/envonly_by_pth.py": b"VALUE = 2\n",
        "bin/README": b"a packed environment (conda-pack) would have its python here\n",
    }


def _archive(path: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))


def _model(root: Path, name: str, where: str) -> Path:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG % where)
    (folder / "1" / "model.py").write_text(MODEL)
    return folder


def _ask(url: str, model: str) -> int:
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    tensor = httpclient.InferInput("X", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
    answer = int(client.infer(model, [tensor]).as_numpy("Y")[0])
    client.close()
    return answer


def test_a_model_imports_from_its_packed_environment_in_its_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unpacked_here = tmp_path / "tmp"  # where the workers unpack (TMPDIR, as they read it)
    unpacked_here.mkdir()
    monkeypatch.setenv("TMPDIR", str(unpacked_here))
    monkeypatch.setattr(tempfile, "tempdir", None)
    root = tmp_path / "models"
    packed = _model(root, "packed", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    _archive(packed / "env.tar.gz", _files())
    unpacked = _model(root, "unpacked", "env")  # a folder, relative to the model's
    for name, content in _files().items():
        (unpacked / "env" / name).parent.mkdir(parents=True, exist_ok=True)
        (unpacked / "env" / name).write_bytes(content)
    config = load_config(None, {"model_repository": str(root)})
    sources = load_repository_model(root, "packed") + load_repository_model(root, "unpacked")
    with serve_in_thread(config, sources) as server:
        assert _ask(server.url, "packed") == 43
        assert _ask(server.url, "unpacked") == 43
    assert "envonly_package" not in sys.modules  # the server's own path is untouched
    assert len(list(unpacked_here.glob("sordino-python-env-*"))) == 1  # the archive, once


def _load(folder: Path, *, own_process: bool = True) -> None:
    load_python_backend(folder, own_process=own_process)


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "tmp"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    return where


@pytest.mark.parametrize(
    ("where", "files", "own_process", "said"),
    [
        ("env.tar.gz", _files("python3.7"), True, "is not for this server's Python"),
        ("nowhere.tar.gz", None, True, "there is no file or folder"),
        ("env.tar.gz", {}, True, "cannot unpack"),
        ("env.tar.gz", _files(), False, "needs the model in a worker process of its own"),
    ],
)
def test_what_cannot_be_used_is_refused_saying_so(
    tmp_path: Path,
    scratch: Path,
    where: str,
    files: dict[str, bytes] | None,
    own_process: bool,
    said: str,
) -> None:
    folder = _model(tmp_path, "m", f"$$TRITON_MODEL_DIRECTORY/{where}")
    if files:
        _archive(folder / where, files)
    elif files is not None:
        (folder / where).write_bytes(b"not an archive")
    with pytest.raises(ModelLoadError, match=said) as refused:
        _load(folder, own_process=own_process)
    assert "EXECUTION_ENV_PATH" in str(refused.value)


def test_an_archive_is_unpacked_once(tmp_path: Path, scratch: Path) -> None:
    folder = _model(tmp_path, "m", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    _archive(folder / "env.tar.gz", _files("python3.7"))  # refused after unpacking
    for _ in range(2):
        with pytest.raises(ModelLoadError):
            _load(folder)
    assert len(list(scratch.glob("sordino-python-env-*"))) == 1


# (A private folder of this user's is one it unpacked: used, so not among the cases.)
@pytest.mark.parametrize(("mode", "owner"), [(0o777, "me"), (0o777, "another"), (0o700, "another")])
def test_a_folder_another_could_write_at_the_unpacked_place_is_not_used(
    tmp_path: Path, scratch: Path, mode: int, owner: str
) -> None:
    """The temporary folder is every user's: a folder planted where the archive would be
    unpacked (its name is predictable) is not imported from; the archive is unpacked
    afresh, into a private folder."""
    folder = _model(tmp_path, "m", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    _archive(folder / "env.tar.gz", _files())
    _load(folder)  # where it goes, found by unpacking it once
    (unpacked,) = scratch.glob("sordino-python-env-*")
    shutil.rmtree(unpacked)
    planted = unpacked / f"lib/{VERSION}/site-packages"
    planted.mkdir(parents=True)
    (planted / "envonly_package.py").write_text("raise SystemExit('the planted copy ran')\n")
    unpacked.chmod(mode)
    if owner == "another":
        if os.getuid() != 0:
            pytest.skip("only root can give a folder to another user")
        os.chown(unpacked, 65534, 65534)
    _load(folder)  # loads: the planted copy would have failed it
    assert len(list(scratch.glob("sordino-python-env-*"))) == 2
    (fresh,) = (p for p in scratch.glob("sordino-python-env-*") if p != unpacked)
    assert fresh.stat().st_mode & 0o077 == 0
