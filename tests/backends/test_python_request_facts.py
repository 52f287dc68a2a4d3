"""Each request's own facts reach a Triton Python model: id, correlation ID, parameters.

A model (``tests/fixtures/triton_python_facts``) that echoes ``request_id()``,
``correlation_id()``, ``parameters()``, ``requested_output_names()`` and sordino's
``_sordino_*`` attributes into its outputs runs in a worker process (and a thread);
requests sent with Triton's clients over HTTP and gRPC (and batched together) must
each see their own, as on Triton.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from sordino.backends.base import BackendOptions
from sordino.backends.python.backend import PythonBackend
from sordino.config import RuntimeConfig
from sordino.inference import RequestFacts
from sordino.models.repository import scan_repository
from sordino.testing import RunningServer, serve_in_thread

FACTS = Path(__file__).parent.parent / "fixtures" / "triton_python_facts"
"""echo_facts (and a sequence-batched copy): the model bench/triton_python_facts.py
also serves on Triton itself."""
ECHO = (FACTS / "echo_facts" / "1" / "model.py").read_text()
ECHO_CONFIG = (FACTS / "echo_facts" / "config.pbtxt").read_text()

# The four requests of the batching test wait for each other (up to 30 s: on a loaded
# machine the last of them came more than 5 s after the first).
BATCHED_CONFIG = ECHO_CONFIG.replace(
    "input",
    "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000 }"
    "\ninput",
    1,
)


def _model(root: Path, name: str, config: str, yaml: str = "") -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    (root / name / "1" / "model.py").write_text(ECHO)
    if yaml:
        (root / name / "config.yaml").write_text(yaml)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("repo")
    _model(root, "echo", ECHO_CONFIG)
    _model(root, "echo_batched", BATCHED_CONFIG)
    _model(root, "echo_thread", ECHO_CONFIG, "backend: python\nisolation: thread\n")
    shutil.copytree(FACTS / "echo_facts_sequence", root / "echo_sequence")
    # manual: batches wait up to the configured delay, as Triton's dynamic batcher does.
    config = RuntimeConfig.model_validate({"scheduler": {"mode": "manual"}})
    with serve_in_thread(config, scan_repository(root)) as running:
        yield running


@pytest.fixture(params=["http", "grpc"])
def client(server: RunningServer, request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "http":
        client: Any = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    else:
        client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def _ask(client: Any, model: str, value: int, outputs: tuple[str, ...] = (), **kw: Any) -> Any:
    mod = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    tensor = mod.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    requested = [mod.InferRequestedOutput(name) for name in outputs] or None
    return client.infer(model, [tensor], outputs=requested, **kw)


def _facts(result: Any) -> dict[str, Any]:
    facts: dict[str, Any] = json.loads(result.as_numpy("FACTS")[0][0])
    return facts


@pytest.mark.parametrize("model", ["echo", "echo_thread"])
def test_a_request_sees_its_id_parameters_and_requested_outputs(client: Any, model: str) -> None:
    """As on Triton: request_id() is the id, parameters() the JSON of the parameters the
    server did not consume, requested_output_names() what the client asked for."""
    before = time.time()
    result = _ask(
        client,
        model,
        4,
        ("FACTS", "Y"),
        request_id="req-7",
        parameters={"mode": "fast", "n": 3, "flag": True},
        timeout=60_000_000,  # microseconds: consumed, a deadline, not a parameter
    )
    facts = _facts(result)
    assert facts["id"] == "req-7"
    assert facts["correlation_id"] == 0
    assert json.loads(facts["parameters"]) == {"mode": "fast", "n": 3, "flag": True}
    assert (facts["flags"], facts["timeout"]) == (0, 60_000_000)
    assert facts["outputs"] == ["FACTS", "Y"]
    assert isinstance(facts["priority"], int)
    assert before + 50 < facts["deadline"] < time.time() + 61
    assert facts["tenant"] is None
    assert result.as_numpy("Y")[0][0] == 5


def test_without_id_or_parameters_the_facts_are_tritons_defaults(client: Any) -> None:
    """No id: ""; no parameters: "{}"; no outputs named: every output; no timeout: no
    deadline."""
    facts = _facts(_ask(client, "echo", 1))
    assert (facts["id"], facts["correlation_id"], facts["parameters"]) == ("", 0, "{}")
    assert (facts["flags"], facts["timeout"]) == (0, 0)
    assert facts["outputs"] == ["FACTS", "Y"]
    assert facts["deadline"] is None


def test_parameters_keep_their_order_and_compact_form_over_http(server: RunningServer) -> None:
    """HTTP parameters come as Triton writes them: in order, no spaces (TritonJson)."""
    client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        result = _ask(client, "echo", 1, parameters={"b": "x y", "a": 1.5})
    finally:
        client.close()
    assert _facts(result)["parameters"] == '{"b":"x y","a":1.5}'


def test_requests_batched_together_each_see_their_own(server: RunningServer) -> None:
    """Four requests that share one execute call: each InferenceRequest has its own id,
    parameters and requested outputs."""
    client = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"), concurrency=4)

    def one(i: int) -> dict[str, Any]:
        outputs = ("FACTS", "Y") if i % 2 else ("FACTS",)
        result = _ask(client, "echo_batched", i, outputs, request_id=f"r{i}", parameters={"i": i})
        return _facts(result)

    try:
        with ThreadPoolExecutor(4) as pool:
            seen = list(pool.map(one, range(4)))
    finally:
        client.close()
    for i, facts in enumerate(seen):
        assert facts["batch"] == 4, "the four requests ran as one batch"
        assert facts["id"] == f"r{i}"
        assert json.loads(facts["parameters"]) == {"i": i}
        assert facts["outputs"] == (["FACTS", "Y"] if i % 2 else ["FACTS"])


@pytest.mark.parametrize("corrid", [42, "session-a"])
def test_a_sequence_request_sees_its_correlation_id(client: Any, corrid: int | str) -> None:
    """correlation_id() is the sequence's id (int, or str for a string id) and flags()
    its start (1) and end (2), as Triton's; sequence_id/start/end are not parameters."""
    for start, end in ((True, False), (False, True)):
        result = _ask(
            client,
            "echo_sequence",
            1,
            sequence_id=corrid,
            sequence_start=start,
            sequence_end=end,
            parameters={"turn": int(end)},
        )
        facts = _facts(result)
        assert facts["correlation_id"] == corrid
        assert facts["flags"] == (2 if end else 1)
        assert json.loads(facts["parameters"]) == {"turn": int(end)}


def test_infer_requests_hands_each_request_its_facts(tmp_path: Path) -> None:
    """In-process: rows split per request, facts per request, the _sordino_ attributes set."""
    _model(tmp_path, "echo", ECHO_CONFIG)
    backend = PythonBackend(BackendOptions(name="echo", version="1"))
    backend.load(tmp_path / "echo" / "1" / "model.py")
    try:
        facts = (
            RequestFacts(id="a", correlation_id=7, priority=1, deadline=123.5, tenant="acme"),
            RequestFacts(
                id="b", correlation_id="s", parameters='{"k":"v"}', outputs=("Y",), flags=3
            ),
        )
        batch = {"X": np.array([[1], [2], [3]], dtype=np.int32)}
        outputs = backend.infer_requests(batch, (1, 2), facts)
        seen = [json.loads(row[0]) for row in outputs["FACTS"]]
        assert [s["id"] for s in seen] == ["a", "b", "b"]
        assert seen[0]["correlation_id"] == 7 and seen[1]["correlation_id"] == "s"
        assert (seen[0]["priority"], seen[0]["deadline"], seen[0]["tenant"]) == (1, 123.5, "acme")
        assert (seen[1]["priority"], seen[1]["deadline"], seen[1]["tenant"]) == (None, None, None)
        assert seen[1]["parameters"] == '{"k":"v"}' and seen[1]["outputs"] == ["Y"]
        assert seen[0]["outputs"] == ["FACTS", "Y"]
        assert (seen[0]["flags"], seen[1]["flags"]) == (0, 3)
    finally:
        backend.unload()


def test_a_ray_actor_hands_each_request_its_facts(tmp_path: Path) -> None:
    """The Ray executor's actor runs a Python model's batch as its requests, each with
    its facts, as a worker process does (in-process here: the actor's own method)."""
    from sordino.execution.ray_actor import ModelActor

    _model(tmp_path, "echo", ECHO_CONFIG)
    backend = PythonBackend(BackendOptions(name="echo", version="1"))
    backend.load(tmp_path / "echo" / "1" / "model.py")
    actor = ModelActor()
    actor._backend = backend
    try:
        facts = (RequestFacts(id="a", priority=2, tenant="acme"), RequestFacts(id="b"))
        batch = {"X": np.array([[1], [2], [3]], dtype=np.int32)}
        kind, outputs = actor.infer(batch, None, None, (2, 1), facts)
        assert kind == "ok" and isinstance(outputs, dict)
        seen = [json.loads(row[0]) for row in outputs["FACTS"]]
        assert [(s["id"], s["batch"]) for s in seen] == [("a", 2), ("a", 2), ("b", 2)]
        assert (seen[0]["priority"], seen[0]["tenant"]) == (2, "acme")
    finally:
        backend.unload()


def test_the_servers_tenant_is_not_among_a_models_parameters() -> None:
    """The tenant the server resolved (a key's, a BLS caller's) is sordino's own fact
    (``_sordino_tenant``), not a parameter the client sent: it is left out of
    ``parameters()``, as Triton, which has no tenants, shows none. One the client sent
    without tenants configured is the client's, and passed on."""
    from sordino.inference import InferRequest
    from sordino.server.request_facts import request_facts

    resolved = InferRequest(
        model="m", inputs={}, parameters={"tenant": "acme", "mode": "fast"}, tenant="acme"
    )
    assert request_facts(resolved, 1, None, "acme").parameters == '{"mode":"fast"}'
    sent = InferRequest(model="m", inputs={}, parameters={"tenant": "acme"})
    assert request_facts(sent, 1, None, None).parameters == '{"tenant":"acme"}'
