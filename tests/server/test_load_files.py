"""A model-control load's ``file:`` parameters (Triton's model repository extension): the
files sent make the model's folder for that load, over HTTP (base64), gRPC (bytes) and
``sordino models load --file``, as Triton 2.51 takes them (``bench/triton_python_parity.py``
compares)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from click.testing import CliRunner
from tritonclient.utils import InferenceServerException

from sordino.cli.main import cli
from sordino.config import load_config
from sordino.models.repository import builtin_sources, scan_repository
from sordino.testing import RunningServer, serve_in_thread

EXAMPLES = Path(__file__).parent.parent / "fixtures" / "triton_python_examples"
ADD_SUB = (EXAMPLES / "add_sub" / "1" / "model.py").read_bytes()

CONFIG: dict[str, Any] = {
    "backend": "python",
    "input": [{"name": f"INPUT{i}", "data_type": "TYPE_FP32", "dims": [4]} for i in (0, 1)],
    "output": [{"name": f"OUTPUT{i}", "data_type": "TYPE_FP32", "dims": [4]} for i in (0, 1)],
}


@pytest.fixture
def uploads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the server (in this process) makes its temporary folders."""
    where = tmp_path / "tmp"
    where.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    return where


@pytest.fixture
def server(tmp_path: Path, uploads: Path) -> Iterator[RunningServer]:
    root = tmp_path / "models"
    shutil.copytree(EXAMPLES / "add_sub", root / "add_sub")
    config = load_config(
        None, {"model_repository": str(root), "server.model_control_mode": "explicit"}
    )
    sources = scan_repository(root) + [s for s in builtin_sources() if s.name == "simple"]
    with serve_in_thread(config, sources) as running:
        yield running


def _add_sub(client: Any, model: str, version: str = "") -> np.ndarray:
    a = np.arange(4, dtype=np.float32)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        given = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
        tensor = given.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(a)
        inputs.append(tensor)
    result = client.infer(model, inputs, model_version=version)
    return np.asarray(result.as_numpy("OUTPUT0"))


def _folders(where: Path) -> list[str]:
    return sorted(p.name for p in where.glob("sordino-upload-*"))


def test_a_model_sent_as_files_is_served_until_unloaded(
    server: RunningServer, uploads: Path
) -> None:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    client.load_model("sent", config=json.dumps(CONFIG), files={"file:1/model.py": ADD_SUB})
    assert client.is_model_ready("sent", "1")
    assert list(_add_sub(client, "sent")) == [0, 2, 4, 6]
    assert len(_folders(uploads)) == 1
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["sent"]["state"] == "READY"
    # Without files the name is looked up in the repository, which has no such folder:
    # refused, saying what to send, and the model sent stays served (as on Triton).
    with pytest.raises(InferenceServerException, match="send its files"):
        client.load_model("sent")
    assert client.is_model_ready("sent", "1")
    client.unload_model("sent")
    assert not client.is_model_ready("sent")
    assert _folders(uploads) == []  # the folder went with the model
    with pytest.raises(InferenceServerException, match="send its files"):
        client.load_model("sent")


def test_files_replace_a_repository_models_folder_for_one_load(
    server: RunningServer, uploads: Path
) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.load_model("add_sub", config=json.dumps(CONFIG), files={"file:2/model.py": ADD_SUB})
    assert client.is_model_ready("add_sub", "2")
    assert not client.is_model_ready("add_sub", "1")  # the folder sent has version 2 only
    assert list(_add_sub(client, "add_sub", "2")) == [0, 2, 4, 6]
    first = _folders(uploads)
    # Files again: a new folder, the old one removed once the new one serves.
    client.load_model("add_sub", config=json.dumps(CONFIG), files={"file:3/model.py": ADD_SUB})
    assert client.is_model_ready("add_sub", "3")
    assert len(_folders(uploads)) == 1 and _folders(uploads) != first
    # A load without files reads the repository's folder again (as on Triton).
    client.load_model("add_sub")
    assert client.is_model_ready("add_sub", "1")
    assert not client.is_model_ready("add_sub", "3")
    assert _folders(uploads) == []


def test_a_load_whose_files_fail_keeps_what_was_served(
    server: RunningServer, uploads: Path
) -> None:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    with pytest.raises(InferenceServerException, match="SyntaxError"):
        client.load_model(
            "add_sub", config=json.dumps(CONFIG), files={"file:1/model.py": b"def (:\n"}
        )
    assert client.is_model_ready("add_sub", "1")
    assert list(_add_sub(client, "add_sub")) == [0, 2, 4, 6]
    assert _folders(uploads) == []  # the failed load's folder is removed


def test_a_model_of_the_configuration_takes_no_files(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    with pytest.raises(InferenceServerException, match="model of sordino's configuration"):
        client.load_model("simple", config=json.dumps(CONFIG), files={"file:1/model.py": ADD_SUB})


def test_the_cli_sends_files(server: RunningServer, tmp_path: Path, uploads: Path) -> None:
    config = tmp_path / "sent.json"
    config.write_text(json.dumps(CONFIG))
    code = tmp_path / "model.py"
    code.write_bytes(ADD_SUB)
    runner = CliRunner()
    base = ["models", "load", "sent", "--url", server.url]
    done = runner.invoke(cli, [*base, "--config", str(config), "--file", f"1/model.py={code}"])
    assert done.exit_code == 0, done.output
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    assert list(_add_sub(client, "sent")) == [0, 2, 4, 6]
    for args, said in (
        (["--file", f"1/model.py={code}"], "--file needs --config"),
        (["--config", str(config), "--file", "1/model.py"], "give VERSION/FILE=PATH"),
        (["--config", str(config), "--file", f"1/model.py={tmp_path / 'nope'}"], "cannot read"),
    ):
        done = runner.invoke(cli, [*base, *args])
        assert done.exit_code == 2, done.output
        assert said in done.output
    assert not isinstance(done.exception, Exception) or isinstance(done.exception, SystemExit)


def test_uploaded_folders_are_removed_when_the_server_stops(tmp_path: Path, uploads: Path) -> None:
    config = load_config(None, {"server.model_control_mode": "explicit"})
    with serve_in_thread(config, []) as running:
        client = httpclient.InferenceServerClient(running.url.removeprefix("http://"))
        client.load_model("sent", config=json.dumps(CONFIG), files={"file:1/model.py": ADD_SUB})
        assert len(_folders(uploads)) == 1
    assert _folders(uploads) == []
