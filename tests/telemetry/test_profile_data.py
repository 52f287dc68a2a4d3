"""Operator profiles: ONNX Runtime traces parsed, and the profile endpoint end to end."""

from __future__ import annotations

import httpx

from sordino.execution.profiling import SYNTHETIC_BATCHES
from sordino.telemetry.profile_data import OperatorProfile, parse_ort_profile
from sordino.testing import RunningServer

TRACE = [
    {"cat": "Session", "name": "model_run", "dur": 500},
    {"cat": "Node", "name": "gemm_0_kernel_time", "dur": 300,
     "args": {"op_name": "Gemm", "provider": "CPUExecutionProvider"}},
    {"cat": "Node", "name": "gemm_1_kernel_time", "dur": 100,
     "args": {"op_name": "Gemm", "provider": "CPUExecutionProvider"}},
    {"cat": "Node", "name": "relu_kernel_time", "dur": 100,
     "args": {"op_name": "Relu", "provider": "CPUExecutionProvider"}},
    {"cat": "Node", "name": "relu_fence_before", "dur": 1, "args": {"op_name": "Relu"}},
]  # fmt: skip


def test_node_events_are_summed_by_operator_type() -> None:
    profile = parse_ort_profile(
        [TRACE, TRACE], model="m", version="1", started_at=0, seconds=1, batches=2,
        synthetic=False,
    )  # fmt: skip
    assert [(o.op, o.calls) for o in profile.operators] == [("Gemm", 4), ("Relu", 2)]
    assert profile.operators[0].total_ms == 0.8 and profile.operators[0].share == 0.8
    assert profile.total_ms == 1.0
    assert profile.nodes[0].op == "gemm_0"
    assert profile.kernel_launches is None  # CPU: the provider reports none
    assert OperatorProfile.from_json(profile.to_json()) == profile


def test_gpu_kernel_events_count_as_launches() -> None:
    trace = [*TRACE, {"cat": "Kernel", "name": "volta_sgemm", "dur": 20}]
    profile = parse_ort_profile(
        [trace], model="m", version="1", started_at=0, seconds=1, batches=1, synthetic=False
    )
    assert profile.kernel_launches == 1


def test_profile_endpoint_profiles_a_served_model(server: RunningServer) -> None:
    """The models run in worker processes (the default isolation)."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        response = client.post(
            "/v2/sordino/profile", json={"model": "digits-classifier", "seconds": 0.3}
        )
        assert response.status_code == 200, response.text
        profile = OperatorProfile.from_json(response.json())
        assert profile.model == "digits-classifier" and profile.batches > 0
        assert profile.operators and abs(sum(o.share for o in profile.operators) - 1) < 1e-6
        metrics = client.get("/metrics").text
        assert 'sordino_operator_seconds{model="digits-classifier"' in metrics
        assert any(e.kind == "operator_profile" for e in server.runtime.events.recent())
        bad = client.post("/v2/sordino/profile", json={"model": "nope"})
        assert bad.status_code == 404 and "unknown model" in bad.json()["error"]


def test_profile_endpoint_profiles_a_thread_isolated_model(thread_server: RunningServer) -> None:
    """A model on a server thread is profiled by swapping its backend's session."""
    with httpx.Client(base_url=thread_server.url, timeout=30) as client:
        response = client.post(
            "/v2/sordino/profile", json={"model": "digits-classifier", "seconds": 0.2}
        )
    assert response.status_code == 200, response.text
    profile = OperatorProfile.from_json(response.json())
    assert profile.synthetic and profile.batches == SYNTHETIC_BATCHES
    assert "Gemm" in {op.op for op in profile.operators}
    backends = thread_server.thread_backends("digits-classifier")
    assert backends and not any(b.profiling for b in backends)  # type: ignore[attr-defined]
