"""Inputs marked ``optional: true`` in ``config.pbtxt``: a request may leave them out, as
on Triton, and the model finds no such tensor (the fixture is also in the parity bench)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sordino.config import RuntimeConfig
from sordino.errors import ModelLoadError
from sordino.models.repository import scan_repository
from sordino.testing import serve_in_thread

FIXTURE = Path(__file__).parent.parent / "fixtures" / "triton_python_answers" / "optional_input"


def _inputs(x: np.ndarray, bias: np.ndarray | None) -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput("X", list(x.shape), "FP32")]
    inputs[0].set_data_from_numpy(x)
    if bias is not None:
        inputs.append(httpclient.InferInput("BIAS", list(bias.shape), "FP32"))
        inputs[1].set_data_from_numpy(bias)
    return inputs


def test_a_request_may_leave_an_optional_input_out(tmp_path: Path) -> None:
    """Before, sordino refused it: "expects input 'BIAS' … but the request does not have it"."""
    shutil.copytree(FIXTURE, tmp_path / "optional_input")
    rng = np.random.default_rng(8)
    asked = [
        (rng.standard_normal((n, 4)).astype(np.float32), bias)
        for n in (1, 2, 3, 4, 1, 2)
        for bias in (None, rng.standard_normal((n, 4)).astype(np.float32))
    ]
    with serve_in_thread(RuntimeConfig(), scan_repository(tmp_path)) as server:
        client = httpclient.InferenceServerClient(
            server.url.removeprefix("http://"), concurrency=len(asked)
        )

        # All at once (tritonclient's HTTP client sends them together from one thread):
        # with and without BIAS, in one batch or not.
        pending = [client.async_infer("optional_input", _inputs(*pair)) for pair in asked]
        answers = [request.get_result().as_numpy("Y") for request in pending]
        for (x, bias), y in zip(asked, answers, strict=True):
            np.testing.assert_allclose(y, x + (bias if bias is not None else 100))
        with pytest.raises(InferenceServerException, match="expects input 'X'"):
            only_bias = httpclient.InferInput("BIAS", [1, 4], "FP32")
            only_bias.set_data_from_numpy(np.zeros((1, 4), np.float32))
            client.infer("optional_input", [only_bias])
        config = client.get_model_config("optional_input")
        assert [i.get("optional", False) for i in config["input"]] == [False, True]
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        over_grpc = grpc.get_model_config("optional_input", as_json=True)["config"]["input"]
        assert [i.get("optional", False) for i in over_grpc] == [False, True]
        grpc.close()
        client.close()


@pytest.mark.parametrize("field", ["allow_ragged_batch", "is_shape_tensor"])
def test_tensor_fields_sordino_does_not_do_are_refused(tmp_path: Path, field: str) -> None:
    """They were ignored before: a ragged batch was served as if dense."""
    shutil.copytree(FIXTURE, tmp_path / "optional_input")
    config = tmp_path / "optional_input" / "config.pbtxt"
    config.write_text(config.read_text().replace("optional: true", f"{field}: true"))
    with (
        pytest.raises(ModelLoadError, match=f"BIAS: {field} is not supported by sordino; remove"),
        serve_in_thread(RuntimeConfig(), scan_repository(tmp_path)),
    ):
        pass
