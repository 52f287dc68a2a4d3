"""A batch whose outputs are larger than the shared-memory arena fails alone; the worker
serves on.

The worker asks the server for room for outputs its reserved space does not hold
(``Alloc``). When the arena cannot hold them the server used to kill the worker (it
was left waiting for an answer): one request with a large output cost the model's
instance a restart — the model unready meanwhile, the restart's backoff growing with
each such request. The server now answers ``Allocated`` with ``refused``, and the
worker fails that batch with the reason.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.cli.conftest import sordino_start

_CONFIG = """
name: "sized"
backend: "python"
max_batch_size: 0
input [ { name: "N", data_type: TYPE_INT64, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""
_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        sizes = [int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy()[0]) for r in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.ones(n, np.float32))])
                for n in sizes]
"""


def _infer(client: httpx.Client, n: int) -> httpx.Response:
    body = {
        "inputs": [{"name": "N", "shape": [1], "datatype": "INT64", "data": [n]}],
        "outputs": [{"name": "OUT", "parameters": {"binary_data": True}}],
    }
    return client.post("/v2/models/sized/infer", json=body, timeout=60)


def test_outputs_larger_than_the_arena_fail_their_batch_not_the_worker(tmp_path: Path) -> None:
    (tmp_path / "repo" / "sized" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "sized" / "config.pbtxt").write_text(_CONFIG)
    (tmp_path / "repo" / "sized" / "1" / "model.py").write_text(_MODEL)
    args = ["--no-builtin", "--model-repository", str(tmp_path / "repo"), "--pool-size", "64MB"]
    with sordino_start(args, tmp_path) as running, httpx.Client(base_url=running.url) as client:
        assert _infer(client, 1000).status_code == 200
        too_large = _infer(client, 20_000_000)  # 80 MB of outputs
        assert too_large.status_code == 500
        message = too_large.json()["error"]
        assert "cannot place outputs" in message and "cannot fit" in message, message
        # The same worker answers the next request at once: no restart, still ready.
        assert client.get("/v2/health/ready").status_code == 200
        assert _infer(client, 1000).status_code == 200
        metrics = client.get("/metrics").text
        counter = "sordino_worker_restarts_total{"
        restarts = [m for m in metrics.splitlines() if m.startswith(counter) and "sized" in m]
        assert restarts and all(line.endswith(" 0.0") for line in restarts), restarts
