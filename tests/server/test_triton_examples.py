"""Triton's example models (``sordino start --with-triton-examples``) with Triton's clients.

Each test does what Triton's example client program for the model does
(simple_http_string_infer_client, simple_grpc_string_infer_client and the INT8 variant)
and checks what it checks.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from sordino.models.repository import builtin_sources, triton_example_sources
from sordino.testing import RunningServer, serve_in_thread


@pytest.fixture(scope="module")
def examples() -> Iterator[RunningServer]:
    simple = [s for s in builtin_sources() if s.name == "simple"]
    with serve_in_thread(sources=simple + triton_example_sources()) as running:
        yield running


@pytest.fixture(params=["http", "grpc"])
def client(examples: RunningServer, request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "http":
        client: Any = httpclient.InferenceServerClient(url=examples.url.removeprefix("http://"))
    else:
        client = grpcclient.InferenceServerClient(examples.grpc_url)
    yield client
    client.close()


def _mod(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def test_simple_string(client: Any) -> None:
    mod = _mod(client)
    in0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    in1 = np.ones((1, 16), dtype=np.int32)
    strings0 = np.array([str(x).encode() for x in in0.ravel()], dtype=object).reshape(1, 16)
    strings1 = np.array([str(x).encode() for x in in1.ravel()], dtype=object).reshape(1, 16)
    inputs = [
        mod.InferInput("INPUT0", [1, 16], "BYTES"),
        mod.InferInput("INPUT1", [1, 16], "BYTES"),
    ]
    inputs[0].set_data_from_numpy(strings0)
    inputs[1].set_data_from_numpy(strings1)
    outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
    result = client.infer("simple_string", inputs, outputs=outputs)
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    for i in range(16):
        assert int(out0[0][i]) == in0[0][i] + in1[0][i]
        assert int(out1[0][i]) == in0[0][i] - in1[0][i]
    config = client.get_model_config("simple_string")
    max_batch = (
        config["max_batch_size"] if isinstance(config, dict) else config.config.max_batch_size
    )
    assert max_batch == 8


def test_simple_int8(client: Any) -> None:
    mod = _mod(client)
    in0 = np.arange(16, dtype=np.int8).reshape(1, 16)
    in1 = np.ones((1, 16), dtype=np.int8)
    inputs = [mod.InferInput("INPUT0", [1, 16], "INT8"), mod.InferInput("INPUT1", [1, 16], "INT8")]
    inputs[0].set_data_from_numpy(in0)
    inputs[1].set_data_from_numpy(in1)
    result = client.infer("simple_int8", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), in0 + in1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), in0 - in1)
    assert result.as_numpy("OUTPUT0").dtype == np.int8


def _repeat_inputs(values: list[int]) -> list[Any]:
    array = np.array(values, dtype=np.int32)
    inputs = [
        grpcclient.InferInput("IN", [len(values)], "INT32"),
        grpcclient.InferInput("DELAY", [len(values)], "UINT32"),
        grpcclient.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(array)
    inputs[1].set_data_from_numpy(np.zeros(len(values), dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.zeros(1, dtype=np.uint32))
    return inputs


def _stream(examples: RunningServer, values: list[int], *, empty_final: bool) -> list[Any]:
    """Send one request to repeat_int32 over ModelStreamInfer; every response, in order."""
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(examples.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer(
        "repeat_int32", _repeat_inputs(values), request_id="r",
        enable_empty_final_response=empty_final,
    )  # fmt: skip
    got = []
    while True:
        result, error = answers.get(timeout=30)
        assert error is None, error
        got.append(result)
        final = result.get_response().parameters["triton_final_response"].bool_param
        if final or (not empty_final and len(got) == len(values)):
            break
    client.stop_stream()
    client.close()
    return got


def test_repeat_int32_sends_one_response_per_element(examples: RunningServer) -> None:
    """Triton's decoupled repeat example: many responses to one request, in order."""
    got = _stream(examples, [4, 2, 0, 1], empty_final=False)
    assert [int(r.as_numpy("OUT")[0]) for r in got] == [4, 2, 0, 1]
    assert [int(r.as_numpy("IDX")[0]) for r in got] == [0, 1, 2, 3]
    flags = [r.get_response().parameters["triton_final_response"].bool_param for r in got]
    assert flags == [False, False, False, True]


def test_repeat_int32_empty_final_response(examples: RunningServer) -> None:
    """Asked for, the end comes as an empty response flagged final; an empty IN gets only it."""
    got = _stream(examples, [7, 8], empty_final=True)
    assert [int(r.as_numpy("OUT")[0]) for r in got[:2]] == [7, 8]
    assert len(got) == 3 and not got[2].get_response().outputs
    none = _stream(examples, [], empty_final=True)
    assert len(none) == 1 and not none[0].get_response().outputs


def test_repeat_int32_state_input_is_the_models_own(examples: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(examples.grpc_url)
    inputs = _repeat_inputs([1])
    pos = grpcclient.InferInput("POS", [1], "INT32")
    pos.set_data_from_numpy(np.zeros(1, dtype=np.int32))
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer("repeat_int32", [*inputs, pos])
    _, error = answers.get(timeout=30)
    client.stop_stream()
    client.close()
    assert error is not None and "the model's own state" in str(error)


def _identity(client: Any, array: np.ndarray[Any, Any], binary: bool) -> np.ndarray[Any, Any]:
    mod = _mod(client)
    inputs = [mod.InferInput("INPUT0", list(array.shape), "BYTES")]
    if mod is httpclient:
        inputs[0].set_data_from_numpy(array, binary_data=binary)
        outputs = [mod.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    else:
        inputs[0].set_data_from_numpy(array)
        outputs = [mod.InferRequestedOutput("OUTPUT0")]
    result: np.ndarray[Any, Any] = client.infer(
        "simple_identity", inputs, outputs=outputs
    ).as_numpy("OUTPUT0")
    return result


@pytest.mark.parametrize("binary", [True, False])
def test_simple_identity_as_the_string_clients_use_it(client: Any, binary: bool) -> None:
    """simple_http/grpc_string_infer_client: strings with a NUL, and 4-byte blobs, come
    back as they went (binary and JSON)."""
    nul = np.array([b"he\x00llo" for _ in range(16)], dtype=np.object_).reshape(1, 16)
    got = _identity(client, nul, binary)
    assert [x if isinstance(x, bytes) else x.encode() for x in got.ravel()] == list(nul.ravel())
    blobs = np.array([b"\x00\x01\x02\x03"] * 16, dtype=np.bytes_).reshape(1, 16)
    got = _identity(client, blobs, binary)
    encoded = np.char.encode(got.astype(str))  # what the example client compares
    assert np.array_equal(encoded, blobs)


def _regions(tag: str, sizes: dict[str, int]) -> dict[str, Any]:
    import tritonclient.utils.shared_memory as shm

    return {
        name: shm.create_shared_memory_region(name, f"/sordino_ex_{tag}_{name}", size)
        for name, size in sizes.items()
    }


def _destroy(handles: dict[str, Any]) -> None:
    import tritonclient.utils.shared_memory as shm

    for handle in handles.values():
        shm.destroy_shared_memory_region(handle)


def test_shm_string_client(client: Any) -> None:
    """simple_http/grpc_shm_string_client: unregister every region (system and CUDA)
    first, then simple_string with BYTES inputs and outputs in four regions."""
    import os

    import tritonclient.utils.shared_memory as shm
    from tritonclient import utils

    mod = _mod(client)
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    in0 = np.arange(16, dtype=np.int32)
    in1 = np.ones(16, dtype=np.int32)
    data0 = utils.serialize_byte_tensor(np.array([str(x).encode() for x in in0], dtype=object))
    data1 = utils.serialize_byte_tensor(np.array([str(x).encode() for x in in1], dtype=object))
    sums = np.array([str(x).encode() for x in in0 + in1], dtype=object)
    diffs = np.array([str(x).encode() for x in in0 - in1], dtype=object)
    out0_size = utils.serialized_byte_size(utils.serialize_byte_tensor(sums))
    out1_size = utils.serialized_byte_size(utils.serialize_byte_tensor(diffs))
    in0_size, in1_size = utils.serialized_byte_size(data0), utils.serialized_byte_size(data1)
    sizes = {"output0_data": out0_size, "output1_data": out1_size}
    sizes |= {"input0_data": in0_size, "input1_data": in1_size}
    handles = _regions(f"{os.getpid()}_{mod.__name__.rsplit('.', 1)[-1]}", sizes)
    try:
        shm.set_shared_memory_region(handles["input0_data"], [data0])
        shm.set_shared_memory_region(handles["input1_data"], [data1])
        for name, size in sizes.items():
            client.register_system_shared_memory(name, handles[name]._shm_key, size)
        inputs = [
            mod.InferInput("INPUT0", [1, 16], "BYTES"),
            mod.InferInput("INPUT1", [1, 16], "BYTES"),
        ]
        inputs[0].set_shared_memory("input0_data", in0_size)
        inputs[1].set_shared_memory("input1_data", in1_size)
        outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("output0_data", out0_size)
        outputs[1].set_shared_memory("output1_data", out1_size)
        result = client.infer("simple_string", inputs, outputs=outputs)
        out0 = result.get_output("OUTPUT0")
        shape = out0["shape"] if mod is httpclient else list(out0.shape)
        got0 = shm.get_contents_as_numpy(handles["output0_data"], np.object_, shape)
        got1 = shm.get_contents_as_numpy(handles["output1_data"], np.object_, shape)
        assert list(got0.ravel()) == list(sums) and list(got1.ravel()) == list(diffs)
        client.unregister_system_shared_memory()
    finally:
        _destroy(handles)


def test_reuse_infer_objects_client(client: Any) -> None:
    """reuse_infer_objects_client: the same input and output objects with and without
    shared memory, after unregistering every region (system and CUDA)."""
    import os

    import tritonclient.utils.shared_memory as shm

    mod = _mod(client)
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()
    a = np.arange(16, dtype=np.int32)
    b = np.ones(16, dtype=np.int32)
    names = ("output0_data", "output1_data", "input0_data", "input1_data")
    handles = _regions(
        f"{os.getpid()}_reuse_{mod.__name__.rsplit('.', 1)[-1]}", dict.fromkeys(names, 64)
    )
    try:
        shm.set_shared_memory_region(handles["input0_data"], [a])
        shm.set_shared_memory_region(handles["input1_data"], [b])
        for name in names:
            client.register_system_shared_memory(name, handles[name]._shm_key, 64)
        inputs = [
            mod.InferInput("INPUT0", [1, 16], "INT32"),
            mod.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        outputs = [mod.InferRequestedOutput("OUTPUT0"), mod.InferRequestedOutput("OUTPUT1")]
        for shared in (True, False, True):
            if shared:
                for item, name in zip(inputs + outputs, names[2:] + names[:2], strict=True):
                    item.set_shared_memory(name, 64)
                second = b
            else:
                second = b * 2
                inputs[0].set_data_from_numpy(a.reshape(1, 16))
                inputs[1].set_data_from_numpy(second.reshape(1, 16))
                for item in outputs:
                    item.unset_shared_memory()
            result = client.infer("simple", inputs, outputs=outputs)
            if shared:
                sum_ = shm.get_contents_as_numpy(handles["output0_data"], np.int32, [1, 16])
                diff = shm.get_contents_as_numpy(handles["output1_data"], np.int32, [1, 16])
            else:
                sum_, diff = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
            np.testing.assert_array_equal(sum_[0], a + second)
            np.testing.assert_array_equal(diff[0], a - second)
        client.unregister_system_shared_memory()
    finally:
        _destroy(handles)
