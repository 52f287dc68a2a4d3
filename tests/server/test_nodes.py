"""Node runtime policy (the brief's ModelBox block): each key acts on the node's model.

Real servers with real worker processes: a node's ``scheduler`` decides how its model
batches, ``memory_pool`` bounds the arena bytes its requests hold (a request over it
is refused naming the node and the pool, another node is not touched), ``priority``
is the level of its requests that name none, and ``self_healing`` scopes the
guardian's triggers to it (``true``) or keeps the guardian off it (``false``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from sordino.cli.memory import describe_status
from sordino.config import load_config
from sordino.errors import ConfigError, ModelLoadError, RateLimited
from sordino.memory.quotas import QuotaLedger
from sordino.models.repository import builtin_sources, sources_for
from sordino.testing import RunningServer, serve_in_thread
from tests.execution.load import events
from tests.metrics import counter_sum
from tests.waiting import wait_for

BRIEF_BLOCK = """\
nodes:
  - name: "image_generator"
    runtime:
      scheduler: "dynamic_batching"
      memory_pool: "2GB"
      priority: "high"
      self_healing: true
"""

PIPELINE = {
    "name": "twice",
    "nodes": [
        {"name": "first", "model": "simple"},
        {
            "name": "second",
            "model": "simple",
            "inputs": {"INPUT0": "first.OUTPUT0", "INPUT1": "first.OUTPUT1"},
        },
    ],
}


def _sources(*names: str) -> list:  # type: ignore[type-arg]
    return [s for s in builtin_sources() if s.name in names]


def _simple(rows: int) -> dict[str, object]:
    data = list(range(rows * 16))
    return {
        "inputs": [
            {"name": name, "shape": [rows, 16], "datatype": "INT32", "data": data}
            for name in ("INPUT0", "INPUT1")
        ]
    }


def _digits(rows: int) -> dict[str, object]:
    pixels = np.zeros((rows, 64), np.float32).ravel().tolist()
    return {"inputs": [{"name": "pixels", "shape": [rows, 64], "datatype": "FP32", "data": pixels}]}


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    """Batching off server-wide; node ``adder`` (model simple) batches dynamically with
    a 4 KiB pool at high priority, node ``reader`` (digits-classifier) runs
    ultra_low_latency with a 1 MiB pool; text-normalizer has no node."""
    config = load_config(
        None,
        {
            "scheduler": {"strategies": [{"name": "dynamic_batching", "enabled": False}]},
            "nodes": [
                {
                    "name": "adder",
                    "model": "simple",
                    "runtime": {
                        "scheduler": "dynamic_batching",
                        "memory_pool": "4KB",
                        "priority": "high",
                    },
                },
                {
                    "name": "reader",
                    "model": "digits-classifier",
                    "runtime": {"scheduler": "ultra_low_latency", "memory_pool": "1MB"},
                },
            ],
            "pipelines": [PIPELINE],
        },
    )
    with serve_in_thread(config, _sources("simple", "digits-classifier", "text-normalizer")) as s:
        yield s


def test_the_scheduler_of_a_node_is_its_models(server: RunningServer) -> None:
    """dynamic_batching batches the node's model although batching is off server-wide;
    a mode name is the model's mode; a model without a node keeps the server's."""
    adder = server.runtime.get("simple").scheduling
    reader = server.runtime.get("digits-classifier").scheduling
    plain = server.runtime.get("text-normalizer").scheduling
    assert adder.policy.max_batch > 1 and adder.policy.max_delay_s > 0
    assert plain.policy.max_batch == 1
    assert reader.mode == "ultra_low_latency" and plain.mode == "adaptive"


def test_a_request_over_its_nodes_pool_is_refused_and_the_other_node_serves(
    server: RunningServer,
) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        fits = client.post("/v2/models/simple/infer", json=_simple(16))  # 4096 bytes staged
        over = client.post("/v2/models/simple/infer", json=_simple(17))  # 4352 bytes
        other = client.post("/v2/models/digits-classifier/infer", json=_digits(17))
        piped = client.post("/v2/models/twice/infer", json=_simple(17))
    assert fits.status_code == 200, fits.text
    assert over.status_code == 400
    error = over.json()["error"]
    assert "node 'adder' (model 'simple')" in error
    assert "(4096 bytes, the node's memory_pool)" in error
    assert other.status_code == 200, other.text
    # A pipeline's node is charged to its model's pool too, and the error names the node.
    assert piped.status_code == 400
    assert piped.json()["error"].startswith("pipeline twice, node first (model simple): ")
    pools = {p.owner: p for p in server.runtime.memory.statistics().pools}
    assert set(pools) == {"simple", "digits-classifier"}
    assert pools["simple"].quota_bytes == 4096 and pools["simple"].peak_bytes == 4096
    assert pools["simple"].rejections >= 2 and pools["simple"].in_use_bytes == 0
    assert pools["digits-classifier"].rejections == 0
    refused = counter_sum(
        server,
        "sordino_memory_model_pool_rejections",
        lambda labels: labels["model"] == "simple",
    )
    assert refused == pools["simple"].rejections
    lines = describe_status(dataclasses.asdict(server.runtime.memory.statistics()))
    assert any(line.startswith("node pool of model simple: 0.0 MiB in flight") for line in lines)


def test_a_nodes_requests_get_its_priority_unless_they_name_one(server: RunningServer) -> None:
    def served(model: str, level: str) -> int:
        return counter_sum(
            server,
            "sordino_tenant_requests",
            lambda labels: labels["model"] == model and labels["priority"] == level,
        )

    with httpx.Client(base_url=server.url, timeout=30) as client:
        before = served("simple", "1"), served("simple", "3"), served("text-normalizer", "2")
        text = {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["A"]}]}
        assert client.post("/v2/models/simple/infer", json=_simple(1)).status_code == 200
        low = {**_simple(1), "parameters": {"priority": "low"}}
        assert client.post("/v2/models/simple/infer", json=low).status_code == 200
        answer = client.post("/v2/models/text-normalizer/infer", json=text)
        assert answer.status_code == 200, answer.text
    after = served("simple", "1"), served("simple", "3"), served("text-normalizer", "2")
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 1]


def test_self_healing_true_scopes_the_triggers_and_false_keeps_the_guardian_off() -> None:
    """A trigger over every model: node ``watched`` (simple, true) gets its own copy,
    which acts on it; node ``alone`` (digits-classifier, false) carries three times the
    traffic yet no trigger counts it and no action names it."""
    config = load_config(
        None,
        {
            "self_healing": {
                "interval": 0.2,
                "triggers": [
                    {"metric": "qps", "threshold": "> 1", "window": "2s", "action": "alert"},
                    {"metric": "memory_fragmentation", "threshold": "90%", "action": "alert"},
                ],
            },
            "nodes": [
                {"name": "watched", "model": "simple", "runtime": {"self_healing": True}},
                {"name": "alone", "model": "digits-classifier", "runtime": {"self_healing": False}},
            ],
        },
    )
    # The arena's fragmentation is no model's: it is not copied for the node.
    assert [t.name for t in config.guardian.triggers] == [
        "qps > 1",
        "memory_fragmentation 90%",
        "qps of simple > 1",
    ]
    with serve_in_thread(config, _sources("simple", "digits-classifier")) as server:
        stop = threading.Event()

        def send(path: str, body: dict[str, object], every_s: float) -> None:
            with httpx.Client(base_url=server.url, timeout=30) as client:
                while not stop.is_set():
                    assert client.post(path, json=body).status_code == 200
                    time.sleep(every_s)

        senders = [
            threading.Thread(target=send, args=("/v2/models/simple/infer", _simple(1), 0.15)),
            threading.Thread(
                target=send, args=("/v2/models/digits-classifier/infer", _digits(1), 0.05)
            ),
        ]
        for sender in senders:
            sender.start()
        try:

            def acted() -> list[dict[str, object]]:
                return [e.payload for e in events(server, "guardian")]

            wait_for(
                lambda: any(r["trigger"] == "qps of simple > 1" for r in acted()),
                "the node's own trigger to act",
                timeout=60,
            )
        finally:
            stop.set()
            for sender in senders:
                sender.join()
        records = acted()
        assert records and all(r["model"] in (None, "simple") for r in records), records
        statistics = server.runtime.guardian.statistics()  # type: ignore[union-attr]
        assert {t.name: t.model for t in statistics.triggers} == {
            "qps > 1": None,
            "memory_fragmentation 90%": None,
            "qps of simple > 1": "simple",
        }


def test_the_briefs_block_as_written_serves_its_node(tmp_path: Path) -> None:
    """The brief's block, verbatim, under a model of that name (the built-in digits
    classifier) and an arena that holds the 2 GB pool."""
    classifier = next(s for s in builtin_sources() if s.name == "digits-classifier")
    path = tmp_path / "sordino.yaml"
    path.write_text(
        "models:\n"
        f"  - {{name: image_generator, path: {classifier.path}}}\n"
        "memory:\n"
        "  pool_size: 2GB\n" + BRIEF_BLOCK,
        encoding="utf-8",
    )
    config = load_config(path)
    sources = [source for model in config.models for source in sources_for(model)]
    with serve_in_thread(config, sources) as server:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            answer = client.post("/v2/models/image_generator/infer", json=_digits(2))
        assert answer.status_code == 200, answer.text
        model = server.runtime.get("image_generator")
        assert model.scheduling.policy.max_batch > 1
        assert model.scheduling.queue.default_priority == 1
        (pool,) = server.runtime.memory.statistics().pools
        assert (pool.owner, pool.quota_bytes) == ("image_generator", 2**31)
        assert pool.peak_bytes > 0 and pool.in_use_bytes == 0
        guardian = server.runtime.guardian
        assert guardian is not None  # the node's self_healing turned it on
        (trigger,) = guardian.statistics().triggers
        assert trigger.name == "error_rate of image_generator 5%"
        assert trigger.actions == ("restart_worker",)
        served = counter_sum(
            server,
            "sordino_tenant_requests",
            lambda labels: labels["model"] == "image_generator" and labels["priority"] == "1",
        )
        assert served == 1


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (
            {"nodes.0.runtime.scheduler": "fastest"},
            "nodes.0.runtime.scheduler: unknown node scheduler 'fastest'; use one of: "
            "dynamic_batching, auto, manual, hybrid, adaptive, conservative, ultra_low_latency",
        ),
        (
            {},
            "nodes: the nodes' memory pools add up to 2 GiB (image_generator 2 GiB), more than "
            "the arena's 256 MiB (workers.shared_memory; memory.pool_size unset)",
        ),
        (
            {"memory.pool_size": "1GB"},
            "more than the arena's 1 GiB (memory.pool_size)",
        ),
        (
            {"memory.pool_size": "2GB", "memory.enabled": False},
            "memory.enabled is false",
        ),
        (
            {
                "memory.pool_size": "2GB",
                "pipelines": [
                    {
                        "name": "p",
                        "nodes": [
                            {
                                "name": "step",
                                "model": "image_generator",
                                "runtime": {"scheduler": "manual"},
                            }
                        ],
                    }
                ],
            },
            "pipeline p, node 'step' and node 'image_generator' both run model "
            "'image_generator' with different scheduler ('manual' and 'dynamic_batching')",
        ),
        (
            {
                "memory.pool_size": "2GB",
                "nodes.0.runtime.self_healing": False,
                "self_healing.triggers": [
                    {"metric": "qps", "threshold": "> 1", "model": "image_generator",
                     "action": "alert"}
                ],
            },
            "node 'image_generator' says self_healing: false for it",
        ),
    ],
)  # fmt: skip
def test_contradictions_are_refused_when_the_configuration_is_read(
    tmp_path: Path, overrides: dict[str, object], needle: str
) -> None:
    path = tmp_path / "sordino.yaml"
    path.write_text(BRIEF_BLOCK, encoding="utf-8")
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config(path, overrides)


def test_a_top_level_node_without_its_model_fails_start_up() -> None:
    config = load_config(None, {"nodes": [{"name": "image_generator"}]})
    needle = "node image_generator: no model 'image_generator' is loaded"
    with (
        pytest.raises(ModelLoadError, match=re.escape(needle)),
        serve_in_thread(config, _sources("simple")),
    ):
        pass


def test_a_full_pool_makes_its_nodes_request_wait_then_429_and_no_other_node_waits() -> None:
    """The pool is the node's: a request that would go over waits for room (here none
    comes: 429 naming the node), while another model's request is charged at once."""
    names = {"simple": "adder"}
    pools = QuotaLedger(
        {"simple": 4096},
        wait_s=0.05,
        name=lambda model: f"node {names[model]!r} (model {model!r})",
        setting="the node's memory_pool",
    )

    async def run() -> None:
        held = await pools.acquire("simple", 4000)
        assert await pools.acquire("digits-classifier", 10**9) == "other"  # no pool: no limit
        with pytest.raises(RateLimited, match=re.escape("node 'adder' (model 'simple') has 4000")):
            await pools.acquire("simple", 200)
        pools.release(held, 4000)
        assert await pools.acquire("simple", 200) == "simple"

    asyncio.run(run())
