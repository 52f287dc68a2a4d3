"""ONNX Runtime's arenas inside the workers: configured per model, reported per worker.

A real worker process runs the digits model with a CPU arena of its own
(kSameAsRequested) and shrinkage after large batches; its answers stay those of an
unbatched ONNX Runtime session, and status and /metrics show its resident memory,
the arena's settings and "absent" for the GPU on a machine without CUDA.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.config import ModelConfig, RuntimeConfig
from sordino.models.repository import builtin_sources, sources_for
from sordino.testing import RunningServer, serve_in_thread
from tests.conftest import digits_pixels


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    digits = next(s for s in builtin_sources() if s.name == "digits-classifier")
    config = ModelConfig(
        name="digits",
        path=digits.path,
        max_batch_size=32,
        framework_memory={
            "arena_extend_strategy": "kSameAsRequested",
            "arena_max": "256MB",
            "shrink_after_rows": 8,
        },
    )
    with serve_in_thread(RuntimeConfig(), sources_for(config)) as running:
        yield running


def test_configured_arena_serves_exact_answers_and_is_reported(
    server: RunningServer, reference: dict[str, Any]
) -> None:
    session = reference["digits-classifier"]
    for rows in (1, 16):  # 16 rows: the arena is shrunk after the batch
        pixels = digits_pixels(rows, seed=rows)
        body = {"inputs": [{"name": "pixels", "shape": [rows, 64], "datatype": "FP32",
                            "data": pixels.ravel().tolist()}]}  # fmt: skip
        r = httpx.post(f"{server.url}/v2/models/digits/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text
        out = next(o for o in r.json()["outputs"] if o["name"] == "probabilities")
        expected = session.run(None, {session.get_inputs()[0].name: pixels})[0]
        np.testing.assert_allclose(
            np.asarray(out["data"], np.float32).reshape(rows, -1), expected, rtol=1e-5, atol=1e-6
        )
    workers = server.runtime.memory.statistics().workers
    assert len(workers) == 1
    worker = workers[0]
    assert worker.model == "digits" and worker.pid is not None
    assert worker.rss_bytes is not None and worker.rss_bytes > 10 * 2**20  # a real process
    assert "kSameAsRequested" in worker.cpu_arena and "8+ rows" in worker.cpu_arena
    assert worker.gpu == "absent" and worker.gpu_bytes is None  # no CUDA provider here
    result = CliRunner().invoke(cli, ["memory", "status", "--url", server.url])
    assert result.exit_code == 0, result.output
    assert "worker digits:1#0" in result.output and "MiB resident" in result.output
    assert "GPU absent" in result.output
    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    assert 'sordino_memory_worker_rss_bytes{instance="0",model="digits",version="1"}' in metrics
    assert 'sordino_memory_worker_gpu_present{instance="0",model="digits",version="1"} 0.0' in (
        metrics
    )
    assert "sordino_memory_worker_gpu_bytes{" not in metrics  # no figure without CUDA
