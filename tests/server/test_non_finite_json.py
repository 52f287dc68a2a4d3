"""NaN and the infinities in JSON, as Triton reads and writes them: ``NaN``,
``Infinity``, ``-Infinity`` (not JSON numbers, but what Python's ``json`` — and so
``tritonclient`` — writes and reads). Before, an output's NaN and infinities were
written ``null`` (an infinity came back to tritonclient as NaN) and a request sending
them was refused as "not valid JSON"."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from sordino.config import RuntimeConfig
from sordino.models.repository import scan_repository
from sordino.testing import RunningServer, serve_in_thread

CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ] },
        { name: "I", data_type: TYPE_INT32, dims: [ -1 ], optional: true } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] },
         { name: "H", data_type: TYPE_FP16, dims: [ 3 ] } ]
"""

MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        half = np.array([np.nan, np.inf, 0.5], dtype=np.float16)
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy()),
                pb_utils.Tensor("H", half),
            ])
            for r in requests
        ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root = tmp_path_factory.mktemp("repository")
    (root / "echo" / "1").mkdir(parents=True)
    (root / "echo" / "config.pbtxt").write_text(CONFIG)
    (root / "echo" / "1" / "model.py").write_text(MODEL)
    sources = scan_repository(Path(root))
    with serve_in_thread(RuntimeConfig(), sources) as running:
        yield running


def _post(server: RunningServer, path: str, body: str) -> tuple[int, str]:
    request = urllib.request.Request(f"{server.url}{path}", data=body.encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_nan_and_the_infinities_go_in_and_come_back_as_triton_writes_them(
    server: RunningServer,
) -> None:
    status, text = _post(
        server,
        "/v2/models/echo/infer",
        '{"inputs":[{"name":"X","datatype":"FP32","shape":[4],'
        '"data":[NaN, Infinity, -Infinity, 0.1]}]}',
    )
    assert status == 200, text
    assert '"data":[NaN,Infinity,-Infinity,0.1]' in text  # finite ones as before
    assert '"data":[NaN,Infinity,0.5]' in text  # FP16 too


def test_tritonclient_reads_them_back(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    x = httpclient.InferInput("X", [3], "FP32")
    x.set_data_from_numpy(np.array([np.nan, np.inf, -np.inf], np.float32), binary_data=False)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=False) for n in ("Y", "H")]
    result = client.infer("echo", [x], outputs=outputs)
    y = result.as_numpy("Y")
    assert np.isnan(y[0]) and y[1] == np.inf and y[2] == -np.inf
    h = result.as_numpy("H")
    assert np.isnan(h[0]) and h[1] == np.inf and h[2] == 0.5
    client.close()


def test_generate_writes_them_too(server: RunningServer) -> None:
    status, text = _post(server, "/v2/models/echo/generate", '{"X": [NaN, -Infinity, 2.5]}')
    assert status == 200, text
    assert '"Y":[NaN,-Infinity,2.5]' in text
    assert json.loads(text)["H"][2] == 0.5


X_ONE = '{"name":"X","datatype":"FP32","shape":[1],"data":[1]}'


@pytest.mark.parametrize(
    ("inputs", "said"),
    [
        ('{"name":"X","datatype":"FP32","shape":[1],"data":[1e39]}', "element 0 is 1e+39, out of"),
        (X_ONE + ',{"name":"I","datatype":"INT32","shape":[1],"data":[NaN]}', "0 is nan, not an"),
        ('{"name":"X","datatype":"FP32","shape":[1],"data":[nan]}', "not valid JSON"),
    ],
)
def test_what_is_not_a_value_is_still_refused(
    server: RunningServer, inputs: str, said: str
) -> None:
    status, text = _post(server, "/v2/models/echo/infer", '{"inputs":[' + inputs + "]}")
    assert status == 400, text
    assert said in text
