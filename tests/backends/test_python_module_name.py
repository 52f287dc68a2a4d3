"""``model.py`` is imported as Triton imports it: module ``<version>.model`` (``1.model``),
so a relative import of a file beside it works (``from .helpers import …``), as on
Triton; sordino imported it under a name of its own with no parent package, and such a
model failed its load ("attempted relative import with no known parent package")."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

from sordino.config import RuntimeConfig
from sordino.models.repository import scan_repository
from sordino.testing import serve_in_thread
from tests.backends.python_models import load_python_backend

MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

from .helpers import double


class TritonPythonModel:
    def execute(self, requests):
        name = np.array([__name__.encode()], dtype=np.object_)
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", double(pb_utils.get_input_tensor_by_name(r, "X").as_numpy())),
                pb_utils.Tensor("MODULE", name),
            ])
            for r in requests
        ]
"""

CONFIG = """
name: "relative"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "MODULE" data_type: TYPE_STRING dims: [ 1 ] }
]
"""


def test_a_model_imports_a_file_beside_it_relatively(tmp_path: Path) -> None:
    version = tmp_path / "relative" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(MODEL)
    (version / "helpers.py").write_text("def double(x):\n    return x * 2\n")
    (tmp_path / "relative" / "config.pbtxt").write_text(CONFIG)
    with serve_in_thread(RuntimeConfig(), scan_repository(tmp_path)) as server:
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        x = httpclient.InferInput("X", [2], "FP32")
        x.set_data_from_numpy(np.array([1.5, -2], np.float32))
        answer = client.infer("relative", [x])
        np.testing.assert_array_equal(answer.as_numpy("Y"), [3, -4])
        assert answer.as_numpy("MODULE").tolist() == [b"1.model"]
        client.close()


def test_a_model_in_the_servers_process_frees_its_name_when_it_unloads(
    tmp_path: Path,
) -> None:
    """In the server's own process (``isolation: thread``) two models cannot both be
    ``1.model``: the second is imported under a name of its own. The first's name is
    free again once it unloads (it stayed in ``sys.modules`` for good before)."""
    folders = []
    for name in ("first", "second"):
        version = tmp_path / name / "1"
        version.mkdir(parents=True)
        (version / "model.py").write_text(MODEL.replace("from .helpers import double", ""))
        (tmp_path / name / "config.pbtxt").write_text(CONFIG.replace("relative", name))
        folders.append(tmp_path / name)
    saved = sys.modules.pop("1.model", None)
    try:
        first, second = (load_python_backend(folder, own_process=False) for folder in folders)
        assert sys.modules["1.model"].__file__ == str(folders[0] / "1" / "model.py")
        assert "_sordino_python_model_second_1" in sys.modules
        first.unload()
        second.unload()
        assert "1.model" not in sys.modules
        assert "_sordino_python_model_second_1" not in sys.modules
        again = load_python_backend(folders[1], own_process=False)
        assert sys.modules["1.model"].__file__ == str(folders[1] / "1" / "model.py")
        again.unload()
    finally:
        sys.modules.pop("1.model", None)
        if saved is not None:
            sys.modules["1.model"] = saved
