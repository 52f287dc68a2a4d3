"""The Ray executor against a real local Ray cluster of two nodes (``ray.cluster_utils``).

One cluster (a head and a second node, two CPUs each, no dashboard) and one server
(the digits classifier as two actors, spread over the nodes) serve the tests here;
they run in file order: what needs both nodes before the node kill, the crash after.
Skipped only where ``ray`` is not installed (CI installs it with the ``test`` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import queue
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest

from sordino.cli.memory import describe_status
from sordino.config import ModelConfig, RayModelOptions, RuntimeConfig
from sordino.errors import ModelLoadError, Unavailable
from sordino.execution.ray_instance import INLINE_BYTES
from sordino.inference import ModelKey
from sordino.memory.refs import Tensors
from sordino.models.repository import scan_repository
from sordino.testing import RunningServer, serve_in_thread
from tests.cli.conftest import sordino_start
from tests.execution.load import BODY, Load, digits, events, mark, wait_until
from tests.models import identity_model
from tests.waiting import wait_for

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'sordino[ray]')")
cluster_utils = pytest.importorskip("ray.cluster_utils")

MB = 1024 * 1024
QUOTA = 8192
"""Tenant "small"'s per-node quota: a digits row stages a few hundred bytes."""
# Node loss is noticed in about 1.5 s instead of Ray's default 15 s.
FAST_HEALTH = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}


STARTS = 3
"""Tries at starting the cluster: Ray waits a fixed 30 s for a node's raylet to register,
which a loaded 2-core CI machine has overrun once (the whole file then errored)."""


def _start_cluster() -> Any:
    made = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "resources": {"head": 1},
            "include_dashboard": False,
            "object_store_memory": 80 * MB,
            "_system_config": FAST_HEALTH,
        },
    )
    try:
        made.second = made.add_node(
            num_cpus=2, resources={"second": 1}, object_store_memory=80 * MB
        )
        made.wait_for_nodes()
    except BaseException:
        made.shutdown()
        raise
    return made


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    for attempt in range(1, STARTS + 1):
        before = {child.pid for child in psutil.Process().children(recursive=True)}
        try:
            made = _start_cluster()
            break
        except Exception as error:
            if "timed out during startup" not in str(error) or attempt == STARTS:
                raise
            # A head that failed to start is no Cluster to shut down: its processes are.
            started = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
            for child in started:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
            psutil.wait_procs(started, timeout=10)
    try:
        yield made
    finally:
        made.shutdown()


@pytest.fixture(scope="module")
def server(cluster: Any) -> Iterator[RunningServer]:
    config = RuntimeConfig.model_validate(
        {
            "executor": {"kind": "ray", "address": cluster.address, "namespace": "sordino-test"},
            "workers": {"heartbeat_timeout": "5s", "restart_backoff": "0.5s"},
            # Each node's pool: 16 MB; tenant "small" may hold QUOTA bytes in each.
            "memory": {
                "pool_size": "16MB",
                "quotas": [{"tenant": "small", "max": QUOTA}],
                "quota_wait": "2s",
            },
        }
    )
    sources = digits(instance_count=2, ray={"num_cpus": 1, "placement": "spread"})
    with serve_in_thread(config, sources) as running:
        yield running


def _actors(server: RunningServer) -> list[Any]:
    return [w for w in server.runtime.executor.statistics().workers if w.isolation == "ray"]


def test_batches_run_on_both_nodes(server: RunningServer, cluster: Any) -> None:
    """Two actors, spread: one on each node; both run batches; /metrics shows the nodes."""
    actors = _actors(server)
    assert len(actors) == 2 and all(a.state == "ready" for a in actors)
    node_ids = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert {a.node for a in actors} == node_ids, "spread placement puts one actor on each node"
    with Load(server.url, clients=4) as load:
        wait_until(lambda: all(a.batches >= 5 for a in _actors(server)), 60, "both actors to serve")
    assert load.errors == []
    text = httpx.get(server.url + "/metrics").text
    assert 'sordino_node_batches_total{node="' in text


def _memory(server: RunningServer) -> dict[str, Any]:
    response = httpx.get(server.url + "/v2/sordino/memory", timeout=30)
    assert response.status_code == 200, response.text
    document: dict[str, Any] = response.json()
    return document


def test_memory_is_reported_per_node(server: RunningServer) -> None:
    """After batches ran on both nodes, each node's pool has figures: in the memory
    document, ``sordino memory status``'s table, /metrics by node and the telemetry."""
    node_ids = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    nodes = {n["node"]: n for n in _memory(server)["nodes"]}
    assert set(nodes) == node_ids
    for node in nodes.values():
        arena = node["arena"]
        assert node["batches"] >= 5, "the batches of the first test ran in this node's pool"
        assert arena["reserved_bytes"] == 16 * MB and arena["acquired"] >= node["batches"]
        assert 0 < arena["peak_bytes"] <= arena["reserved_bytes"]
        assert arena["largest_free"] <= arena["free_bytes"]
        assert 0.0 <= arena["fragmentation"] <= 1.0
        small = next(o for o in node["owners"] if o["owner"] == "small")
        assert small["quota_bytes"] == QUOTA
    lines = describe_status(_memory(server))
    table = lines[lines.index("ray node pools:") + 1 :]
    assert table[0].split()[:2] == ["node", "address"]
    assert {line.split()[0] for line in table[1:3]} == {n[:12] for n in node_ids}
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    for node in node_ids:
        assert f'sordino_memory_node_peak_bytes{{node="{node}"}}' in metrics
        assert f'sordino_memory_node_owner_quota_bytes{{node="{node}",owner="small"}}' in metrics
    pools = {p.name for p in server.runtime.telemetry.resources.sample().pools}
    assert {f"ray_node:{node}" for node in node_ids} <= pools


def _infer_as(server: RunningServer, tenant: str, rows: int = 1) -> httpx.Response:
    body = {
        "inputs": [
            {"name": "pixels", "datatype": "FP32", "shape": [rows, 64], "data": [0.5] * 64 * rows}
        ]
    }
    return httpx.post(
        server.url + "/v2/models/digits-classifier/infer",
        json=body,
        headers={"x-sordino-tenant": tenant},
        timeout=60,
    )


def test_a_tenant_over_its_per_node_quota_waits_then_is_refused(server: RunningServer) -> None:
    """Tenant "small" holding its whole quota on both nodes: its request waits
    memory.quota_wait there, then gets 429; another tenant is served meanwhile; once
    its bytes on the node are given back, it is served again."""
    pools = server.runtime.executor.pools
    assert pools is not None
    held = [pools.get(node) for node, _ in pools.nodes()]
    for pool in held:
        assert pool is not None
        server.call(pool.quotas.acquire("small", QUOTA))  # as if batches of it ran there
    try:
        refused = _infer_as(server, "small")
        assert refused.status_code == 429, refused.text
        assert "quota" in refused.json()["error"]
        assert _infer_as(server, "other-tenant").status_code == 200
        waits = {n["node"]: n for n in _memory(server)["nodes"]}
        small = [next(o for o in n["owners"] if o["owner"] == "small") for n in waits.values()]
        assert sum(o["rejections"] for o in small) == 1 and sum(o["waits"] for o in small) == 1
        assert all(o["in_use_bytes"] == QUOTA for o in small)
    finally:
        for pool in held:
            assert pool is not None
            server.call(_release(pool, "small", QUOTA))
    assert _infer_as(server, "small").status_code == 200
    too_large = _infer_as(server, "small", rows=40)  # > QUOTA bytes on its own
    assert too_large.status_code == 400 and "whole quota" in too_large.json()["error"]


async def _release(pool: Any, owner: str, nbytes: int) -> None:
    pool.quotas.release(owner, nbytes)


def test_results_equal_the_process_executor(server: RunningServer) -> None:
    """The same inputs give the same outputs through a Ray actor and a worker process."""
    rng = np.random.default_rng(7)
    rows = rng.random((5, 64), dtype=np.float32)
    body = {
        "inputs": [
            {"name": "pixels", "datatype": "FP32", "shape": [5, 64], "data": rows.ravel().tolist()}
        ]
    }
    path = "/v2/models/digits-classifier/infer"
    on_ray = httpx.post(server.url + path, json=body, timeout=60).json()
    with serve_in_thread(RuntimeConfig(), digits()) as local:
        on_process = httpx.post(local.url + path, json=body, timeout=60).json()
    assert on_ray["outputs"] == on_process["outputs"]


def test_error_fault_runs_inside_the_actor(server: RunningServer) -> None:
    """An injected error fault fails the batch inside the actor; the actor keeps serving."""
    executor = server.runtime.executor
    fault = executor.inject_fault("worker:digits-classifier/0", "error", rate=1.0)
    try:
        for _ in range(4):
            httpx.post(server.url + "/v2/models/digits-classifier/infer", json=BODY, timeout=60)
        assert executor.faults.applied >= 1
    finally:
        executor.faults.clear(fault.id)
    assert all(a.state == "ready" for a in _actors(server))
    response = httpx.post(server.url + "/v2/models/digits-classifier/infer", json=BODY, timeout=60)
    assert response.status_code == 200


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def test_sordino_start_serves_through_the_cluster(cluster: Any, tmp_path: Path) -> None:
    """``sordino start --executor ray --ray-address ADDRESS``: serves, then stops cleanly."""
    source = digits()[0]
    config = tmp_path / "runtime_config.yaml"
    config.write_text(
        f"models:\n  - name: digits-classifier\n    path: {source.path}\n"
        "    ray: {num_cpus: 0}\n",
        encoding="utf-8",
    )
    args = ["--config", str(config), "--executor", "ray", "--ray-address", cluster.address]
    before = set(os.listdir("/dev/shm"))
    with sordino_start(args, tmp_path, timeout=120) as running:
        path = "/v2/models/digits-classifier/infer"
        response = httpx.post(running.url + path, json=BODY, timeout=60)
        assert response.status_code == 200, response.text
        # Only this server's segments: another test file runs beside this one (xdist)
        # and makes and keeps its own. A node's pool is a psm_ segment of 16 MB or more
        # (tests make small ones); the server's own are named after its pid.
        pools = {
            name
            for name in set(os.listdir("/dev/shm")) - before
            if name.startswith(f"sordino-{running.process.pid}-")
            or (name.startswith("psm_") and _size(f"/dev/shm/{name}") >= 1 << 20)
        }
        assert any(name.startswith("psm_") for name in pools), "each node's pool is a segment"
        running.process.send_signal(signal.SIGTERM)
        assert running.process.wait(timeout=60) == 0
    assert "Traceback" not in "\n".join(running.lines)
    # ray.kill alone left the node pools' segments behind (the kill took the resource
    # tracker that would have removed them): each pool now removes its own first.
    assert not pools & set(os.listdir("/dev/shm"))


def test_guardian_scale_adds_and_removes_actors(server: RunningServer) -> None:
    """The guardian's scale_workers path: more actors on the cluster — as many as its
    CPUs hold (two more of a CPU each, not three) — then back to two."""
    runtime = server.runtime
    key = runtime.executor.find_model("digits-classifier")
    assert key is not None
    added = server.call(asyncio.wait_for(runtime.executor.scale(key, 3, minimum=1, maximum=6), 60))
    assert len(added) == 2 and all(a.isolation == "ray" and a.serving for a in added)
    assert len(_actors(server)) == 4
    removed = server.call(runtime.executor.scale(key, -2, minimum=1, maximum=6))
    assert len(removed) == 2 and len(_actors(server)) == 2


def test_pack_places_a_models_actors_together(server: RunningServer) -> None:
    """placement: pack reserves one placement group; its actors share a node; unload frees it."""
    runtime = server.runtime
    source = digits(instance_count=2, ray={"num_cpus": 0.5, "placement": "pack"})[0]
    key = ModelKey("packed", "1")
    start = mark(server)
    server.call(runtime.executor.load(key, source.path, source.config))
    try:
        packed = [w for w in runtime.executor.statistics().workers if w.model == "packed"]
        assert len(packed) == 2 and len({w.node for w in packed}) == 1
        placed = [e for e in events(server, "ray_actor_placed", start)]
        assert {e.payload["node"] for e in placed} == {packed[0].node}
        groups = ray.util.placement_group_table()
        assert any(g["state"] == "CREATED" and g["strategy"] == "PACK" for g in groups.values())
    finally:
        server.call(runtime.executor.unload(key))
    groups = ray.util.placement_group_table()
    assert not any(g["state"] == "CREATED" for g in groups.values())


def test_a_reloads_new_load_has_its_own_actors_and_placement_group(
    server: RunningServer,
) -> None:
    """A version reloaded is loaded again beside the one serving (its next generation):
    each load has its own actors and placement group, and the old one's unload leaves
    the new one's whole (they were one entry, keyed by the version)."""
    runtime = server.runtime
    source = digits(instance_count=1, ray={"num_cpus": 0.25, "placement": "pack"})[0]
    old, new = ModelKey("regen", "1"), ModelKey("regen", "1", generation=1)

    def created() -> int:
        table = ray.util.placement_group_table().values()
        return sum(1 for g in table if g["state"] == "CREATED")

    before = created()
    server.call(runtime.executor.load(old, source.path, source.config))
    try:
        server.call(runtime.executor.load(new, source.path, source.config))
        assert created() == before + 2
        server.call(runtime.executor.unload(old))
        assert created() == before + 1
        assert runtime.executor.instances(new) == 1
        rows = Tensors.of({"pixels": np.zeros((1, 64), np.float32)})
        outputs = server.call(runtime.executor.run(new, [rows]))
        outputs.release()  # type: ignore[attr-defined]
    finally:
        server.call(runtime.executor.unload(old))
        server.call(runtime.executor.unload(new))
    assert created() == before


def test_a_cluster_too_small_for_a_model_is_named_at_once(server: RunningServer) -> None:
    """Actors the cluster cannot hold are refused before any is waited for, naming the
    shortfall and the setting; by default an actor asks for a quarter of a CPU."""
    runtime = server.runtime
    source = digits(instance_count=9)[0]  # no ray options: the defaults
    key = ModelKey("crowded", "1")
    # Two CPUs per node; the server's two actors hold one each.
    expected = (
        r"CPU 2.25 \(9 actors x 0.25, models\[\]\.ray\.num_cpus\) but the cluster has 4, "
        r"2 held by the models loaded before"
    )
    with pytest.raises(ModelLoadError, match=expected):
        server.call(asyncio.wait_for(runtime.executor.load(key, source.path, source.config), 30))
    assert not [w for w in runtime.executor.statistics().workers if w.model == "crowded"]


def test_killing_the_second_node_under_load_costs_no_request(
    server: RunningServer, cluster: Any, request: pytest.FixtureRequest
) -> None:
    """Kill node two's raylet under load: batches retried, its actor re-placed, zero errors."""
    start = mark(server)
    gone = cluster.second.node_id
    assert gone in {a.node for a in _actors(server)}, "an actor runs on the second node"
    pools = server.runtime.executor.pools
    assert pools is not None
    # A node that dies takes its /dev/shm with it; this "node" shares the machine's,
    # where its pool's segment would stay: removed at the end.
    pool = pools.get(gone)
    assert pool is not None
    segment = pool.segment
    request.addfinalizer(lambda: Path(f"/dev/shm/{segment}").unlink(missing_ok=True))
    with Load(server.url, clients=6) as load:
        load.wait_ok(30)
        cluster.remove_node(cluster.second, allow_graceful=False)
        wait_until(lambda: events(server, "worker_restarted", start), 90, "the re-placement")
        wait_until(lambda: all(a.state == "ready" for a in _actors(server)), 60, "both serving")
        load.wait_ok(30)
    assert load.errors == []
    (restarted,) = events(server, "worker_restarted", start)
    assert restarted.payload["from_node"] == gone
    assert events(server, "batch_retried", start), "the batch in flight on node two ran again"
    live = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert {a.node for a in _actors(server)} <= live


def test_crash_fault_ends_the_actor_which_is_replaced(server: RunningServer) -> None:
    """A crash fault ends the actor's process: its batch runs on the other, it is replaced."""
    start = mark(server)
    executor = server.runtime.executor
    before = next(a for a in _actors(server) if a.index == 1)
    with Load(server.url, clients=4) as load:
        load.wait_ok(10)
        fault = executor.inject_fault("worker:digits-classifier/1", "crash", rate=1.0)
        wait_until(lambda: events(server, "worker_failed", start), 60, "the crash")
        executor.faults.clear(fault.id)
        wait_until(lambda: events(server, "worker_restarted", start), 60, "the replacement")
        load.wait_ok(20)
    assert load.errors == []
    (failed,) = events(server, "worker_failed", start)
    assert failed.subject == "digits-classifier/1" and "actor lost" in failed.cause
    after = next(a for a in _actors(server) if a.index == 1)
    assert after.state == "ready" and after.pid != before.pid
    assert after.restarts == before.restarts + 1


def test_a_large_batch_goes_through_the_object_store(server: RunningServer, tmp_path: Path) -> None:
    """A batch over INLINE_BYTES is put in the object store once; the outputs come back whole."""
    runtime = server.runtime
    path = identity_model(tmp_path / "wide.onnx", "FP32", width=40_000)
    key = ModelKey("wide", "1")
    config = ModelConfig(name="wide", ray=RayModelOptions(num_cpus=0))
    server.call(runtime.executor.load(key, path, config))
    try:
        rows = np.random.default_rng(3).random((2, 40_000), dtype=np.float32)
        assert rows.nbytes > INLINE_BYTES
        outputs = server.call(runtime.executor.run(key, [{"x": rows}]))
        try:
            (name,) = list(outputs)
            np.testing.assert_array_equal(np.asarray(outputs[name]), rows)
        finally:
            outputs.release()
    finally:
        server.call(runtime.executor.unload(key))


def test_hang_is_found_by_the_heartbeat_and_replaced(server: RunningServer) -> None:
    """A hang fault stops the actor's process: no heartbeat, so it is killed and replaced."""
    start = mark(server)
    executor = server.runtime.executor
    with Load(server.url, clients=4) as load:
        load.wait_ok(10)
        fault = executor.inject_fault("worker:digits-classifier/0", "hang", rate=1.0)
        wait_until(lambda: events(server, "worker_failed", start), 60, "hang detection")
        executor.faults.clear(fault.id)
        wait_until(lambda: events(server, "worker_restarted", start), 60, "the replacement")
        load.wait_ok(20)
    assert load.errors == []
    (failed,) = events(server, "worker_failed", start)
    assert failed.subject == "digits-classifier/0"
    assert failed.cause.startswith(("hang: no heartbeat", "timeout:")), failed.cause


def test_profiling_is_refused_with_a_clear_message(server: RunningServer, tmp_path: Path) -> None:
    executor = server.runtime.executor
    key = executor.find_model("digits-classifier")
    assert key is not None
    with pytest.raises(Unavailable, match="not supported with the ray executor"):
        server.call(
            executor.profile(key, seconds=0.1, trace_dir=tmp_path, synthetic_batch=lambda: {})
        )


def test_a_decoupled_model_is_refused_on_ray_naming_the_executor(server: RunningServer) -> None:
    """A decoupled Python model (Triton's square) cannot answer from an actor: a clear
    load error, and no actor is left behind."""
    runtime = server.runtime
    folder = Path(__file__).parent.parent / "fixtures" / "triton_python_examples"
    source = next(s for s in scan_repository(folder) if s.name == "square_int32")
    key = ModelKey("square_int32", "1")
    # Asks no CPU: the module's other models may hold the whole test cluster by now.
    config = source.config.model_copy(update={"ray": RayModelOptions(num_cpus=0)})
    with pytest.raises(ModelLoadError, match=r"decoupled models do not run on Ray actors"):
        server.call(asyncio.wait_for(runtime.executor.load(key, source.path, config), 60))
    assert not [w for w in runtime.executor.statistics().workers if w.model == "square_int32"]


def test_a_grpc_cancel_reaches_is_cancelled_on_the_actor(
    server: RunningServer, tmp_path: Path
) -> None:
    """A Triton Python model that polls is_cancelled() (tests/backends'
    test_python_cancellation's), on an actor: the client cancels its gRPC call while
    execute runs; the model sees it, the request ends cancelled, and the next is served."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from tests.backends.test_python_cancellation import CONFIG, WAITS

    folder = tmp_path / "waits_ray"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG.replace("[ 2 ]", "[ 1 ]"))
    (folder / "1" / "model.py").write_text(WAITS)
    source = next(s for s in scan_repository(tmp_path) if s.name == "waits_ray")
    # Asks no CPU: the module's other models may hold the whole test cluster by now.
    config = source.config.model_copy(update={"ray": RayModelOptions(num_cpus=0)})
    server.call(server.runtime.load(dataclasses.replace(source, config=config)), timeout=120)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert [
            w.isolation
            for w in server.runtime.executor.statistics().workers
            if w.model == "waits_ray"
        ] == ["ray"]
        answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        x = grpcclient.InferInput("X", [1, 1], "INT32")
        x.set_data_from_numpy(np.array([[51]], np.int32))
        call = client.async_infer(
            "waits_ray", [x], lambda result, error: answers.put((result, error))
        )
        wait_for((folder / "running-51").exists, "the batch to run on the actor", 60)
        call.cancel()
        wait_for((folder / "cancelled-51").exists, "the model to see is_cancelled()", 60)
        _, error = answers.get(timeout=60)
        assert isinstance(error, InferenceServerException)
        assert "CANCELLED" in str(error.status())
        x.set_data_from_numpy(np.array([[0]], np.int32))
        assert client.infer("waits_ray", [x]).as_numpy("Y").tolist() == [[0, 1, 0]]
    finally:
        client.close()
        server.call(server.runtime.unload("waits_ray", "1", drain=False), timeout=60)


def test_a_python_models_error_response_is_its_requests_answer_on_an_actor(
    server: RunningServer,
) -> None:
    """tests/fixtures/triton_python_answers/error_codes on an actor: the request the model
    answered with ``TritonError(..., INVALID_ARG)`` gets 400 and the model's message, as
    from a worker process; the next request is answered, and no worker failure counts."""
    folder = Path(__file__).parent.parent / "fixtures" / "triton_python_answers"
    source = next(s for s in scan_repository(folder) if s.name == "error_codes")
    config = source.config.model_copy(update={"ray": RayModelOptions(num_cpus=0)})
    server.call(server.runtime.load(dataclasses.replace(source, config=config)), timeout=120)
    try:
        assert [
            w.isolation
            for w in server.runtime.executor.statistics().workers
            if w.model == "error_codes"
        ] == ["ray"]
        url = f"{server.url}/v2/models/error_codes/infer"

        def ask(x: int) -> httpx.Response:
            body = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 1], "data": [x]}]}
            return httpx.post(url, json=body, timeout=60)

        refused = ask(-4)  # -1 - code: INVALID_ARG
        assert (refused.status_code, refused.json()["error"]) == (400, "no answer for -4")
        answered = ask(7)
        assert answered.status_code == 200 and answered.json()["outputs"][0]["data"] == [107]
        workers = server.runtime.executor.statistics().workers
        assert [w.failures for w in workers if w.model == "error_codes"] == [0]
    finally:
        server.call(server.runtime.unload("error_codes", "1", drain=False), timeout=60)


def test_a_python_models_is_ready_is_asked_on_its_actor(
    server: RunningServer, tmp_path: Path
) -> None:
    """A Triton Python model's ``is_ready()`` runs on its actor (a thread beside the
    batch's and the heartbeat's): False makes the model and the server not ready."""
    from tests.backends.test_python_is_ready import SYNC, _model

    _model(tmp_path, "gate", SYNC)
    source = next(s for s in scan_repository(tmp_path) if s.name == "gate")
    config = source.config.model_copy(update={"ray": RayModelOptions(num_cpus=0)})
    server.call(server.runtime.load(dataclasses.replace(source, config=config)), timeout=120)
    try:
        url = f"{server.url}/v2/models/gate/ready"
        assert httpx.get(url, timeout=30).status_code == 200
        (tmp_path / "gate" / "mode").write_text("not")
        answer = httpx.get(url, timeout=30)
        assert answer.status_code == 503
        assert "instance 0: is_ready() returned False" in answer.json()["error"]
        assert httpx.get(f"{server.url}/v2/health/ready", timeout=30).status_code == 503
        (tmp_path / "gate" / "mode").write_text("ready")
        assert httpx.get(url, timeout=30).status_code == 200
    finally:
        server.call(server.runtime.unload("gate", "1", drain=False), timeout=60)


def test_a_python_models_reshaped_tensors_on_an_actor(server: RunningServer) -> None:
    """tests/fixtures/triton_python_answers/reshaped on an actor (its ``reshape`` reaches
    the actor with the rest of the model's options): the client sends and reads GRID's
    ``dims`` [n, 2, 2], the model sees [n, 4]; TOTAL is [1] to the client, as on Triton."""
    folder = Path(__file__).parent.parent / "fixtures" / "triton_python_answers"
    source = next(s for s in scan_repository(folder) if s.name == "reshaped")
    config = source.config.model_copy(update={"ray": RayModelOptions(num_cpus=0)})
    server.call(server.runtime.load(dataclasses.replace(source, config=config)), timeout=120)
    try:
        grid = np.arange(12, dtype=np.float32)
        body = {
            "inputs": [
                {"name": "GRID", "datatype": "FP32", "shape": [1, 3, 2, 2], "data": grid.tolist()}
            ]
        }
        answer = httpx.post(f"{server.url}/v2/models/reshaped/infer", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        outputs = {o["name"]: o for o in answer.json()["outputs"]}
        assert outputs["TWICE"]["shape"] == [1, 3, 2, 2]
        assert outputs["TWICE"]["data"] == (2 * grid).tolist()
        assert (outputs["TOTAL"]["shape"], outputs["TOTAL"]["data"]) == ([1, 1], [66.0])
        assert outputs["SEEN"]["data"] == [1, 3, 4]
    finally:
        server.call(server.runtime.unload("reshaped", "1", drain=False), timeout=60)


def test_a_log_settings_change_reaches_every_actor(server: RunningServer) -> None:
    """/v2/logging reaches the Ray actors as it reaches worker processes: each logs by
    the new settings (asked of the actor itself)."""
    key = next(m.key for m in server.runtime.models() if m.key.name == "digits-classifier")
    executor = server.runtime.executor

    def actors_settings() -> list[dict[str, Any]]:
        found = []
        for index in range(2):
            instance = executor.instance(key, index)
            actor = getattr(instance, "_actor", None)
            assert actor is not None
            found.append(ray.get(actor.log.remote({}), timeout=30))
        return found

    try:
        assert httpx.post(server.url + "/v2/logging", json={"log_verbose_level": 1}).is_success
        assert [s["log_verbose_level"] for s in actors_settings()] == [1, 1]
        assert httpx.post(server.url + "/v2/logging", json={"log_info": False}).is_success
        assert [s["log_info"] for s in actors_settings()] == [False, False]
    finally:
        httpx.post(server.url + "/v2/logging", json={"log_verbose_level": 0, "log_info": True})
