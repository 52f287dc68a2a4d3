"""``triton_python_backend_utils``' type helpers, as Triton 2.51's answer (the parity
bench's ``utilities`` fixture compares them with Triton's own), the request release
flags and ``get_model_dir()``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from sordino.backends.python import bls
from sordino.backends.python import triton_python_backend_utils as pb_utils
from sordino.backends.python.decoupled import rescheduled
from sordino.backends.python.model_dir import set_model_dir
from sordino.config import load_config
from sordino.models.repository import load_repository_model
from sordino.testing import serve_in_thread

UTILITIES = Path(__file__).parent.parent / "fixtures" / "triton_python_answers" / "utilities"


def test_bytes_tensors_round_trip_through_triton_s_serialization() -> None:
    words = np.array([[b"ab", "c"], [b"", "\u00e9"]], dtype=np.object_)
    encoded = pb_utils.serialize_byte_tensor(words)
    assert encoded == b"\x02\x00\x00\x00ab\x01\x00\x00\x00c\x00\x00\x00\x00\x02\x00\x00\x00\xc3\xa9"
    decoded = pb_utils.deserialize_bytes_tensor(encoded)
    assert decoded.dtype == np.object_
    assert list(decoded) == [b"ab", b"c", b"", "\u00e9".encode()]
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=np.object_)) == ()
    assert pb_utils.serialize_byte_tensor(np.zeros(2, dtype=np.float32)) is None
    with pytest.raises(ValueError, match="runs past the end"):
        pb_utils.deserialize_bytes_tensor(b"\x05\x00\x00\x00ab")


def test_type_codes_are_triton_s() -> None:
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.complex64) is None
    assert pb_utils.triton_to_numpy_type(8) is np.int32
    assert pb_utils.triton_to_numpy_type(0) is None
    assert pb_utils.Tensor("x", np.ones(2, dtype=np.int64)).triton_dtype() == 9
    assert pb_utils.triton_string_to_numpy("TYPE_FP16") is np.float16
    with pytest.raises(KeyError, match="TYPE_NOPE"):
        pb_utils.triton_string_to_numpy("TYPE_NOPE")
    assert set(pb_utils.TRITON_STRING_TO_NUMPY) >= {"TYPE_BOOL", "TYPE_STRING"}


def test_a_request_is_released_or_rescheduled_as_the_model_last_said() -> None:
    requests = [
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
        for _ in range(3)
    ]
    requests[0].set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL)
    requests[1].set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    requests[2].set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
    requests[2].set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL)
    assert rescheduled(requests) == [1]


def test_a_model_in_a_worker_reads_its_folder_and_the_helpers(tmp_path: Path) -> None:
    shutil.copytree(UTILITIES, tmp_path / "utilities")
    config = load_config(None, {"model_repository": str(tmp_path)})
    with serve_in_thread(config, load_repository_model(tmp_path, "utilities")) as server:
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        tensor = httpclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.ones(1, dtype=np.float32))
        answer = json.loads(client.infer("utilities", [tensor]).as_numpy("RESULT")[0])
    assert answer["model_dir"] == str(tmp_path / "utilities" / "1")
    assert answer["numpy_to_triton_type"] == [1, 2, 8, 10, 11, 13]
    assert answer["unknown_string"] == "raises KeyError"


def test_get_model_dir_names_the_asking_model_among_several(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sordino.backends.python import model_dir

    monkeypatch.setattr(model_dir, "_DIRS", {})
    set_model_dir("a", "/models/a/1")
    assert pb_utils.get_model_dir() == "/models/a/1"  # the only one
    set_model_dir("b", "/models/b/1")
    with bls.executing(bls.Executing("b", phase="initialize")):
        assert pb_utils.get_model_dir() == "/models/b/1"
    with pytest.raises(pb_utils.TritonModelException, match="cannot tell which asks"):
        pb_utils.get_model_dir()
