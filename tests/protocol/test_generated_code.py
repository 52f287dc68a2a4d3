"""The committed protobuf code is what tools/generate_grpc.py makes from the .proto."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None,
    reason="grpcio-tools is not installed (pip install -e '.[build-grpc]')",
)
def test_generated_code_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "generate_grpc.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_wire_names_match_the_protocol() -> None:
    from sordino.protocol.pb import kserve_v2_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert {m.name for m in service.methods} >= {
        "ModelInfer",
        "ModelStreamInfer",
        "RepositoryModelLoad",
    }
    fields = {f.name: f.number for f in pb.ModelInferRequest.DESCRIPTOR.fields}
    assert fields == {
        "model_name": 1,
        "model_version": 2,
        "id": 3,
        "parameters": 4,
        "inputs": 5,
        "outputs": 6,
        "raw_input_contents": 7,
    }
