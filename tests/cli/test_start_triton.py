"""``sordino start --with-triton-examples`` end to end: Triton's clients against the CLI."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from tests.cli.conftest import ONE_MODEL, sordino_start


def test_triton_examples_and_shared_memory_through_sordino_start(tmp_path: Path) -> None:
    # The built-in simple (Triton's) from its file, not all built-ins: the test uses it alone.
    with sordino_start(["--with-triton-examples", *ONE_MODEL], tmp_path) as server:
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        examples = ("simple_string", "simple_identity", "simple_int8", "repeat_int32")
        for name in ("simple", *examples, "simple_sequence"):
            assert client.is_model_ready(name), name
        # simple with its inputs in a registered region (Triton's simple_http_shm_client).
        key = f"/sordino_cli_{os.getpid()}"
        region = shm.create_shared_memory_region("cli_in", key, 128)
        try:
            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            shm.set_shared_memory_region(region, [a, a])
            client.register_system_shared_memory("cli_in", key, 128)
            inputs = [
                httpclient.InferInput("INPUT0", [1, 16], "INT32"),
                httpclient.InferInput("INPUT1", [1, 16], "INT32"),
            ]
            inputs[0].set_shared_memory("cli_in", 64)
            inputs[1].set_shared_memory("cli_in", 64, offset=64)
            result = client.infer("simple", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
            assert client.get_system_shared_memory_status()[0]["key"] == key
            client.unregister_system_shared_memory()
        finally:
            shm.destroy_shared_memory_region(region)
        metadata = client.get_server_metadata()
        assert {"system_shared_memory", "classification", "sequence"} <= set(metadata["extensions"])
        client.close()
