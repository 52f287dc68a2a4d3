"""Pipelines served as models: equal to calling the nodes by hand; bad wiring refused at load."""

from __future__ import annotations

import contextlib
import re
import threading

import httpx
import numpy as np
import pytest

from sordino.config import load_config
from sordino.control.client import AdminClient, ClientError, ServerError, request_json
from sordino.errors import ConfigError, ModelLoadError
from sordino.models.repository import builtin_sources
from sordino.server.guarding import guarded_models
from sordino.testing import RunningServer, serve_in_thread
from tests.waiting import wait_for

TWICE = {
    "name": "twice",
    "nodes": [
        {"name": "first", "model": "simple", "runtime": {"priority": "high"}},
        {
            "name": "second",
            "model": "simple",
            "inputs": {"INPUT0": "first.OUTPUT0", "INPUT1": "first.OUTPUT1"},
            "runtime": {"scheduler": "dynamic_batching", "priority": "normal"},
        },
    ],
}


def _models(*names: str) -> list:  # type: ignore[type-arg]
    return [s for s in builtin_sources() if s.name in names]


def _infer(server: RunningServer, model: str, inputs: dict[str, np.ndarray]) -> dict[str, list]:  # type: ignore[type-arg]
    body = {
        "inputs": [
            {"name": name, "shape": list(a.shape), "datatype": "INT32", "data": a.ravel().tolist()}
            for name, a in inputs.items()
        ]
    }
    answer = request_json("POST", f"{server.url}/v2/models/{model}/infer", body, timeout=30)
    return {out["name"]: out["data"] for out in answer["outputs"]}


def test_a_two_node_pipeline_equals_calling_the_nodes_by_hand() -> None:
    config = load_config(None, {"pipelines": [TWICE]})
    rng = np.random.default_rng(3)
    x0 = rng.integers(-100, 100, (3, 16), dtype=np.int32)
    x1 = rng.integers(-100, 100, (3, 16), dtype=np.int32)
    with serve_in_thread(config, _models("simple")) as server:
        first = _infer(server, "simple", {"INPUT0": x0, "INPUT1": x1})
        by_hand = _infer(
            server,
            "simple",
            {
                "INPUT0": np.array(first["OUTPUT0"], np.int32).reshape(3, 16),
                "INPUT1": np.array(first["OUTPUT1"], np.int32).reshape(3, 16),
            },
        )
        piped = _infer(server, "twice", {"INPUT0": x0, "INPUT1": x1})
        assert piped == by_hand
        assert piped["OUTPUT0"] == (2 * x0).ravel().tolist()
        metadata = request_json("GET", f"{server.url}/v2/models/twice", timeout=10)
        assert [i["name"] for i in metadata["inputs"]] == ["INPUT0", "INPUT1"]
        assert [o["name"] for o in metadata["outputs"]] == ["OUTPUT0", "OUTPUT1"]


def test_the_triton_ensemble_spelling_is_accepted() -> None:
    ensemble = {
        "name": "twice",
        "ensemble_scheduling": {
            "step": [
                {"model_name": "simple", "input_map": {"INPUT0": "INPUT0", "INPUT1": "INPUT1"},
                 "output_map": {"OUTPUT0": "sum", "OUTPUT1": "difference"}},
                {"model_name": "simple", "input_map": {"INPUT0": "sum", "INPUT1": "difference"},
                 "output_map": {"OUTPUT0": "OUTPUT0"}},
            ]
        },
    }  # fmt: skip
    config = load_config(None, {"pipelines": [ensemble]})
    assert [n.name for n in config.pipelines[0].nodes] == ["simple", "simple_2"]
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    with serve_in_thread(config, _models("simple")) as server:
        # Only what the steps' output_map names comes out (not simple_2's OUTPUT1).
        assert _infer(server, "twice", {"INPUT0": x, "INPUT1": x}) == {
            "OUTPUT0": (2 * x).ravel().tolist()
        }


def test_pipeline_inputs_and_outputs_take_names_of_their_own() -> None:
    """``inputs.NAME`` reads the pipeline input NAME; ``outputs`` names what is returned
    (the rest of the nodes' outputs is dropped), as a Triton ensemble's tensors do."""
    renamed = {
        "name": "renamed",
        "nodes": [
            {"name": "a", "model": "simple",
             "inputs": {"INPUT0": "inputs.left", "INPUT1": "inputs.right"}},
            {"name": "b", "model": "simple",
             "inputs": {"INPUT0": "a.OUTPUT0", "INPUT1": "inputs.left"}},
        ],
        "outputs": {"total": "b.OUTPUT0", "gap": "a.OUTPUT1"},
    }  # fmt: skip
    config = load_config(None, {"pipelines": [renamed]})
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    y = np.full((1, 16), 3, np.int32)
    with serve_in_thread(config, _models("simple")) as server:
        answer = _infer(server, "renamed", {"left": x, "right": y})
        assert answer == {"total": (x + y + x).ravel().tolist(), "gap": (x - y).ravel().tolist()}
        metadata = request_json("GET", f"{server.url}/v2/models/renamed", timeout=10)
        assert [i["name"] for i in metadata["inputs"]] == ["left", "right"]
        assert [o["name"] for o in metadata["outputs"]] == ["total", "gap"]


@pytest.mark.parametrize(
    ("pipeline", "said"),
    [
        ({"nodes": [{"name": "inputs", "model": "simple"}]}, "a node is named 'inputs'"),
        (
            {"nodes": [{"name": "a", "model": "simple", "inputs": {"INPUT0": "left"}}]},
            "'left' is neither NODE.OUTPUT nor inputs.NAME",
        ),
        (
            {"nodes": [{"name": "a", "model": "simple"}], "outputs": {"x": "inputs.INPUT0"}},
            "output x: 'inputs.INPUT0' is not NODE.OUTPUT",
        ),
        (
            {"nodes": [{"name": "a", "model": "simple"}], "outputs": {"x": "b.OUTPUT0"}},
            "output x comes from 'b', which is not a node of this pipeline",
        ),
    ],
)
def test_bad_names_are_refused_in_the_configuration(pipeline: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(said)):
        load_config(None, {"pipelines": [{"name": "p", **pipeline}]})


def test_an_error_names_the_node() -> None:
    bad = {**TWICE, "nodes": [TWICE["nodes"][0], {**TWICE["nodes"][1], "runtime": {"priority": 9}}]}
    config = load_config(None, {"pipelines": [bad]})
    x = np.zeros((1, 16), np.int32)
    needle = re.escape("pipeline twice, node second (model simple): priority")
    with (
        serve_in_thread(config, _models("simple")) as server,
        pytest.raises(ClientError, match=needle),
    ):
        _infer(server, "twice", {"INPUT0": x, "INPUT1": x})


def test_a_cycle_is_refused_in_the_configuration() -> None:
    cycle = {
        "name": "loop",
        "nodes": [
            {"name": "a", "model": "simple", "inputs": {"INPUT0": "b.OUTPUT0"}},
            {"name": "b", "model": "simple", "inputs": {"INPUT0": "a.OUTPUT0"}},
        ],
    }
    with pytest.raises(ConfigError, match="pipeline loop has a cycle: a -> b -> a"):
        load_config(None, {"pipelines": [cycle]})
    with pytest.raises(ConfigError, match="the nodes' memory pools add up to 2 GiB"):
        node = {"name": "a", "model": "simple", "runtime": {"memory_pool": "2GB"}}
        load_config(None, {"pipelines": [{"name": "p", "nodes": [node]}]})


@pytest.mark.parametrize(
    ("nodes", "needle"),
    [
        ([{"name": "a", "model": "nowhere"}], "model 'nowhere' is not loaded"),
        (
            [{"name": "a", "model": "simple"},
             {"name": "b", "model": "simple", "inputs": {"INPUT0": "a.OUTPUT9"}}],
            "node a has no output 'OUTPUT9'",
        ),
        (
            [{"name": "a", "model": "simple"},
             {"name": "b", "model": "digits-classifier", "inputs": {"pixels": "a.OUTPUT0"}}],
            "input pixels is FP32 [-1, 64], but a.OUTPUT0 is INT32 [-1, 16]",
        ),
    ],
)  # fmt: skip
def test_bad_wiring_is_refused_at_load(nodes: list[dict[str, object]], needle: str) -> None:
    config = load_config(None, {"pipelines": [{"name": "p", "nodes": nodes}]})
    with (
        pytest.raises(ModelLoadError, match=re.escape(needle)),
        serve_in_thread(config, _models("simple", "digits-classifier")),
    ):
        pass


def test_a_pipeline_is_ready_while_its_models_can_serve() -> None:
    """Before, readiness counted the pipeline's own instances, of which it has none:
    a server with a pipeline answered 503 to /v2/health/ready from its start on."""
    token = "pipeline-ready-token"
    config = load_config(
        None,
        {
            "pipelines": [TWICE],
            "server": {"admin_token": token},
            "workers": {"restart_backoff": "3s"},
        },
    )
    with serve_in_thread(config, _models("simple")) as server:
        for path in ("/v2/health/ready", "/v2/models/twice/ready", "/v2/models/simple/ready"):
            assert httpx.get(server.url + path).status_code == 200, path
        # The deep check runs one inference through the pipeline too (it answered 503,
        # "twice/1 has no loaded instance", before).
        deep = httpx.get(server.url + "/health?deep=true", timeout=60)
        assert deep.status_code == 200, deep.text
        assert "twice/1" in deep.json()["models"]
        # The guardian acts on the model, never on the pipeline (no instance of its own).
        assert [str(k) for k in guarded_models(server.runtime, set())] == ["simple/1"]
        admin = AdminClient(server.url, token)
        admin.inject("worker:simple", "crash", rate=1.0)
        x = np.zeros((1, 16), np.int32)

        def send() -> None:
            with contextlib.suppress(ClientError, ServerError):
                _infer(server, "simple", {"INPUT0": x, "INPUT1": x})

        sender = threading.Thread(target=send)
        sender.start()
        wait_for(
            lambda: httpx.get(server.url + "/v2/models/twice/ready").status_code == 503,
            "the pipeline to turn unready while its model's only worker restarts",
            30,
        )
        assert set(httpx.get(server.url + "/health").json()["failing"]) == {
            "simple/1",
            "twice/1",
        }
        admin.clear()
        wait_for(
            lambda: httpx.get(server.url + "/v2/models/twice/ready").status_code == 200,
            "the pipeline to be ready again once its model serves",
            60,
        )
        sender.join(60)
