"""A client shrinks its shared-memory object after registering it: the request that
touches the missing bytes fails with a 400, and the server lives on.

The server runs as its own process (``sordino start``): before the fix, reading a mapping
past the object's end raised SIGBUS, which killed the whole server, and must not be able
to take pytest with it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

import sordino
from tests.cli.conftest import ServerProcess, sordino_start

MIB = 1 << 20
SIMPLE = Path(sordino.__file__).parent / "models" / "builtin" / "simple.onnx"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with sordino_start(["--model", f"simple={SIMPLE}"], tmp_path_factory.mktemp("shrink")) as s:
        yield s


def _grpc_url(server: ServerProcess) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in server.lines:
            if "listening on grpc://" in line:
                return line.split("grpc://", 1)[1].split()[0]
        time.sleep(0.05)
    raise AssertionError("no gRPC address printed:\n" + "\n".join(server.lines))


@pytest.fixture
def region(protocol: str) -> Iterator[Any]:
    key = f"/sordino_shrink_{os.getpid()}_{protocol}"
    handle = shm.create_shared_memory_region("big", key, MIB)
    yield handle
    shm.destroy_shared_memory_region(handle)


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _client(server: ServerProcess, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    return grpcclient.InferenceServerClient(_grpc_url(server))


def _inputs(mod: Any, *, region: str | None, offset: int) -> list[Any]:
    inputs = [mod.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]
    ones = np.ones((1, 16), dtype=np.int32)
    if region is None:
        for item in inputs:
            item.set_data_from_numpy(ones)
    else:
        inputs[0].set_shared_memory(region, 64, offset)
        inputs[1].set_shared_memory(region, 64, offset + 64)
    return inputs


def _shrink(handle: Any, size: int) -> None:
    fd = os.open(f"/dev/shm/{str(handle._shm_key).lstrip('/')}", os.O_RDWR)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def test_a_shrunk_object_fails_only_that_request(
    server: ServerProcess, region: Any, protocol: str
) -> None:
    """Register 1 MiB, ftruncate the object to 4 KiB, read an input at 64 KiB: a 400
    naming the region and both sizes; the server still serves; an output written into
    the shrunk part fails the same way; bytes still inside the object still work."""
    mod = httpclient if protocol == "http" else grpcclient
    client = _client(server, protocol)
    key = str(region._shm_key)
    try:
        client.register_system_shared_memory("big", key, MIB)
        _shrink(region, 4096)
        with pytest.raises(InferenceServerException) as info:
            client.infer("simple", _inputs(mod, region="big", offset=64 * 1024))
        message = info.value.message()
        assert "'big'" in message and str(MIB) in message and "now holds 4096 bytes" in message
        if protocol == "http":
            assert info.value.status() == "400"
        else:
            assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert server.process.poll() is None, "\n".join(server.lines[-30:])

        # An output written past the object's end fails the same way.
        outputs = [mod.InferRequestedOutput("OUTPUT0")]
        outputs[0].set_shared_memory("big", 64, 512 * 1024)
        with pytest.raises(InferenceServerException, match="now holds 4096 bytes"):
            client.infer("simple", _inputs(mod, region=None, offset=0), outputs=outputs)
        assert server.process.poll() is None

        # The next requests succeed: from the bytes still there, and in the request.
        shm.set_shared_memory_region(region, [np.full((2, 16), 3, dtype=np.int32)])
        result = client.infer("simple", _inputs(mod, region="big", offset=0))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 6))
        result = client.infer("simple", _inputs(mod, region=None, offset=0))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2))
    finally:
        if server.process.poll() is None:
            client.unregister_system_shared_memory()
        client.close()
    assert server.process.poll() is None
