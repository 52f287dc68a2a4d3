"""A Python model whose code raises what is not an ``Exception`` — ``KeyboardInterrupt``,
``SystemExit`` (``sys.exit()``), ``GeneratorExit`` — fails the call, as any other error:
Triton's stub answers each as the requests' error and serves on (checked side by side
with Triton 2.51). Before, in a worker process it ended the worker (the batch ran again
on the next one, which it ended too: "the batch lost its worker twice", and a restart
backoff growing to 32 s), and in the server's own threads (``isolation: thread``) it
stopped the whole server."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sordino.config import RuntimeConfig
from sordino.errors import ModelLoadError
from sordino.models.repository import scan_repository
from sordino.testing import serve_in_thread
from tests.backends.python_models import load_python_backend, write_python_model

MODEL = """import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        if os.environ.get("RAISE_IN_INITIALIZE"):
            sys.exit(4)

    def execute(self, requests):
        x = int(pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()[0])
        if x == 1:
            raise KeyboardInterrupt()
        if x == 2:
            sys.exit(3)
        if x == 3:
            raise GeneratorExit()
        if x == 4:
            return [pb_utils.InferenceResponse(error="a plain string")]
        pid = np.array([os.getpid()], np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pid)])]
"""


def _repository(root: Path) -> Path:
    write_python_model(root, "m", MODEL)
    return root


def _ask(client: httpclient.InferenceServerClient, x: int) -> int:
    tensor = httpclient.InferInput("X", [1], "INT32")
    tensor.set_data_from_numpy(np.array([x], np.int32))
    return int(client.infer("m", [tensor]).as_numpy("Y")[0])


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_what_is_not_an_exception_fails_the_call_and_the_model_serves_on(
    tmp_path: Path, isolation: str
) -> None:
    sources = [
        dataclasses.replace(s, config=s.config.model_copy(update={"isolation": isolation}))
        for s in scan_repository(_repository(tmp_path))
    ]
    with serve_in_thread(RuntimeConfig(), sources) as server:
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        serving = _ask(client, 0)
        if isolation == "thread":
            assert serving == os.getpid()
        said = {
            1: "execute raised KeyboardInterrupt() at 1/model.py:16 in execute",
            2: "execute raised SystemExit(3) at 1/model.py:18 in execute",
            3: "execute raised GeneratorExit() at 1/model.py:20 in execute",
            4: "InferenceResponse's error must be a pb_utils.TritonError",
        }
        for x, message in said.items():
            with pytest.raises(InferenceServerException) as failed:
                _ask(client, x)
            assert message in str(failed.value)
            assert _ask(client, 0) == serving  # the same worker (or server) serves on
        client.close()


def test_sys_exit_in_initialize_fails_the_load_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAISE_IN_INITIALIZE", "1")
    with pytest.raises(ModelLoadError, match=r"initialize raised SystemExit\(4\) at 1/model.py"):
        load_python_backend(_repository(tmp_path) / "m", own_process=False)


def test_sys_exit_as_model_py_is_imported_fails_the_load_saying_so(tmp_path: Path) -> None:
    """An argparse at the top of ``model.py`` ends in ``SystemExit(2)``."""
    folder = _repository(tmp_path) / "m"
    model = folder / "1" / "model.py"
    model.write_text("import sys\nsys.exit(2)\n" + model.read_text())
    with pytest.raises(
        ModelLoadError, match=r"importing .* raised SystemExit\(2\) at 1/model.py:2"
    ):
        load_python_backend(folder, own_process=False)
