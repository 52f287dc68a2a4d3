"""A version reloaded is answered throughout (as on Triton): its new load warms up beside
the old one, which serves until the new one takes its place, and a reload that fails
leaves the old one serving. Driven with real worker processes and Triton's clients; the
model's ``initialize`` is slow, so the reload takes long enough to be seen."""

from __future__ import annotations

import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sordino.config import load_config
from sordino.models.repository import scan_repository
from sordino.testing import RunningServer, serve_in_thread
from tests.waiting import wait_for

RELOADED = Path(__file__).parent.parent / "fixtures" / "triton_reload" / "slow"


def reloaded_config(
    add: int, *, sleep: float = 0.0, fail: bool = False, count: int = 1, work: float = 0.0
) -> str:
    """The fixture model's ``config.pbtxt`` (its own is ``reloaded_config(1)``): ``count``
    instances; each execute takes ``work`` seconds."""
    parameters = {
        "ADD": str(add),
        "SLEEP": str(sleep),
        "FAIL": "yes" if fail else "no",
        "WORK": str(work),
    }
    return (
        'backend: "python"\nmax_batch_size: 8\n'
        'input [{ name: "X", data_type: TYPE_FP32, dims: [ 1 ] }]\n'
        'output [{ name: "Y", data_type: TYPE_FP32, dims: [ 1 ] }, '
        '{ name: "PID", data_type: TYPE_INT64, dims: [ 1 ] }]\n'
        f"instance_group [{{ count: {count}, kind: KIND_CPU }}]\n"
        + "".join(
            f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'
            for key, value in parameters.items()
        )
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(RELOADED, tmp_path / "repo" / "slow")
    return tmp_path / "repo"


@pytest.fixture
def server(repo: Path) -> Iterator[RunningServer]:
    config = load_config(
        None, {"model_repository": str(repo), "server.model_control_mode": "explicit"}
    )
    with serve_in_thread(config, scan_repository(repo)) as running:
        yield running


class Traffic:
    """Clients asking for version 1 of ``slow`` over HTTP and gRPC until stopped; every
    answer's added number, and every failure, kept."""

    def __init__(self, server: RunningServer) -> None:
        self._server = server
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.added: list[float] = []
        self.each: list[list[float]] = [[] for _ in range(4)]  # per client, in order
        self.failures: list[str] = []
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(4)]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        wait_for(lambda: len(self.added) >= 20, "traffic on the first load")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def answers(self, more: int) -> None:
        seen = len(self.added)
        wait_for(lambda: len(self.added) >= seen + more or bool(self.failures), "more answers")

    def _run(self, client: int) -> None:
        over_grpc = client % 2
        x = np.array([[10.0]], dtype=np.float32)
        if over_grpc:
            grpc_client = grpcclient.InferenceServerClient(self._server.grpc_url)
            tensor = grpcclient.InferInput("X", [1, 1], "FP32")
        else:
            http_client = httpclient.InferenceServerClient(self._server.url[len("http://") :])
            tensor = httpclient.InferInput("X", [1, 1], "FP32")
        tensor.set_data_from_numpy(x)
        for _ in range(20_000):  # bounded; stops far earlier
            if self._stop.is_set():
                return
            try:
                if over_grpc:
                    result = grpc_client.infer("slow", [tensor], model_version="1")
                else:
                    result = http_client.infer("slow", [tensor], model_version="1")
                answer = result.as_numpy("Y")
            except InferenceServerException as exc:
                with self._lock:
                    self.failures.append(str(exc))
                return
            assert answer is not None
            with self._lock:
                self.added.append(float(answer[0, 0]) - 10.0)
                self.each[client].append(float(answer[0, 0]) - 10.0)


def _reload(server: RunningServer) -> threading.Thread:
    client = httpclient.InferenceServerClient(server.url[len("http://") :], network_timeout=120)
    loading = threading.Thread(target=client.load_model, args=("slow",))
    loading.start()
    return loading


def _duplicated_series(server: RunningServer) -> list[str]:
    lines = requests.get(f"{server.url}/metrics", timeout=30).text.splitlines()
    counts = Counter(line.rsplit(" ", 1)[0] for line in lines if not line.startswith("#"))
    return [series for series, count in counts.items() if count > 1]


def test_a_reloaded_version_answers_throughout(server: RunningServer, repo: Path) -> None:
    """Before, the version was unloaded and then loaded: for as long as its new load
    took (here 3 s of initialize), its requests were answered 404."""
    client = httpclient.InferenceServerClient(server.url[len("http://") :])
    with Traffic(server) as traffic:
        (repo / "slow" / "config.pbtxt").write_text(reloaded_config(2, sleep=3.0))
        loading = _reload(server)
        # While the new load warms up, the old one serves, ready, one series per metric.
        traffic.answers(20)
        assert loading.is_alive(), "the new load should still be starting"
        assert client.is_model_ready("slow", "1")
        index = client.get_model_repository_index()
        assert [(m["name"], m.get("version"), m["state"]) for m in index] == [
            ("slow", "1", "READY")
        ]
        assert _duplicated_series(server) == []
        loading.join(120)
        assert not loading.is_alive()
        wait_for(
            lambda: all(2.0 in each for each in traffic.each) or bool(traffic.failures),
            "every client answered by the new load",
        )
    assert traffic.failures == []
    assert traffic.added[0] == 1.0 and traffic.added[-1] == 2.0
    # The new load took the old one's place at one moment: no client was answered by
    # the old one after the new one.
    for answers in traffic.each:
        switched = answers.index(2.0)
        assert set(answers[:switched]) == {1.0} and set(answers[switched:]) == {2.0}
    assert _duplicated_series(server) == []
    workers = server.runtime.executor.statistics().workers
    assert len(workers) == 1  # the old load's worker is gone
    assert server.control is not None and server.control.statistics().reloads == 1
    client.close()


def test_a_reload_that_fails_leaves_the_old_load_serving(server: RunningServer, repo: Path) -> None:
    """Before, the failed reload had unloaded the version first and loaded it again
    from its previous files, with requests answered 404 meanwhile."""
    client = httpclient.InferenceServerClient(server.url[len("http://") :], network_timeout=120)
    with Traffic(server) as traffic:
        (repo / "slow" / "config.pbtxt").write_text(reloaded_config(2, fail=True))
        with pytest.raises(InferenceServerException, match="this load is made to fail"):
            client.load_model("slow")
        traffic.answers(20)
    assert traffic.failures == []
    assert set(traffic.added) == {1.0}
    assert client.is_model_ready("slow", "1")
    assert len(server.runtime.executor.statistics().workers) == 1
    # Mended, it reloads.
    (repo / "slow" / "config.pbtxt").write_text(reloaded_config(3))
    client.load_model("slow")
    x = httpclient.InferInput("X", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[10.0]], dtype=np.float32))
    answer = client.infer("slow", [x]).as_numpy("Y")
    assert answer is not None and float(answer[0, 0]) == 13.0
    client.close()


def test_an_ensemble_answers_throughout_its_rebuilds(tmp_path: Path) -> None:
    """An ensemble whose configuration, or a step of which, changed is rebuilt beside
    the one serving. Before, it was taken out of service, drained, then built again:
    requests meanwhile were answered 404."""
    from tests.server.test_ensemble_control import _explicit, _post, _simple
    from tests.server.test_ensembles import CENTRED, CHAIN, _ask, _repository

    root = _repository(tmp_path / "models")
    slow = CENTRED.replace(
        "        responses = []", "        time.sleep(0.05)\n        responses = []"
    )
    (root / "centred" / "1" / "model.py").write_text("import time\n" + slow)
    stop, failures, answered = threading.Event(), [], []
    with serve_in_thread(_explicit(root), _simple()) as server:
        _post(server, "chain/load")

        def traffic() -> None:
            p = np.arange(16, dtype=np.int32).reshape(1, 16)
            expected = (p + p) - (p + p).sum(axis=0)  # centred: less the batch's sums
            for _ in range(20_000):  # bounded; stops far earlier
                if stop.is_set():
                    return
                try:
                    np.testing.assert_array_equal(_ask(server.url, "chain", p, p), expected)
                except Exception as exc:
                    failures.append(repr(exc))
                    return
                answered.append(1)

        threads = [threading.Thread(target=traffic) for _ in range(4)]
        for thread in threads:
            thread.start()
        try:
            wait_for(lambda: len(answered) >= 10 or bool(failures), "answers before")
            assert failures == []
            (root / "chain" / "config.pbtxt").write_text(
                CHAIN.replace("max_batch_size: 8", "max_batch_size: 4")
            )
            _post(server, "chain/load")  # the ensemble's configuration changed
            seen = len(answered)
            wait_for(lambda: len(answered) >= seen + 10 or bool(failures), "answers after")
            (root / "centred" / "1" / "model.py").write_text("import time\n" + slow + "\n")
            _post(server, "centred/load")  # a step changed: reloaded, the ensemble rebuilt
            seen = len(answered)
            wait_for(lambda: len(answered) >= seen + 10 or bool(failures), "answers after")
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
        assert failures == []
        chain = server.runtime.get("chain")
        assert chain.max_batch_size == 4 and chain.key.generation == 2
        assert server.runtime.get("centred").key.generation == 1
        assert [p.key.name for p in server.runtime.pipelines] == ["chain"]


def test_a_change_anywhere_in_the_models_folder_makes_a_load_reload(repo: Path) -> None:
    """As on Triton: a module beside model.py, a file added or removed; not the
    __pycache__ that importing model.py writes."""
    from sordino.models.repository import load_repository_model
    from sordino.server.control_records import stamp

    def now() -> object:
        return stamp(load_repository_model(repo, "slow")[0])

    first = now()
    assert now() == first
    (repo / "slow" / "1" / "__pycache__").mkdir()
    (repo / "slow" / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    assert now() == first
    helper = repo / "slow" / "1" / "helper.py"
    helper.write_text("X = 1\n")
    added = now()
    assert added != first
    helper.unlink()
    (repo / "slow" / "notes.txt").write_text("X = 1\n")  # same size, another name
    assert now() not in (first, added)


def test_the_fixtures_configuration_is_what_the_tests_write() -> None:
    assert (RELOADED / "config.pbtxt").read_text() == reloaded_config(1)


def test_a_reloads_new_load_never_answers_from_what_the_old_one_kept() -> None:
    """The old load's answers stay in the response cache until it has drained; the new
    load's requests must not find them (the key carries the generation)."""
    from sordino.inference import ModelKey
    from sordino.server.response_cache import ResponseCache

    inputs = {"X": np.ones((1, 1), np.float32)}
    old, new = ModelKey("slow", "1"), ModelKey("slow", "1", generation=1)
    assert old == new  # one version to statistics and telemetry
    assert ResponseCache.key(old, inputs) != ResponseCache.key(new, inputs)
    assert ResponseCache.key(old, inputs) == ResponseCache.key(ModelKey("slow", "1"), inputs)


def test_a_request_that_found_the_old_load_is_answered_by_the_new_one(
    server: RunningServer, repo: Path
) -> None:
    """A request looked up before the switch and queued after it (in the loop turns in
    between, or waiting for its tenant's quota) was refused 503 by the old load's
    closed queue; nothing of it was accepted, so the service asks the new load."""
    from sordino.inference import InferRequest

    def request() -> InferRequest:
        return InferRequest(model="slow", version="1", inputs={"X": np.array([[10.0]], np.float32)})

    old = server.runtime.registry.route("slow", "1")
    (repo / "slow" / "config.pbtxt").write_text(reloaded_config(2))
    _reload(server).join(120)
    assert server.runtime.registry.route("slow", "1") is not old
    service = server.runtime.service

    async def through_infer() -> float:
        response = await service.infer(request(), old)
        try:
            return float(np.asarray(response.outputs["Y"]).reshape(-1)[0])
        finally:
            response.release()

    assert server.call(through_infer()) == 12.0
    answered: list[float] = []

    async def through_infer_soon() -> object:
        soon = service.infer_soon(request(), old, lambda answer: answered.append(0.0))
        return soon

    assert server.call(through_infer_soon()) is None  # left to infer(), which asks anew

    async def through_responses() -> list[float]:
        seen = []
        async for response, _final in service.responses(request(), old):
            seen.append(float(np.asarray(response.outputs["Y"]).reshape(-1)[0]))
            response.release()
        return seen

    assert server.call(through_responses()) == [12.0]
    assert answered == []


def test_an_instance_count_changed_alone_updates_the_model_without_a_reload(
    server: RunningServer, repo: Path
) -> None:
    """As Triton updates a model whose config.pbtxt changed in its instance count alone:
    the instances serving go on; only those added start, or those taken away stop.
    (Any other change reloads the model.)"""
    client = httpclient.InferenceServerClient(server.url[len("http://") :], network_timeout=120)
    config = repo / "slow" / "config.pbtxt"

    def pids() -> list[int]:
        return sorted(w.pid or 0 for w in server.runtime.executor.statistics().workers)

    first = pids()
    assert len(first) == 1
    with Traffic(server) as traffic:
        config.write_text(reloaded_config(1, count=3))
        client.load_model("slow")
        grown = pids()
        assert len(grown) == 3 and first[0] in grown
        assert client.get_model_config("slow")["instance_group"][0]["count"] == 3
        traffic.answers(20)
        config.write_text(reloaded_config(1, count=1))
        client.load_model("slow")
        shrunk = pids()
        assert len(shrunk) == 1 and shrunk[0] in grown
        traffic.answers(20)
    assert traffic.failures == [] and set(traffic.added) == {1.0}
    assert server.control is not None
    statistics = server.control.statistics()
    assert (statistics.updates, statistics.reloads) == (2, 0)
    assert [e.cause for e in server.runtime.events.recent("model_updated")] == [
        "instances 1 -> 3",
        "instances 3 -> 1",
    ]
    config.write_text(reloaded_config(2, count=2))  # more than the count: a reload
    client.load_model("slow")
    assert server.control.statistics().reloads == 1
    assert len(pids()) == 2 and not set(pids()) & set(shrunk)
    client.close()


def test_an_update_whose_instances_cannot_start_leaves_the_model_as_it_was(
    server: RunningServer, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = httpclient.InferenceServerClient(server.url[len("http://") :], network_timeout=120)
    config = repo / "slow" / "config.pbtxt"

    def pids() -> list[int]:
        return sorted(w.pid or 0 for w in server.runtime.executor.statistics().workers)

    first = pids()
    monkeypatch.setenv("RELOADED_FAIL_FROM", "1")  # the worker processes started from now
    config.write_text(reloaded_config(1, count=3))
    with pytest.raises(InferenceServerException, match="1 of the 3 instances asked for started"):
        client.load_model("slow")
    assert pids() == first
    assert client.get_model_config("slow")["instance_group"][0]["count"] == 1
    monkeypatch.delenv("RELOADED_FAIL_FROM")
    client.load_model("slow")  # mended: the update is made now
    assert len(pids()) == 3 and first[0] in pids()
    client.close()


def test_an_update_keeps_what_the_models_own_configuration_completed(tmp_path: Path) -> None:
    """A Python model's auto_complete_config sets max_batch_size and a dynamic batcher
    its config.pbtxt does not have: an instance update keeps them (the scheduling was
    worked out from the folder's configuration alone, which has neither)."""
    root = tmp_path / "repo"
    example = Path(__file__).parent.parent / "fixtures" / "triton_python_examples"
    shutil.copytree(example / "auto_complete", root / "auto_complete")
    config = load_config(
        None, {"model_repository": str(root), "server.model_control_mode": "explicit"}
    )
    with serve_in_thread(config, scan_repository(root)) as server:
        before = server.runtime.get("auto_complete").scheduling
        assert before.max_batch_size == 4
        folder = root / "auto_complete"
        (folder / "config.pbtxt").write_text(
            (folder / "config.pbtxt").read_text() + "instance_group [{ count: 2 }]\n"
        )
        client = httpclient.InferenceServerClient(server.url[len("http://") :])
        client.load_model("auto_complete")
        assert server.control is not None and server.control.statistics().updates == 1
        assert server.runtime.get("auto_complete").instances == 2
        assert server.runtime.get("auto_complete").scheduling == before
        client.close()
