"""Model files sordino cannot serve (an Ascend ``.om``, a PyTorch checkpoint, …) end
``sordino start`` in one line naming what the file is and what to use instead."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sordino.config import ModelConfig
from sordino.errors import ModelLoadError
from sordino.models.repository import scan_repository, sources_for

# An ATC-built offline model is a binary blob that is no ONNX protobuf.
OM_BYTES = b"IMOD" + bytes(60) + b"\x00\x01ascend-offline-model"


def test_start_with_an_om_file_says_what_it_is(tmp_path: Path) -> None:
    om = tmp_path / "sd3_deploy.om"
    om.write_bytes(OM_BYTES)
    result = subprocess.run(
        [sys.executable, "-m", "sordino", "start", "--model", str(om), "--http-port", "0",
         "--grpc-port", "0", "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "protobuf" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "Ascend offline model" in line and "CANN" in line
    assert "export the source model to ONNX" in line


def test_a_repository_version_holding_an_om_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "sd3" / "1").mkdir(parents=True)
    (tmp_path / "sd3" / "1" / "sd3_deploy.om").write_bytes(OM_BYTES)
    with pytest.raises(ModelLoadError, match=r"Ascend offline model .* export the source model"):
        scan_repository(tmp_path)


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("model.pt", "PyTorch checkpoint"),
        ("model.PTH", "PyTorch checkpoint"),
        ("unet.safetensors", "safetensors weights"),
        ("model.engine", "TensorRT engine"),
        ("model.plan", "TensorRT engine"),
    ],
)
def test_other_non_onnx_files_get_a_pointer(tmp_path: Path, name: str, needle: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"PK\x03\x04 not onnx")
    with pytest.raises(ModelLoadError, match=needle) as caught:
        sources_for(ModelConfig(name="m", path=path))
    assert "\n" not in str(caught.value) and "ONNX" in str(caught.value)
