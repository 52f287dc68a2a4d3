"""A Triton Python model whose responses are not rows of one batch: outputs of variable
length, of another datatype from one request to the next, or with more rows than the
request sent. Triton answers each request with its response's tensors as they are.

Before, sordino failed such a batch ("… tensors cannot be joined into a batch") and ran
its requests again one at a time (the model ran twice, the failure counted), joined
mixed datatypes into the wider one (an FP32 answer came back FP64), and cut an output
with more rows than its request into the other requests' answers; a string output
holding other objects (Triton sends their str()) ended the worker process.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from sordino.backends.python import triton_python_backend_utils as pb_utils
from sordino.backends.python.joining import PythonModelError, response_parts
from sordino.config import RuntimeConfig
from sordino.inference import ModelMetadata, TensorSpec
from sordino.models.repository import scan_repository
from sordino.testing import serve_in_thread

FIXTURE = Path(__file__).parent.parent / "fixtures" / "triton_python_answers" / "own_outputs"

ASKED = list(zip(range(1, 9), [0, 1] * 4, [0, 2] * 4, strict=True))
"""Eight requests of one row each: SEQ lengths 1–8, VAL FP32 and INT64 in turn, ROWS
of 1 and 3 rows in turn."""


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_each_request_gets_its_responses_tensors_in_one_batch(
    tmp_path: Path, isolation: str
) -> None:
    shutil.copytree(FIXTURE, tmp_path / "own_outputs")
    sources = [
        dataclasses.replace(s, config=s.config.model_copy(update={"isolation": isolation}))
        for s in scan_repository(tmp_path)
    ]
    # manual: the batch waits for its preferred 8 rows, as Triton's dynamic batcher does
    config = RuntimeConfig.model_validate({"scheduler": {"mode": "manual"}})
    with serve_in_thread(config, sources) as server:
        client = httpclient.InferenceServerClient(
            server.url.removeprefix("http://"), concurrency=len(ASKED)
        )
        pending = []
        for asked in ASKED:  # all at once: the model's execute gets the eight together
            x = httpclient.InferInput("X", [1, 3], "FP32")
            x.set_data_from_numpy(np.array([asked], np.float32))
            pending.append(client.async_infer("own_outputs", [x]))
        results = [request.get_result() for request in pending]
        for (length, kind, extra), result in zip(ASKED, results, strict=True):
            assert result.as_numpy("BATCH").tolist() == [[8]]  # one batch, not run again
            assert result.as_numpy("SEQ").tolist() == [list(range(length))]
            value = result.as_numpy("VAL")
            assert value.dtype == (np.float32 if kind == 0 else np.int64)
            assert value.tolist() == [[length]]
            assert result.get_output("VAL")["datatype"] == ("FP32" if kind == 0 else "INT64")
            assert result.as_numpy("ROWS").tolist() == [[extra]] * (extra + 1)
            assert result.as_numpy("NOTE").tolist() == [[str(length).encode(), b"None"]]
            # In the order the model declares them, as when they are joined.
            names = [output["name"] for output in result.get_response()["outputs"]]
            assert names == ["SEQ", "VAL", "ROWS", "NOTE", "BATCH"]
        stats = client.get_inference_statistics("own_outputs")["model_stats"][0]
        assert stats["execution_count"] == 1 and stats["inference_stats"]["fail"]["count"] == 0
        client.close()

        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        x = grpcclient.InferInput("X", [1, 3], "FP32")
        x.set_data_from_numpy(np.array([[3, 1, 2]], np.float32))
        alone = grpc.infer("own_outputs", [x])
        assert alone.as_numpy("SEQ").tolist() == [[0, 1, 2]]
        assert alone.as_numpy("VAL").dtype == np.int64
        assert alone.as_numpy("ROWS").shape == (3, 1)
        grpc.close()


def test_a_string_tensor_of_other_objects_holds_their_text() -> None:
    """As Triton's ``Tensor`` serializes them when it is made: each element's str()."""
    made = pb_utils.Tensor("T", np.array([[b"a", "b", 1.5, None]], dtype=object)).as_numpy()
    assert made.tolist() == [[b"a", "b", "1.5", "None"]] and made.shape == (1, 4)


def test_a_response_that_is_not_one_is_named_as_triton_names_it() -> None:
    """It read "execute raised AttributeError("'str' object has no attribute
    'has_error'")" before, though execute raised nothing."""
    metadata = ModelMetadata("m", "1", "python", (), (TensorSpec("Y", "FP32", (-1,)),), True)
    with pytest.raises(PythonModelError, match="Expected an 'InferenceResponse' object in"):
        response_parts(["no"], 1, metadata, [], {})
