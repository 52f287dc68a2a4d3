"""DLPack in a Python model: ``Tensor.to_dlpack()`` and ``Tensor.from_dlpack(name, …)``, the
way Triton's PyTorch examples hand tensors to torch and back without a copy
(``torch.utils.dlpack.from_dlpack(t.to_dlpack())``). numpy stands in for torch as the
other side here: both speak DLPack, and the tests must not need torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from sordino.backends.python import triton_python_backend_utils as pb_utils
from sordino.config import RuntimeConfig
from sordino.models.repository import scan_repository
from sordino.testing import serve_in_thread


def test_a_capsule_shares_the_tensors_memory_both_ways() -> None:
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    back = pb_utils.Tensor.from_dlpack("Y", pb_utils.Tensor("X", data).to_dlpack())
    assert np.shares_memory(back.as_numpy(), data)
    np.testing.assert_array_equal(back.as_numpy(), data)
    # a producer (an object with __dlpack__, as a torch tensor is) is taken as it is too
    strided = data[:, ::2]
    taken = pb_utils.Tensor.from_dlpack("Z", strided).as_numpy()
    assert np.shares_memory(taken, data)
    np.testing.assert_array_equal(taken, strided)


def test_a_read_only_array_exports_too() -> None:
    """numpy will not export a read-only array as a capsule ("Cannot export readonly
    array since signalling readonly is unsupported by DLPack"): Triton's capsule points at
    the tensor's memory whatever numpy's flags say, so ``to_dlpack`` of a tensor over
    ``np.frombuffer(bytes)`` raised BufferError in sordino and worked on Triton."""
    constant = np.frombuffer(np.array([1.5, -2.0, 3.25], np.float32).tobytes(), np.float32)
    assert not constant.flags.writeable
    back = pb_utils.Tensor.from_dlpack("C", pb_utils.Tensor("C", constant).to_dlpack())
    np.testing.assert_array_equal(back.as_numpy(), constant)
    broadcast = np.broadcast_to(np.float32(7), (2, 2))
    exported = pb_utils.Tensor.from_dlpack("B", pb_utils.Tensor("B", broadcast).to_dlpack())
    np.testing.assert_array_equal(exported.as_numpy(), np.full((2, 2), 7, np.float32))


def test_a_string_tensor_has_no_dlpack_form() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="string tensor has no DLPack"):
        pb_utils.Tensor("S", np.array([b"a"], dtype=np.object_)).to_dlpack()


MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

OFFSET = np.frombuffer(np.full(4, 10, np.float32).tobytes(), np.float32)  # read-only


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            y = pb_utils.Tensor.from_dlpack("Y", x.to_dlpack())
            shared = np.shares_memory(y.as_numpy(), x.as_numpy())
            offset = pb_utils.Tensor.from_dlpack("O", pb_utils.Tensor("O", OFFSET).to_dlpack())
            out = y.as_numpy() + offset.as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", out),
                pb_utils.Tensor("SHARED", np.full((out.shape[0], 1), shared)),
            ]))
        return responses
"""

CONFIG = """
name: "dlpack"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "SHARED" data_type: TYPE_BOOL dims: [ 1 ] }
]
"""


def test_a_model_round_trips_its_inputs_through_dlpack(tmp_path: Path) -> None:
    """In a worker: the input's capsule is over the request's own memory, and a
    read-only constant exports (the model failed every request with BufferError before)."""
    (tmp_path / "dlpack" / "1").mkdir(parents=True)
    (tmp_path / "dlpack" / "1" / "model.py").write_text(MODEL)
    (tmp_path / "dlpack" / "config.pbtxt").write_text(CONFIG)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    with serve_in_thread(RuntimeConfig(), scan_repository(tmp_path)) as server:
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        given = httpclient.InferInput("X", [2, 4], "FP32")
        given.set_data_from_numpy(x)
        answer = client.infer("dlpack", [given])
        np.testing.assert_array_equal(answer.as_numpy("Y"), x + 10)
        assert answer.as_numpy("SHARED").all()
        client.close()
