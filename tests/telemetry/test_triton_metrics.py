"""Triton's ``nv_inference_*`` metrics in ``/metrics``, named, labelled and counted as
Triton 2.51 counts them, so what was built to watch Triton watches sordino (they were
absent before; the parity bench compares the families with Triton's own)."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from sordino.config import RuntimeConfig
from sordino.models.repository import scan_repository
from sordino.telemetry.model_stats import triton_reason
from sordino.testing import serve_in_thread

FAULTY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
        if x[0, 0] == 1:
            raise ValueError("one is not welcome")
        if x[0, 0] == 3:
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("three is wrong"))]
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(
                r, "X").as_numpy() * 10)]) for r in requests
        ]  # fmt: skip
"""

CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""


def _samples(text: str, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    for metric in text_string_to_metric_families(text):
        if metric.name == family:
            return {tuple(sorted(s.labels.items())): s.value for s in metric.samples}
    raise AssertionError(f"no {family} in /metrics")


def test_requests_batches_failures_and_durations_are_counted(tmp_path: Path) -> None:
    folder = tmp_path / "faulty"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(FAULTY)
    (folder / "config.pbtxt").write_text(CONFIG)
    with serve_in_thread(RuntimeConfig(), scan_repository(tmp_path)) as server:
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        for value, rows in ((5, 1), (6, 2), (1, 1), (3, 1)):
            x = httpclient.InferInput("X", [rows, 1], "INT32")
            x.set_data_from_numpy(np.full((rows, 1), value, np.int32))
            try:
                client.infer("faulty", [x])
            except InferenceServerException:
                assert value in (1, 3)
        client.close()
        text = httpx.get(f"{server.url}/metrics").text
    at = (("model", "faulty"), ("version", "1"))
    # As Triton counts them: the model's error response is a success (the model ran);
    # the exception is the model's failure.
    assert _samples(text, "nv_inference_request_success")[at] == 3
    failures = _samples(text, "nv_inference_request_failure")
    assert {dict(k)["reason"]: v for k, v in failures.items()} == {
        "BACKEND": 1,
        "REJECTED": 0,
        "CANCELED": 0,
        "OTHER": 0,
    }
    assert _samples(text, "nv_inference_count")[at] == 4  # the rows of the batches that ran
    assert _samples(text, "nv_inference_exec_count")[at] == 3
    assert _samples(text, "nv_inference_request_duration_us")[at] > 0
    assert _samples(text, "nv_inference_compute_infer_duration_us")[at] > 0
    assert _samples(text, "nv_inference_pending_request_count")[at] == 0
    # Triton's names exactly: no "_total" on the cumulative figures.
    assert "nv_inference_count{" in text and "nv_inference_count_total" not in text
    assert _samples(text, "nv_pinned_memory_pool_total_bytes")[()] == 0


@pytest.mark.parametrize(
    ("outcome", "reason", "triton"),
    [
        ("failure", "queue_full", "REJECTED"),
        ("failure", "queue_timeout", "REJECTED"),
        ("failure", "shed", "REJECTED"),
        ("cancelled", "cancelled", "CANCELED"),
        ("failure", "inference_failed", "BACKEND"),
        ("failure", "model_rejected", "SUCCESS"),
        ("failure", "model_response_error", "SUCCESS"),
        ("success", "", "SUCCESS"),
        ("failure", "deadline_exceeded", "OTHER"),
    ],
)
def test_sordinos_reasons_fold_into_tritons(outcome: str, reason: str, triton: str) -> None:
    assert triton_reason(outcome, reason) == triton


def test_the_families_follow_the_loaded_models(tmp_path: Path) -> None:
    """Only loaded versions are labelled: the label set stays bounded."""
    shutil.copytree(
        Path(__file__).parent.parent / "fixtures" / "triton_python_examples" / "add_sub",
        tmp_path / "add_sub",
    )
    with serve_in_thread(RuntimeConfig(), scan_repository(tmp_path)) as server:
        text = httpx.get(f"{server.url}/metrics").text
    models = {dict(k)["model"] for k in _samples(text, "nv_inference_request_success")}
    assert models == {"add_sub"}
