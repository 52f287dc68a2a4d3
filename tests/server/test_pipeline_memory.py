"""Pipelines in the arena: node to node by reference, intermediates freed after the last read."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from sordino.config import load_config
from sordino.control.client import ClientError, request_json
from sordino.execution.staging import Staging
from sordino.inference import ModelMetadata, TensorSpec
from sordino.memory.owner import ArenaOwner
from sordino.memory.refs import TensorsBuilder
from sordino.models.repository import builtin_sources
from sordino.server.pipelines import PipelineExecutor, pipeline_statistics
from sordino.testing import RunningServer, serve_in_thread
from tests.waiting import wait_for

ROWS = 64  # the built-in simple model's max batch: a tensor is 64 x 16 INT32, 4 KiB
TENSOR = ROWS * 16 * 4

THRICE = {
    "name": "thrice",
    "nodes": [
        {"name": "a", "model": "simple"},
        {"name": "b", "model": "simple", "inputs": {"INPUT0": "a.OUTPUT0", "INPUT1": "a.OUTPUT1"}},
        {"name": "c", "model": "simple", "inputs": {"INPUT0": "b.OUTPUT0", "INPUT1": "b.OUTPUT1"}},
    ],
}  # fmt: skip


def _infer(server: RunningServer, model: str, x0: np.ndarray, x1: np.ndarray) -> list[np.ndarray]:  # type: ignore[type-arg]
    body = {
        "inputs": [
            {"name": name, "shape": list(a.shape), "datatype": "INT32", "data": a.ravel().tolist()}
            for name, a in (("INPUT0", x0), ("INPUT1", x1))
        ]
    }
    answer = request_json("POST", f"{server.url}/v2/models/{model}/infer", body, timeout=30)
    outputs = {out["name"]: out["data"] for out in answer["outputs"]}
    return [np.array(outputs[n], np.int32).reshape(x0.shape) for n in ("OUTPUT0", "OUTPUT1")]


def _in_use(server: RunningServer) -> int:
    stats = server.runtime.executor.staging.owner.statistics()
    assert stats is not None
    return stats.in_use_bytes


def test_a_three_node_pipeline_passes_tensors_by_reference_and_frees_them() -> None:
    """Equal to the nodes by hand; no copy between nodes; the arena's in-use and peak
    bytes show each intermediate freed after its last reader."""
    config = load_config(None, {"pipelines": [THRICE]})
    rng = np.random.default_rng(5)
    x0 = rng.integers(-1000, 1000, (ROWS, 16), dtype=np.int32)
    x1 = rng.integers(-1000, 1000, (ROWS, 16), dtype=np.int32)
    sources = [s for s in builtin_sources() if s.name == "simple"]
    with serve_in_thread(config, sources) as server:
        by_hand = _infer(server, "simple", x0, x1)
        for _ in range(2):
            by_hand = _infer(server, "simple", *by_hand)
        baseline = _in_use(server)
        arena = server.runtime.executor.staging.arena
        peak_before = arena.statistics().peak_bytes
        piped = _infer(server, "thrice", x0, x1)
        assert [a.tolist() for a in piped] == [a.tolist() for a in by_hand]
        assert piped[0].tolist() == (2 * x0 + 2 * x1).tolist()
        wait_for(lambda: _in_use(server) == baseline, "the arena's in-use bytes to return")
        # Kept to the end, the three nodes' outputs would be six 4 KiB blocks at once;
        # freed after their last reader, never more than two nodes' outputs (four).
        peak = arena.statistics().peak_bytes
        assert peak_before < 5 * TENSOR, "the by-hand calls alone must stay below the bound"
        assert 4 * TENSOR <= peak < 5 * TENSOR
        [stats] = pipeline_statistics(server.runtime.pipelines)
        assert stats.pipeline == "thrice" and stats.batches == 1
        assert stats.handed_over == 4  # b's and c's two inputs each, as the blocks lay
        assert stats.recopied == 0 and stats.entered == 0
        assert stats.planned_peak_bytes < stats.naive_bytes
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
        line = 'sordino_pipeline_node_inputs_total{how="handed_over",pipeline="thrice"} 4.0'
        assert line in metrics


def test_a_batch_of_several_requests_enters_the_arena_once() -> None:
    """Two requests' inputs are written once, into one block, and read by reference after."""
    config = load_config(None, {"pipelines": [THRICE]})
    parts = [
        {"INPUT0": np.full((2, 16), 3, np.int32), "INPUT1": np.full((2, 16), 1, np.int32)},
        {"INPUT0": np.full((1, 16), 5, np.int32), "INPUT1": np.full((1, 16), 2, np.int32)},
    ]
    sources = [s for s in builtin_sources() if s.name == "simple"]
    with serve_in_thread(config, sources) as server:
        served = server.runtime.get("thrice")
        executor = served.scheduler.executor
        assert isinstance(executor, PipelineExecutor)
        baseline = _in_use(server)

        async def run() -> list[list[int]]:
            with await executor.run(served.key, parts) as outputs:
                return [outputs[n][:, 0].tolist() for n in ("OUTPUT0", "OUTPUT1")]

        assert server.call(run()) == [[8, 8, 14], [4, 4, 6]]  # 2(x0 + x1), 2(x0 - x1)
        stats = executor.statistics()
        assert stats.entered == 2  # INPUT0 and INPUT1, each as one block for both requests
        assert stats.handed_over == 6 and stats.recopied == 0
        wait_for(lambda: _in_use(server) == baseline, "the arena's in-use bytes to return")


def test_concurrent_pipeline_requests_share_node_batches_and_give_back_the_arena() -> None:
    """Many small requests at once: pipeline and node batches merge (intermediates of
    several pipeline batches in one node batch, parked on one lease); every answer is
    right and the arena returns to where it was."""
    config = load_config(None, {"pipelines": [THRICE]})
    sources = [s for s in builtin_sources() if s.name == "simple"]

    def client(server: RunningServer, seed: int) -> None:
        for k in range(8):
            x0 = np.full((4, 16), seed + k, np.int32)
            x1 = np.full((4, 16), k, np.int32)
            out0, out1 = _infer(server, "thrice", x0, x1)
            assert out0.tolist() == (2 * (x0 + x1)).tolist()
            assert out1.tolist() == (2 * (x0 - x1)).tolist()

    with serve_in_thread(config, sources) as server, ThreadPoolExecutor(12) as pool:
        baseline = _in_use(server)
        for future in [pool.submit(client, server, 100 * seed) for seed in range(12)]:
            future.result(timeout=120)
        wait_for(lambda: _in_use(server) == baseline, "the arena's in-use bytes to return")
        [stats] = pipeline_statistics(server.runtime.pipelines)
        # Every input of nodes b and c lay in the arena: each was handed over or re-copied
        # by a merged node batch (counted per node input, pipeline requests merged or not).
        assert stats.handed_over > 0


def test_a_failing_last_node_is_named_and_gives_back_the_intermediates() -> None:
    """Node c fails after a and b ran: the error names c; their blocks come back."""
    bad_c = {**THRICE["nodes"][2], "runtime": {"priority": 9}}  # type: ignore[dict-item]
    bad = {"name": "thrice", "nodes": [*THRICE["nodes"][:2], bad_c]}  # type: ignore[misc]
    config = load_config(None, {"pipelines": [bad]})
    sources = [s for s in builtin_sources() if s.name == "simple"]
    x = np.ones((ROWS, 16), np.int32)
    with serve_in_thread(config, sources) as server:
        _infer(server, "simple", x, x)  # the arena exists and holds nothing
        baseline = _in_use(server)
        with pytest.raises(ClientError, match=r"pipeline thrice, node c \(model simple\)"):
            _infer(server, "thrice", x, x)
        wait_for(lambda: _in_use(server) == baseline, "the arena's in-use bytes to return")
        served = server.runtime.get("simple").scheduler.statistics()
        assert served.succeeded == 3  # the call by hand, then nodes a and b


def test_unparking_one_of_several_parked_holders_of_a_lease() -> None:
    """Holders are found by identity (a Mapping's == would compare the arrays)."""
    staging = Staging(ArenaOwner(1 << 16))
    try:
        builder = TensorsBuilder(staging.arena)
        builder.put("x", np.arange(8, dtype=np.float32).reshape(2, 4))
        tensors = builder.finish()
        first, second = tensors.rows(0, 1), tensors.rows(1, 2)
        first.park()
        second.park()
        second.unpark()
        assert first.parked and not second.parked
        for each in (first, second, tensors):
            each.release()
        assert _arena_in_use(staging) == 0
    finally:
        staging.owner.close()


def _arena_in_use(staging: Staging) -> int:
    stats = staging.owner.statistics()
    assert stats is not None
    return stats.in_use_bytes


def _metadata() -> ModelMetadata:
    return ModelMetadata("m", "1", "test", (TensorSpec("x", "FP32", (-1, 4)),), (), batched=True)


async def test_staging_counts_arena_inputs_passed_by_reference_and_recopied() -> None:
    """One part already in the arena goes as it lies; joined with another, it is copied."""
    staging = Staging(ArenaOwner(1 << 16))
    try:
        builder = TensorsBuilder(staging.arena)
        builder.put("x", np.ones((2, 4), np.float32))
        placed = builder.finish()
        alone = await staging.stage([placed], _metadata(), in_arena=True)
        staging.release(alone)
        assert staging.arena_inputs["m", False] == 1 and staging.arena_inputs["m", True] == 0
        heap = {"x": np.zeros((1, 4), np.float32)}
        joined = await staging.stage([placed, heap], _metadata(), in_arena=True)
        staging.release(joined)
        assert staging.arena_inputs["m", True] == 1  # the heap part is no re-copy
        placed.release()
    finally:
        staging.owner.close()
