"""A JSON body far larger than its model could take is refused before it is parsed.

Before, a 30 MB JSON body of 16 million values sent to the digits classifier (64 values
a row, 64 rows at most) took the serving loop 1.9 s and 450 MB: orjson built every value
and numpy converted them all before the element count was looked at.
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator

import httpx
import pytest

from sordino.config import RuntimeConfig
from sordino.datatypes import tensor_from_json
from sordino.errors import MalformedBody, TensorError
from sordino.inference import ModelMetadata, TensorSpec
from sordino.models.repository import builtin_sources
from sordino.protocol.validate import JSON_BYTES_PER_VALUE, JSON_ROOM, check_json_size
from sordino.testing import RunningServer, serve_in_thread
from tests.conftest import thread_isolated

DIGITS = "digits-classifier"


def _metadata(*inputs: TensorSpec, batched: bool = True) -> ModelMetadata:
    return ModelMetadata(name="m", version="1", platform="onnxruntime", inputs=inputs,
                         outputs=(TensorSpec("y", "FP32", (-1, 1)),), batched=batched)  # fmt: skip


def test_the_bound_is_the_models_values_and_room() -> None:
    metadata = _metadata(TensorSpec("a", "FP32", (-1, 8)), TensorSpec("b", "INT64", (-1, 2, 3)))
    bound = 4 * (8 + 6) * JSON_BYTES_PER_VALUE + JSON_ROOM
    check_json_size(metadata, 4, bound)  # at the bound: parsed
    with pytest.raises(MalformedBody, match="at most 56 values") as refused:
        check_json_size(metadata, 4, bound + 1)
    assert refused.value.too_large  # answered 413
    check_json_size(metadata, 4, JSON_ROOM)


@pytest.mark.parametrize(
    "spec",
    [TensorSpec("s", "BYTES", (-1, 1)), TensorSpec("v", "FP32", (-1, -1))],
    ids=["strings", "a dimension of any size"],
)
def test_no_bound_where_the_model_takes_any_amount(spec: TensorSpec) -> None:
    check_json_size(_metadata(TensorSpec("a", "FP32", (-1, 8)), spec), 4, 1 << 30)


def test_a_flat_list_of_the_wrong_count_is_refused_before_numpy_reads_it() -> None:
    data = list(range(2_000_000))
    tracemalloc.start()
    try:
        with pytest.raises(TensorError, match="holds 2000000 elements"):
            tensor_from_json("x", "INT64", (1, 64), data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # numpy's array of it would be 16 MB


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    sources = thread_isolated([s for s in builtin_sources() if s.name == DIGITS])
    with serve_in_thread(RuntimeConfig(), sources) as running:
        yield running


def _body(rows: int, values: int, indent: int | None = None) -> bytes:
    tensor = {"name": "pixels", "datatype": "FP32", "shape": [rows, 64],
              "data": [[1.2345678901234567e-30] * values] * rows}  # fmt: skip
    return json.dumps({"inputs": [tensor]}, indent=indent).encode()


def test_a_json_body_far_larger_than_the_model_takes_is_413(server: RunningServer) -> None:
    body = _body(1, 200_000)
    response = httpx.post(f"{server.url}/v2/models/{DIGITS}/infer", content=body, timeout=30)
    assert response.status_code == 413, response.text
    assert "at most 4096 values" in response.json()["error"]


def test_the_largest_request_pretty_printed_is_served(server: RunningServer) -> None:
    body = _body(64, 64, indent=8)  # 64 rows of 64 values, a line and 24 spaces each
    assert len(body) > JSON_ROOM
    response = httpx.post(f"{server.url}/v2/models/{DIGITS}/infer", content=body, timeout=30)
    assert response.status_code == 200, response.text
