"""A model run in the server's own threads (``isolation: thread``) whose batch runs past
``workers.execution_timeout``: its requests are answered with an error saying so, and the
instance serves the next batches in a new thread (the stuck one cannot be stopped: it is
left to end on its own). Before, thread instances had no execution timeout: the batch's
requests had no answer, and every later batch of the model queued behind it, forever."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sordino.config import RuntimeConfig
from sordino.models.repository import scan_repository
from sordino.testing import serve_in_thread
from tests.backends.python_models import write_python_model

MODEL = """import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.release = os.path.join(args["model_repository"], "release")

    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
        if x[0] == 1:  # stuck until the test lets it go (60 s at most)
            ends = time.monotonic() + 60
            while not os.path.exists(self.release) and time.monotonic() < ends:
                time.sleep(0.05)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)])]
"""


def test_a_batch_past_the_execution_timeout_fails_and_the_next_ones_run(tmp_path: Path) -> None:
    write_python_model(tmp_path, "stuck", MODEL)
    sources = [
        dataclasses.replace(s, config=s.config.model_copy(update={"isolation": "thread"}))
        for s in scan_repository(tmp_path)
    ]
    config = RuntimeConfig.model_validate({"workers": {"execution_timeout": "1s"}})
    before = {t.name for t in threading.enumerate()}
    try:
        with serve_in_thread(config, sources) as server:
            client = httpclient.InferenceServerClient(
                server.url.removeprefix("http://"), network_timeout=30
            )

            def ask(x: int) -> int:
                tensor = httpclient.InferInput("X", [1], "INT32")
                tensor.set_data_from_numpy(np.array([x], np.int32))
                return int(client.infer("stuck", [tensor]).as_numpy("Y")[0])

            with pytest.raises(InferenceServerException) as failed:
                ask(1)
            assert "the batch ran over 1 s (workers.execution_timeout) in its thread" in str(
                failed.value
            )
            assert [ask(0), ask(2)] == [0, 2]  # served in a new thread meanwhile
            left = {t.name for t in threading.enumerate() if t.is_alive()} - before
            assert any(name.startswith("sordino-stuck") for name in left)
            client.close()
    finally:
        (tmp_path / "stuck" / "release").touch()  # the stuck thread ends
