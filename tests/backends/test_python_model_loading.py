"""Triton's model loading API in a Python model (``pb_utils.load_model``,
``unload_model``, ``is_model_ready``), run by a real server with the model in a worker
process and driven through ``tests/fixtures/triton_python_answers/model_loader``
(``bench/triton_python_parity.py`` runs the same model on Triton)."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from sordino.backends.python import bls
from sordino.backends.python import triton_python_backend_utils as pb_utils
from sordino.config import load_config
from sordino.errors import SordinoError
from sordino.models.repository import load_repository_model
from sordino.testing import RunningServer, serve_in_thread
from tests.waiting import wait_for

FIXTURES = Path(__file__).parent.parent / "fixtures"
LOADER = FIXTURES / "triton_python_answers" / "model_loader"
ADD_SUB = FIXTURES / "triton_python_examples" / "add_sub"

ADD_SUB_CONFIG: dict[str, Any] = {
    "backend": "python",
    "input": [{"name": f"INPUT{i}", "data_type": "TYPE_FP32", "dims": [4]} for i in (0, 1)],
    "output": [{"name": f"OUTPUT{i}", "data_type": "TYPE_FP32", "dims": [4]} for i in (0, 1)],
}


def _repository(root: Path) -> Path:
    shutil.copytree(LOADER, root / "model_loader")
    shutil.copytree(ADD_SUB, root / "add_sub")
    init = root / "loader_init"
    shutil.copytree(LOADER, init)
    config = init / "config.pbtxt"
    config.write_text(
        config.read_text()
        + 'parameters { key: "LOAD_AT_INITIALIZE" value { string_value: "add_sub" } }\n'
    )
    return root


def _serve(root: Path, mode: str) -> Any:
    config = load_config(None, {"model_repository": str(root), "server.model_control_mode": mode})
    return serve_in_thread(config, load_repository_model(root, "model_loader"))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    with _serve(_repository(tmp_path / "models"), "explicit") as running:
        yield running


def _client(server: RunningServer) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=120)


def _ask(client: httpclient.InferenceServerClient, **command: Any) -> dict[str, Any]:
    tensor = httpclient.InferInput("COMMAND", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([json.dumps(command).encode()], dtype=np.object_))
    result = client.infer("model_loader", [tensor]).as_numpy("RESULT")
    answer: dict[str, Any] = json.loads(result.reshape(-1)[0])
    return answer


def test_a_model_loads_asks_about_and_unloads_another(server: RunningServer) -> None:
    client = _client(server)
    assert _ask(client, op="ready", model="add_sub") == {"ok": True, "ready": False}
    assert _ask(client, op="load", model="add_sub") == {"ok": True}
    assert client.is_model_ready("add_sub")
    assert _ask(client, op="ready", model="add_sub") == {"ok": True, "ready": True}
    assert _ask(client, op="ready", model="add_sub", version="1")["ready"] is True
    assert _ask(client, op="ready", model="add_sub", version="2")["ready"] is False
    assert _ask(client, op="unload", model="add_sub") == {"ok": True}
    assert _ask(client, op="ready", model="add_sub") == {"ok": True, "ready": False}
    assert not client.is_model_ready("add_sub")


def test_a_model_loads_files_it_sends(server: RunningServer) -> None:
    client = _client(server)
    code = base64.b64encode((ADD_SUB / "1" / "model.py").read_bytes()).decode()
    sent = _ask(
        client,
        op="load",
        model="sent",
        config=json.dumps(ADD_SUB_CONFIG),
        files={"file:1/model.py": code},
    )
    assert sent == {"ok": True}
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(np.ones(4, dtype=np.float32))
        inputs.append(tensor)
    assert list(client.infer("sent", inputs).as_numpy("OUTPUT0")) == [2, 2, 2, 2]


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ({"op": "load", "model": "nowhere"}, "no model 'nowhere' to load"),
        ({"op": "load", "model": "../x"}, "is not a model name"),
        ({"op": "load", "model": "sent", "files": {"file:1/model.py": ""}}, "needs the 'config'"),
        (
            {"op": "load", "model": "add_sub", "config": "{nope"},
            "the load request's config is not JSON",
        ),
        ({"op": "unload", "model": "nowhere"}, "unknown model 'nowhere'"),
    ],
)
def test_a_refused_call_raises_in_the_model_with_the_servers_message(
    server: RunningServer, command: dict[str, Any], said: str
) -> None:
    answer = _ask(_client(server), **command)
    assert answer["ok"] is False
    assert said in answer["error"]


def test_initialize_loads_the_models_its_model_uses(server: RunningServer) -> None:
    # loader_init's initialize loads add_sub while loader_init itself is being loaded
    # through the load API: the nested load runs inside that one, not after it.
    client = _client(server)
    client.load_model("loader_init")
    assert client.is_model_ready("loader_init")
    assert client.is_model_ready("add_sub")


def test_a_model_unloads_itself(server: RunningServer) -> None:
    client = _client(server)
    assert _ask(client, op="unload", model="model_loader") == {"ok": True}
    assert not client.is_model_ready("model_loader")


def test_without_explicit_model_control_loads_are_refused(tmp_path: Path) -> None:
    with _serve(_repository(tmp_path / "models"), "none") as running:
        client = _client(running)
        answer = _ask(client, op="load", model="add_sub")
        assert answer["ok"] is False
        assert "--model-control-mode explicit" in answer["error"]
        assert _ask(client, op="ready", model="model_loader") == {"ok": True, "ready": True}


def test_the_api_is_refused_while_the_server_starts(tmp_path: Path) -> None:
    root = _repository(tmp_path / "models")
    config = load_config(
        None, {"model_repository": str(root), "server.model_control_mode": "explicit"}
    )
    with (
        pytest.raises(SordinoError, match="available once the server has started"),
        serve_in_thread(config, load_repository_model(root, "loader_init")),
    ):
        pass


@pytest.mark.parametrize("phase", ["auto_complete_config", "finalize"])
def test_the_api_is_refused_in_auto_complete_config_and_finalize(phase: str) -> None:
    with (
        bls.executing(bls.Executing("model", phase=phase)),
        pytest.raises(pb_utils.TritonModelException, match=f"not supported in {phase}"),
    ):
        pb_utils.load_model("other")


def test_a_thread_instance_loads_from_initialize_too(server: RunningServer) -> None:
    # Run on a thread of the server process (its calls go onto the server's loop).
    root = server.runtime.config.model_repository
    assert root is not None
    (root / "loader_init" / "config.yaml").write_text("backend: python\nisolation: thread\n")
    client = _client(server)
    client.load_model("loader_init")
    assert client.is_model_ready("loader_init")
    assert client.is_model_ready("add_sub")
    assert server.runtime.get("loader_init").source.config.isolation == "thread"


def test_a_load_past_the_batchs_deadline_answers_and_goes_on(tmp_path: Path) -> None:
    """A load that outlasts the calling batch's execution timeout (less a tenth) answers
    the model an error before the worker would be killed for the batch, and goes on."""
    root = _repository(tmp_path / "models")
    slow = root / "slow"
    shutil.copytree(ADD_SUB, slow)
    code = slow / "1" / "model.py"
    code.write_text(
        "import time\n"
        + code.read_text().replace(
            "    def initialize(self, args):\n",
            "    def initialize(self, args):\n        time.sleep(4)\n",
        )
    )
    config = load_config(
        None,
        {
            "model_repository": str(root),
            "server.model_control_mode": "explicit",
            "workers.execution_timeout": 2,
        },
    )
    with serve_in_thread(config, load_repository_model(root, "model_loader")) as running:
        client = _client(running)
        answer = _ask(client, op="load", model="slow")
        assert answer["ok"] is False
        assert "not done before the calling request's deadline" in answer["error"]
        wait_for(lambda: client.is_model_ready("slow"), "the load to go on", timeout=60)
        assert _ask(client, op="ready", model="model_loader")["ready"] is True  # not killed
