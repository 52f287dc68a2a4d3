"""Triton's system shared-memory extension, through tritonclient over HTTP and gRPC.

The flow is the one of Triton's simple_http_shm_client / simple_grpc_shm_client:
create regions with ``tritonclient.utils.shared_memory``, register them, run
``simple`` with its inputs and outputs in the regions, read the outputs from them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from sordino.testing import RunningServer

NBYTES = 64  # 16 INT32


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def client(server: RunningServer, protocol: str) -> Iterator[Any]:
    if protocol == "http":
        client: Any = httpclient.InferenceServerClient(url=server.url.removeprefix("http://"))
    else:
        client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.unregister_system_shared_memory()
    client.close()


@pytest.fixture
def regions() -> Iterator[tuple[Any, Any]]:
    tag = f"{os.getpid()}_{id(object())}"
    inputs = shm.create_shared_memory_region("input_data", f"/sordino_test_in_{tag}", NBYTES * 2)
    outputs = shm.create_shared_memory_region("output_data", f"/sordino_test_out_{tag}", NBYTES * 2)
    yield inputs, outputs
    shm.destroy_shared_memory_region(inputs)
    shm.destroy_shared_memory_region(outputs)


def _mod(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


def _key(handle: Any) -> str:
    return str(handle._shm_key)


def _simple_request(
    protocol: str, *, in_region: str = "input_data", offset: int = 0, out_size: int = NBYTES
) -> tuple[list[Any], list[Any]]:
    mod = _mod(protocol)
    inputs = [
        mod.InferInput("INPUT0", [1, 16], "INT32"),
        mod.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_shared_memory(in_region, NBYTES, offset)
    inputs[1].set_shared_memory(in_region, NBYTES, NBYTES)
    outputs = [
        mod.InferRequestedOutput("OUTPUT0"),
        mod.InferRequestedOutput("OUTPUT1"),
    ]
    outputs[0].set_shared_memory("output_data", out_size)
    outputs[1].set_shared_memory("output_data", out_size, NBYTES)
    return inputs, outputs


def _infer(client: Any, request: tuple[list[Any], list[Any]], **kwargs: Any) -> Any:
    return client.infer("simple", request[0], outputs=request[1], **kwargs)


def _register(client: Any, regions: tuple[Any, Any], **kwargs: Any) -> None:
    inputs, outputs = regions
    client.register_system_shared_memory("input_data", _key(inputs), NBYTES * 2, **kwargs)
    client.register_system_shared_memory("output_data", _key(outputs), NBYTES * 2, **kwargs)


def test_inputs_and_outputs_travel_through_registered_regions(
    client: Any, regions: tuple[Any, Any], protocol: str
) -> None:
    """Triton's shm client example, unchanged: the sums and differences land in the region."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    shm.set_shared_memory_region(regions[0], [a, b])
    _register(client, regions)
    inputs, outputs = _simple_request(protocol)
    result = client.infer("simple", inputs, outputs=outputs)
    out0 = result.get_output("OUTPUT0")
    shape = out0["shape"] if protocol == "http" else list(out0.shape)
    datatype = out0["datatype"] if protocol == "http" else out0.datatype
    assert (shape, datatype) == ([1, 16], "INT32")
    got0 = shm.get_contents_as_numpy(regions[1], np.int32, [1, 16])
    got1 = shm.get_contents_as_numpy(regions[1], np.int32, [1, 16], offset=NBYTES)
    np.testing.assert_array_equal(got0, a + b)
    np.testing.assert_array_equal(got1, a - b)

    status = client.get_system_shared_memory_status()
    if protocol == "http":
        names = sorted(region["name"] for region in status)
    else:
        names = sorted(status.regions)
    assert names == ["input_data", "output_data"]
    client.unregister_system_shared_memory("input_data")
    with pytest.raises(InferenceServerException, match="Unable to find shared memory region"):
        _infer(client, _simple_request(protocol))


def test_shared_input_with_response_output(
    client: Any, regions: tuple[Any, Any], protocol: str
) -> None:
    """Inputs from a region, outputs in the response: both ways mix."""
    a = np.ones((1, 16), dtype=np.int32)
    shm.set_shared_memory_region(regions[0], [a, a])
    _register(client, regions)
    inputs, _ = _simple_request(protocol)
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("past the end", "Invalid offset + byte size for shared memory region: 'input_data'"),
        ("output too small", "should be at least 64 bytes to hold the results"),
        ("unknown region", "Unable to find shared memory region: 'nowhere'"),
        ("not the tensor's size", "64 bytes. but its shared_memory_byte_size is 128"),
    ],
)
def test_every_bound_is_checked(
    client: Any, regions: tuple[Any, Any], protocol: str, case: str, message: str
) -> None:
    shm.set_shared_memory_region(regions[0], [np.zeros((2, 16), dtype=np.int32)])
    _register(client, regions)
    if case == "past the end":
        request = _simple_request(protocol, offset=NBYTES + 4)
    elif case == "output too small":
        request = _simple_request(protocol, out_size=NBYTES // 2)
    elif case == "not the tensor's size":
        request = _simple_request(protocol)
        request[0][0].set_shared_memory("input_data", NBYTES * 2)  # checked before any copy
    else:
        request = _simple_request(protocol, in_region="nowhere")
    with pytest.raises(InferenceServerException, match=message.replace("+", r"\+")):
        _infer(client, request)


def test_registration_mistakes_are_explained(client: Any, regions: tuple[Any, Any]) -> None:
    inputs, _ = regions
    with pytest.raises(InferenceServerException, match="Unable to open shared memory region"):
        client.register_system_shared_memory("r", "/sordino_test_no_such_object", 16)
    with pytest.raises(InferenceServerException, match="past the end of object"):
        client.register_system_shared_memory("r", _key(inputs), NBYTES * 2, offset=NBYTES)
    with pytest.raises(InferenceServerException, match="not a shared memory object name"):
        client.register_system_shared_memory("r", "/../etc/passwd", 16)
    with pytest.raises(InferenceServerException, match="reserved for sordino"):
        client.register_system_shared_memory("r", "/sordino-1-abcd", 16)
    client.register_system_shared_memory("r", _key(inputs), 16)
    with pytest.raises(InferenceServerException, match="already in manager"):
        client.register_system_shared_memory("r", _key(inputs), 16)
    with pytest.raises(InferenceServerException, match="Unable to find system shared memory"):
        client.get_system_shared_memory_status("nothing")


def test_a_claimed_tenant_makes_no_separate_set_of_regions(
    client: Any, regions: tuple[Any, Any], protocol: str
) -> None:
    """Without tenants configured, X-Sordino-Tenant is no credential: every caller sees,
    uses and can unregister the one set of regions, as in Triton (tenants with API keys
    isolate them: tests/tenants/test_auth.py)."""
    shm.set_shared_memory_region(regions[0], [np.ones((2, 16), dtype=np.int32)])
    _register(client, regions, headers={"x-sordino-tenant": "alpha"})
    beta = {"x-sordino-tenant": "beta"}
    status = client.get_system_shared_memory_status(headers=beta)
    assert (len(status) if protocol == "http" else len(status.regions)) == 2
    result = client.infer("simple", _simple_request(protocol)[0], headers=beta)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2))
    with pytest.raises(InferenceServerException, match="already in manager"):
        client.register_system_shared_memory("input_data", _key(regions[0]), 16, headers=beta)
    client.unregister_system_shared_memory(headers=beta)
    status = client.get_system_shared_memory_status(headers={"x-sordino-tenant": "alpha"})
    assert (len(status) if protocol == "http" else len(status.regions)) == 0


def test_cuda_shared_memory_answers_as_triton_without_gpus(client: Any, protocol: str) -> None:
    """Status lists no regions and unregistering succeeds (Triton's clients start by
    unregistering every region); registering is refused with the reason."""
    status = client.get_cuda_shared_memory_status()
    assert (status if protocol == "http" else list(status.regions)) == []
    client.unregister_cuda_shared_memory()
    client.unregister_cuda_shared_memory("nothing")
    with pytest.raises(InferenceServerException, match="Unable to find cuda shared memory"):
        client.get_cuda_shared_memory_status("nothing")
    with pytest.raises(InferenceServerException, match="no CUDA devices") as info:
        client.register_cuda_shared_memory("gpu", b"\0" * 64, 0, 64)
    assert info.value.status() in {"400", "StatusCode.UNIMPLEMENTED"}


def test_long_client_strings_are_cut_in_errors(client: Any) -> None:
    """A 10,000-character key or region name is not echoed whole."""
    long = "k" * 10_000
    for name, key in (("r", "/" + long), (long, "/sordino_test_no_such_object")):
        with pytest.raises(InferenceServerException) as info:
            client.register_system_shared_memory(name, key, 16)
        message = info.value.message()
        assert "k" * 41 not in message and "..." in message
        assert len(message) < 600


def test_shared_memory_over_the_grpc_stream(
    server: RunningServer, regions: tuple[Any, Any]
) -> None:
    """ModelStreamInfer reads inputs from and writes outputs into regions too."""
    import queue

    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    shm.set_shared_memory_region(regions[0], [a, a])
    client = grpcclient.InferenceServerClient(server.grpc_url)
    _register(client, regions)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    inputs, outputs = _simple_request("grpc")
    client.async_stream_infer("simple", inputs, outputs=outputs)
    result, error = answers.get(timeout=30)
    client.stop_stream()
    assert error is None, error
    assert result.get_output("OUTPUT0").datatype == "INT32"
    got = shm.get_contents_as_numpy(regions[1], np.int32, [1, 16])
    np.testing.assert_array_equal(got, a + a)
    client.unregister_system_shared_memory()
    client.close()
