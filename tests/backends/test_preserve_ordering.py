"""Triton's ``dynamic_batching { preserve_ordering: true }``: a batch's requests are
answered only once every batch started before it was (``scheduling/batches.py``), as
Triton 2.51 answers them (``bench/triton_python_parity.py``, ``ordered``, compares)."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sordino.config import ModelConfig, load_config
from sordino.models.repository import scan_repository
from sordino.testing import RunningServer, serve_in_thread
from tests.waiting import wait_for

ANSWERS = Path(__file__).parent.parent / "fixtures" / "triton_python_answers"
EXAMPLES = Path(__file__).parent.parent / "fixtures" / "triton_python_examples"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    """``ordered`` (two instances, preserve_ordering) and ``unordered``, the same model
    without it."""
    root = tmp_path_factory.mktemp("repository")
    shutil.copytree(ANSWERS / "ordered", root / "ordered")
    shutil.copytree(ANSWERS / "ordered", root / "unordered")
    config = root / "unordered" / "config.pbtxt"
    config.write_text(config.read_text().replace("preserve_ordering: true", ""))
    with serve_in_thread(None, scan_repository(root)) as running:
        yield running  # type: ignore[misc]


def _order(server: RunningServer, model: str, protocol: str) -> str:
    """A (600 ms) sent, then B (10 ms) 0.1 s later: whether B's answer came before A's
    or with it (held until A's; the two answers' own order then is the client threads')."""
    done: dict[str, float] = {}

    def ask(name: str, ms: int) -> None:
        if protocol == "http":
            client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
            tensor = httpclient.InferInput("X", [1, 1], "INT32")
        else:
            client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
            tensor = grpcclient.InferInput("X", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[ms]], np.int32))
        answer = client.infer(model, [tensor])
        assert int(answer.as_numpy("Y")[0, 0]) == ms
        done[name] = time.monotonic()
        client.close()

    first = threading.Thread(target=ask, args=("A", 600))
    first.start()
    time.sleep(0.1)
    second = threading.Thread(target=ask, args=("B", 10))
    second.start()
    first.join(60)
    second.join(60)
    return "B before A" if done["B"] < done["A"] - 0.2 else "B with or after A"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_short_batch_waits_for_the_longer_one_started_before_it(
    server: RunningServer, protocol: str
) -> None:
    """Without ``preserve_ordering`` B (on the other instance) is answered first."""
    assert _order(server, "unordered", protocol) == "B before A"
    assert _order(server, "ordered", protocol) == "B with or after A"


def test_the_configuration_says_it(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    assert client.get_model_config("ordered")["dynamic_batching"]["preserve_ordering"] is True
    assert client.get_model_config("unordered")["dynamic_batching"]["preserve_ordering"] is False
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    ordered = grpc.get_model_config("ordered", as_json=True)["config"]["dynamic_batching"]
    assert ordered["preserve_ordering"] is True
    grpc.close()


def test_a_failed_batch_is_answered_in_its_turn_too(server: RunningServer) -> None:
    """A batch that fails (an X the model cannot sleep) still waits for the one before."""
    done: dict[str, float] = {}
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))

    def ask(ms: int) -> None:
        tensor = httpclient.InferInput("X", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[ms]], np.int32))
        client.infer("ordered", [tensor])

    def long() -> None:
        ask_on = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        tensor = httpclient.InferInput("X", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[600]], np.int32))
        ask_on.infer("ordered", [tensor])
        done["A"] = time.monotonic()

    first = threading.Thread(target=long)
    first.start()
    time.sleep(0.1)
    with pytest.raises(InferenceServerException, match="sleep length must be non-negative"):
        ask(-5)  # time.sleep(-0.005) raises in the model
    done["B"] = time.monotonic()
    first.join(60)
    assert done["B"] >= done["A"] - 0.2


def test_a_client_that_leaves_while_its_batch_waits_loses_nothing(server: RunningServer) -> None:
    """B's client leaves while B's batch waits its turn behind A: A is answered, B ends
    cancelled (every accepted request ends in one outcome), the arena gets B's rows
    back, and the next requests are answered in order as before."""
    arena = server.runtime.memory.statistics().arena
    assert arena is not None
    before = arena.in_use_bytes
    cancelled = _scheduler(server).statistics().cancelled
    answered: list[str] = []

    def long() -> None:
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        tensor = httpclient.InferInput("X", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[600]], np.int32))
        client.infer("ordered", [tensor])
        answered.append("A")

    first = threading.Thread(target=long)
    first.start()
    time.sleep(0.1)
    leaving = httpclient.InferenceServerClient(
        server.url.removeprefix("http://"), network_timeout=0.2, connection_timeout=0.2
    )
    tensor = httpclient.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[10]], np.int32))
    with pytest.raises(Exception):  # noqa: B017 (the client's own timeout, whatever its type)
        leaving.infer("ordered", [tensor])
    leaving.close()
    first.join(60)
    assert answered == ["A"]

    def settled() -> bool:
        stats = _scheduler(server).statistics()
        arena_now = server.runtime.memory.statistics().arena
        return (
            stats.in_flight == 0
            and stats.accepted == stats.succeeded + stats.failed + stats.cancelled
            and arena_now is not None
            and arena_now.in_use_bytes == before
        )

    wait_for(settled, "B's end and its rows back in the arena")
    assert _scheduler(server).statistics().cancelled == cancelled + 1
    assert _order(server, "ordered", "http") == "B with or after A"


def _scheduler(server: RunningServer) -> Any:
    return server.runtime.registry.loaded("ordered", "1").scheduler


def test_a_decoupled_model_or_one_of_several_steps_is_refused(tmp_path: Path) -> None:
    """A decoupled model sends any number of responses; an iterative or streaming one
    runs a request in several batches: the field is refused for them, by name."""
    shutil.copytree(EXAMPLES / "repeat_int32", tmp_path / "repeat_int32")
    config = tmp_path / "repeat_int32" / "config.pbtxt"
    config.write_text(config.read_text() + "dynamic_batching { preserve_ordering: true }\n")
    settings = load_config(None, {"server.model_control_mode": "explicit"})
    refused = "preserve_ordering is not supported for a decoupled"
    with serve_in_thread(settings, []) as running, pytest.raises(Exception, match=refused):
        running.call(running.runtime.load(scan_repository(tmp_path)[0]), timeout=120)
    with pytest.raises(ValueError, match="preserve_ordering is not supported for a model with"):
        ModelConfig(
            dynamic_batching={"preserve_ordering": True},
            streaming={"carry": {"Y": "X"}, "done": "DONE"},
        )
