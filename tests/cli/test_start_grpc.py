"""``sordino start`` serves HTTP and gRPC from one process; both clients work against it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.cli.conftest import DIGITS


def test_start_serves_http_and_grpc(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "sordino", "start", "--http-port", "0", "--grpc-port", "0",
               *DIGITS]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [*command, "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "grpc://" in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(90), "".join(lines)
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
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        reader.join(10)
    assert process.returncode == 0, "".join(lines)
