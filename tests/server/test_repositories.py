"""Several model repositories served together (Triton's ``--model-repository`` given
more than once): the index, explicit loads and unloads, an ensemble whose steps are in
another repository, polling, and a name in two repositories refused naming both."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sordino.config import load_config
from sordino.models.repositories import scan_repositories
from sordino.server.model_control import ModelControl
from sordino.server.runtime import Runtime
from sordino.testing import RunningServer, VirtualClock, serve_in_thread
from tests.waiting import wait_for

SIMPLE = Path(str(resources.files("sordino.models.builtin").joinpath("simple.onnx")))

ENSEMBLE = """platform: "ensemble"
max_batch_size: 8
input [ { name: "A", data_type: TYPE_INT32, dims: [ 16 ] },
        { name: "B", data_type: TYPE_INT32, dims: [ 16 ] } ]
output [ { name: "SUM", data_type: TYPE_INT32, dims: [ 16 ] } ]
ensemble_scheduling { step [ {
  model_name: "first" model_version: -1
  input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
  output_map { key: "OUTPUT0" value: "SUM" }
} ] }
"""


def _model(root: Path, name: str) -> None:
    (root / name / "1").mkdir(parents=True)
    shutil.copyfile(SIMPLE, root / name / "1" / "model.onnx")


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    one, two = tmp_path / "one", tmp_path / "two"
    _model(one, "first")
    _model(two, "second")
    (two / "summed" / "1").mkdir(parents=True)  # an ensemble of a model of the other one
    (two / "summed" / "config.pbtxt").write_text(ENSEMBLE)
    return one, two


@pytest.fixture
def explicit(roots: tuple[Path, Path]) -> Iterator[RunningServer]:
    config = load_config(
        None,
        {"model_repository": [str(r) for r in roots], "server.model_control_mode": "explicit"},
    )
    with serve_in_thread(config, []) as running:
        yield running


def _sum(client: httpclient.InferenceServerClient, model: str, names: tuple[str, str]) -> list[int]:
    inputs = []
    for name in names:
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        inputs.append(tensor)
    output = "SUM" if model == "summed" else "OUTPUT0"
    return [int(x) for x in client.infer(model, inputs).as_numpy(output).reshape(-1)[:2]]


def test_the_models_of_every_repository_load_and_unload(
    explicit: RunningServer, roots: tuple[Path, Path]
) -> None:
    client = httpclient.InferenceServerClient(explicit.url.removeprefix("http://"))
    assert [e["name"] for e in client.get_model_repository_index()] == [
        "first", "second", "summed"
    ]  # fmt: skip
    client.load_model("second")
    assert _sum(client, "second", ("INPUT0", "INPUT1")) == [2, 2]
    client.load_model("summed")  # brings "first", from the other repository
    assert client.is_model_ready("first")
    assert _sum(client, "summed", ("A", "B")) == [2, 2]
    client.unload_model("second")
    assert not client.is_model_ready("second")
    # A name in both repositories: its load is refused, naming both; the others serve.
    _model(roots[1], "first")
    with pytest.raises(InferenceServerException, match="more than one model repository"):
        client.load_model("first")
    assert client.is_model_ready("summed")
    _model(roots[0], "fourth")
    _model(roots[1], "fourth")
    fourth = [e for e in client.get_model_repository_index() if e["name"] == "fourth"]
    reason = "model appears in two or more repositories"  # as Triton's index says it
    assert fourth == [{"name": "fourth", "state": "UNAVAILABLE", "reason": reason}]


async def test_polling_follows_every_repository(roots: tuple[Path, Path]) -> None:
    clock = VirtualClock()
    config = load_config(
        None,
        {
            "model_repository": [str(r) for r in roots],
            "server.model_control_mode": "poll",
            "server.repository_poll_secs": "30s",
        },
    )
    runtime = Runtime(config, scan_repositories(config.repositories), clock=clock)
    await runtime.start()
    control = ModelControl(runtime)
    control.start()
    try:
        assert runtime.versions("first") == ["1"] and runtime.versions("second") == ["1"]
        _model(roots[1], "third")
        shutil.rmtree(roots[0] / "first")
        await control.poll_once()
        await asyncio.to_thread(
            wait_for, lambda: runtime.versions("third") == ["1"], "the poll to load third"
        )
        assert runtime.versions("first") == []
        assert runtime.versions("second") == ["1"]
    finally:
        await control.close()
        await runtime.stop()
