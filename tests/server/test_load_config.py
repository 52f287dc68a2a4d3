"""A model-control load's ``config`` parameter (Triton's model repository extension): a
configuration as JSON text used instead of the model folder's, kept until the model is
unloaded, as Triton 2.51 keeps it (``bench/triton_python_parity.py`` compares)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from click.testing import CliRunner
from tritonclient.utils import InferenceServerException

from sordino.cli.main import cli
from sordino.config import load_config
from sordino.control.client import ClientError, request_json
from sordino.models.repository import builtin_sources, scan_repository
from sordino.testing import RunningServer, serve_in_thread

EXAMPLES = Path(__file__).parent.parent / "fixtures" / "triton_python_examples"

CONFIG: dict[str, Any] = {
    "backend": "python",
    "max_batch_size": 0,
    "input": [
        {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
        {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]},
    ],
    "output": [
        {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
        {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [4]},
    ],
    "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    root = tmp_path / "models"
    shutil.copytree(EXAMPLES / "add_sub", root / "add_sub")
    config = load_config(
        None, {"model_repository": str(root), "server.model_control_mode": "explicit"}
    )
    sources = scan_repository(root) + [s for s in builtin_sources() if s.name == "simple"]
    with serve_in_thread(config, sources) as running:
        yield running


def _instances(client: httpclient.InferenceServerClient) -> int:
    return int(client.get_model_config("add_sub")["instance_group"][0]["count"])


def test_a_loads_config_replaces_the_folders_until_the_model_is_unloaded(
    server: RunningServer,
) -> None:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    assert _instances(client) == 1  # config.pbtxt's
    client.load_model("add_sub", config=json.dumps(CONFIG))
    assert _instances(client) == 2
    client.load_model("add_sub")  # as on Triton: the config given stays
    assert _instances(client) == 2
    client.unload_model("add_sub")
    client.load_model("add_sub")  # unloaded: the folder's again
    assert _instances(client) == 1
    # Protobuf's JSON names (lowerCamelCase) are read as Triton reads them, over gRPC too.
    camel = {**CONFIG, "instanceGroup": [{"count": 3, "kind": "KIND_CPU"}]}
    del camel["instance_group"]
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    grpc.load_model("add_sub", config=json.dumps(camel))
    assert _instances(client) == 3


@pytest.mark.parametrize(
    ("parameters", "said"),
    [
        ({"config": "{nope"}, "the load request's config is not JSON"),
        ({"config": "[1]"}, "must be a JSON object"),
        ({"config": json.dumps({**CONFIG, "name": "other"})}, "names model 'other', but it"),
        ({"config": 5}, "load parameter 'config' must be a string"),
        ({"file:1/model.py": "eA=="}, "needs the 'config' parameter too"),
        ({"config": json.dumps(CONFIG), "file:../1/model.py": "eA=="}, "inside the model's"),
        ({"config": json.dumps(CONFIG), "file:1/model.py": "not base64!"}, "is not base64"),
        ({"config": json.dumps(CONFIG), "file:1/model.py": 7}, "must be the file's bytes"),
        ({"config": json.dumps(CONFIG), "sideload": "x"}, "load parameter 'sideload' is not"),
        (
            {"config": json.dumps({**CONFIG, "instance_group": [{"count": 1, "passive": True}]})},
            "sordino does not support instance_group.passive",
        ),
    ],
)
def test_a_config_sordino_cannot_take_is_refused_and_the_model_stays(
    server: RunningServer, parameters: dict[str, Any], said: str
) -> None:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    client.load_model("add_sub", config=json.dumps(CONFIG))
    with pytest.raises(ClientError, match="400") as refused:
        request_json(
            "POST",
            f"{server.url}/v2/repository/models/add_sub/load",
            {"parameters": parameters},
            timeout=60,
        )
    assert said in str(refused.value)
    assert _instances(client) == 2  # still served, with the config it had
    client.load_model("add_sub")
    assert _instances(client) == 2  # and the config given before is still the one kept


def test_a_model_of_the_configuration_takes_no_loads_config(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="is not a model of the repository"):
        client.load_model("simple", config=json.dumps({"max_batch_size": 4}))


def test_the_cli_loads_with_a_config_file(server: RunningServer, tmp_path: Path) -> None:
    given = tmp_path / "add_sub.json"
    given.write_text(json.dumps(CONFIG))
    done = CliRunner().invoke(
        cli, ["models", "load", "add_sub", "--config", str(given), "--url", server.url]
    )
    assert done.exit_code == 0, done.output
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    assert _instances(client) == 2
