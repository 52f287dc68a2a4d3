"""Every datatype ONNX Runtime takes, end to end through tritonclient (JSON and binary)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from sordino.config import ModelConfig
from sordino.models.repository import sources_for
from sordino.testing import RunningServer, serve_in_thread
from tests.models import ONNX_TYPES, identity_model

SAMPLES = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": np.array([[0, 7, 255]], np.uint8),
    "UINT16": np.array([[0, 7, 65535]], np.uint16),
    "UINT32": np.array([[0, 7, 2**32 - 1]], np.uint32),
    "UINT64": np.array([[0, 7, 2**64 - 1]], np.uint64),
    "INT8": np.array([[-128, 0, 127]], np.int8),
    "INT16": np.array([[-32768, 0, 32767]], np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1]], np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1]], np.int64),
    "FP16": np.array([[-1.5, 0.0, 65504.0]], np.float16),
    "FP32": np.array([[-1.25, 0.0, 3.4e38]], np.float32),
    "FP64": np.array([[-1e-300, 0.0, 1.7e308]], np.float64),
    "BYTES": np.array([[b"a", b"", "é".encode()]], dtype=object),
}


@pytest.fixture(scope="module")
def typed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    root = tmp_path_factory.mktemp("typed")
    sources = []
    for datatype in ONNX_TYPES:
        path = identity_model(root / f"id_{datatype.lower()}.onnx", datatype)
        sources += sources_for(ModelConfig(name=f"id_{datatype.lower()}", path=path))
    with serve_in_thread(sources=sources) as server:
        yield server


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_identity_roundtrip(typed_server: RunningServer, datatype: str, binary: bool) -> None:
    client = httpclient.InferenceServerClient(typed_server.url.removeprefix("http://"))
    data = SAMPLES[datatype]
    model = f"id_{datatype.lower()}"
    meta = client.get_model_metadata(model)
    assert meta["inputs"][0]["datatype"] == datatype
    inp = httpclient.InferInput("x", list(data.shape), datatype)
    inp.set_data_from_numpy(data, binary_data=binary)
    out = httpclient.InferRequestedOutput("y", binary_data=binary)
    got = client.infer(model, [inp], outputs=[out]).as_numpy("y")
    if datatype == "BYTES":
        values = [v if isinstance(v, bytes) else v.encode() for v in got.ravel()]
        assert values == list(data.ravel())
    else:
        np.testing.assert_array_equal(got, data)
        assert got.dtype == data.dtype
