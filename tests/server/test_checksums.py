"""Triton's ``checksum`` repository agent: a model's files checked against the MD5
digests its ``config.pbtxt`` gives before every load (``config/checksums.py``,
``models/checksums.py``), over Triton's clients."""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sordino.config import load_config
from sordino.errors import ConfigError
from sordino.models.repository import scan_repository
from sordino.testing import RunningServer, serve_in_thread
from tests.backends.test_onnx_pbtxt import SIMPLE, _repository

EXAMPLES = Path(__file__).parent.parent / "fixtures" / "triton_python_examples"


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _agent(*pairs: tuple[str, str]) -> str:
    parameters = " ".join(f'parameters {{ key: "{k}" value: "{v}" }}' for k, v in pairs)
    return f'model_repository_agents {{ agents [ {{ name: "checksum" {parameters} }} ] }}\n'


def _simple(root: Path, agents: str) -> Path:
    """Triton's ``simple`` as an ONNX model folder, with a labels file beside its model."""
    folder = _repository(root, SIMPLE + agents) / "simple"
    (folder / "labels.txt").write_text("a\nb\n")
    return folder


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    return tmp_path / "models"


def _serve(root: Path) -> Iterator[RunningServer]:
    config = load_config(
        None, {"model_repository": str(root), "server.model_control_mode": "explicit"}
    )
    with serve_in_thread(config, []) as running:
        yield running


def _client(server: RunningServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url.removeprefix("http://"))


def _answers(client: httpclient.InferenceServerClient) -> bool:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        inputs.append(tensor)
    result = client.infer("simple", inputs)
    return bool((result.as_numpy("OUTPUT0") == 2 * np.arange(16)).all())


def test_files_that_match_load_and_a_file_that_changed_stops_the_load(repository: Path) -> None:
    """As Triton's agent: the model loads when every digest matches; once a file it
    names changes, a load fails naming the file and both digests, and a reload leaves
    the version already serving as it was."""
    folder = _simple(repository, "")
    config = folder / "config.pbtxt"
    config.write_text(
        SIMPLE
        + _agent(
            ("MD5:1/model.onnx", _md5(folder / "1" / "model.onnx")),
            # Upper case, as some tools write a digest (Triton's agent compares as given).
            ("md5:labels.txt", _md5(folder / "labels.txt").upper()),
        )
    )
    for server in _serve(repository):
        client = _client(server)
        client.load_model("simple")
        assert _answers(client)
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        for config in (
            client.get_model_config("simple"),
            grpc.get_model_config("simple", as_json=True)["config"],
        ):
            agents = config["model_repository_agents"]["agents"]
            assert [(a["name"], sorted(a["parameters"])) for a in agents] == [
                ("checksum", ["MD5:1/model.onnx", "md5:labels.txt"])
            ]
        grpc.close()
        expected = _md5(folder / "labels.txt")
        (folder / "labels.txt").write_text("a\nb\nc\n")
        with pytest.raises(InferenceServerException) as failed:
            client.load_model("simple")  # a reload of the version serving
        said = str(failed.value)
        assert "the MD5 checksum of labels.txt is " + _md5(folder / "labels.txt") in said
        assert expected.upper() in said
        assert client.is_model_ready("simple") and _answers(client)
        client.unload_model("simple")
        with pytest.raises(InferenceServerException, match=r"checksum of labels\.txt"):
            client.load_model("simple")
        assert not client.is_model_ready("simple")


def test_a_python_model_and_a_file_that_is_missing(repository: Path) -> None:
    """A Python model's ``model.py`` is checked as an ONNX model's file is; a file the
    agent names that is not there fails the load, saying which."""
    folder = repository / "add_sub"
    shutil.copytree(EXAMPLES / "add_sub", folder)
    config = folder / "config.pbtxt"
    text = config.read_text()
    config.write_text(text + _agent(("MD5:1/model.py", _md5(folder / "1" / "model.py"))))
    for server in _serve(repository):
        client = _client(server)
        client.load_model("add_sub")
        assert client.is_model_ready("add_sub")
        client.unload_model("add_sub")
        config.write_text(text + _agent(("MD5:1/gone.bin", "0" * 32)))
        with pytest.raises(InferenceServerException, match=r"cannot read .*1/gone\.bin"):
            client.load_model("add_sub")


@pytest.mark.parametrize(
    ("agents", "said"),
    [
        (_agent(("SHA256:1/model.onnx", "0" * 64)), "the algorithm 'SHA256' is not supported"),
        (_agent(("MD5:../other/1/model.onnx", "0" * 32)), "must lie inside the model's folder"),
        (_agent(("MD5:/etc/passwd", "0" * 32)), "must lie inside the model's folder"),
        (_agent(("1/model.onnx", "0" * 32)), "is not ALGORITHM:PATH"),
        (_agent(("MD5:1/model.onnx", "xyz")), "is not an MD5 digest (32 hexadecimal digits)"),
        (
            'model_repository_agents { agents [ { name: "relocation" } ] }',
            "does not support the repository agent 'relocation'",
        ),
    ],
)
def test_what_the_agent_cannot_take_is_refused_when_read(
    repository: Path, agents: str, said: str
) -> None:
    _simple(repository, agents)
    with pytest.raises(ConfigError, match=r"simple.*" + re.escape(said)):
        scan_repository(repository)


def test_a_config_yaml_gives_the_same_checksums(repository: Path) -> None:
    """sordino's own ``config.yaml`` says ``checksums`` directly; the digest is checked
    at start-up (a model that does not load stops the start, as any load error does)."""
    folder = _simple(repository, "")
    (folder / "config.pbtxt").unlink()
    digest = _md5(folder / "1" / "model.onnx")
    (folder / "config.yaml").write_text(f'checksums:\n  "MD5:1/model.onnx": "{digest}"\n')
    (source,) = scan_repository(repository)
    assert source.config.checksums == {"MD5:1/model.onnx": digest}
    with serve_in_thread(None, [source]) as server:
        assert _answers(_client(server))
    (folder / "config.yaml").write_text(f'checksums:\n  "MD5:1/model.onnx": "{"0" * 32}"\n')
    (source,) = scan_repository(repository)
    with (
        pytest.raises(Exception, match=rf"checksum of 1/model\.onnx is {digest}"),
        serve_in_thread(None, [source]),
    ):
        pass
