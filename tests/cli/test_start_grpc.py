"""``sordino start`` serves HTTP and gRPC from one process; both clients work against it."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.cli.conftest import DIGITS, serving_grpc


def test_start_serves_http_and_grpc(tmp_path: Path) -> None:
    with serving_grpc(DIGITS, tmp_path) as (process, lines):
        output = "".join(lines)
        http_url = re.search(r"http://(127\.0\.0\.1:\d+)", output)
        grpc_url = re.search(r"grpc://(127\.0\.0\.1:\d+)", output)
        assert http_url and grpc_url, output
        assert "model control: none" in output
        pixels = np.ones((1, 64), dtype=np.float32)
        g = grpcclient.InferenceServerClient(grpc_url.group(1))
        x = grpcclient.InferInput("pixels", [1, 64], "FP32")
        x.set_data_from_numpy(pixels)
        via_grpc = g.infer("digits-classifier", [x]).as_numpy("probabilities")
        h = httpclient.InferenceServerClient(http_url.group(1))
        y = httpclient.InferInput("pixels", [1, 64], "FP32")
        y.set_data_from_numpy(pixels)
        via_http = h.infer("digits-classifier", [y]).as_numpy("probabilities")
        np.testing.assert_allclose(via_grpc, via_http)
    assert process.returncode == 0, "".join(lines)
