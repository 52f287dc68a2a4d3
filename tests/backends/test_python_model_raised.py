"""A Python model's own exception is told with what a user needs to fix it: an
``OSError``'s file name (``repr`` drops it) and the line of the model's code that
raised it, as Triton's ``At:`` list gives it — at load (import, ``initialize``) and in
``execute``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sordino.backends.base import BackendOptions
from sordino.backends.python.backend import PythonBackend, PythonModelError
from sordino.backends.python.raised import raised
from sordino.errors import ModelLoadError
from sordino.inference import RequestFacts

CONFIG = """
backend: "python"
max_batch_size: 4
input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""

HELPER = """
def weights(path):
    with open(path, "rb") as f:
        return f.read()


def check(x):
    if x[0, 0] == 1:
        raise ValueError("one is not welcome")
"""

MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

import HELPER_NAME as helper


class TritonPythonModel:
    def initialize(self, args):
        if args["model_name"] == "broken":
            helper.weights("/nonexistent/weights.bin")

    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
        helper.check(x)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]) for _ in requests]
"""


def _model(root: Path, name: str) -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(CONFIG)
    # A module name of its own for each model: a second "helper" would be the first's.
    (root / name / "1" / f"helper_{name}.py").write_text(HELPER)
    (root / name / "1" / "model.py").write_text(MODEL.replace("HELPER_NAME", f"helper_{name}"))
    return root / name / "1" / "model.py"


def test_initialize_failing_names_the_file_and_the_line(tmp_path: Path) -> None:
    backend = PythonBackend(BackendOptions(name="broken", version="1"))
    with pytest.raises(ModelLoadError) as caught:
        backend.load(_model(tmp_path, "broken"))
    # Before: initialize raised FileNotFoundError(2, 'No such file or directory')
    assert str(caught.value) == (
        'model broken: initialize raised FileNotFoundError("[Errno 2] No such file or '
        "directory: '/nonexistent/weights.bin'\") at 1/helper_broken.py:3 in weights"
    )


def test_execute_failing_names_the_line(tmp_path: Path) -> None:
    backend = PythonBackend(BackendOptions(name="fine", version="1"))
    backend.load(_model(tmp_path, "fine"))
    try:
        batch = {"X": np.array([[1]], np.int32)}
        with pytest.raises(PythonModelError) as caught:
            backend.infer_requests(batch, [1], [RequestFacts()], lambda index: False)
        assert str(caught.value) == (
            "model fine: execute raised ValueError('one is not welcome') at "
            "1/helper_fine.py:9 in check"
        )
    finally:
        backend.unload()


def test_an_import_error_names_the_line(tmp_path: Path) -> None:
    path = _model(tmp_path, "imports")
    path.write_text("import numpy\n\nvalue = 1 / 0\n")
    with pytest.raises(ModelLoadError, match=r"ZeroDivisionError\('division by zero'\) at "
                       r"1/model.py:3 in <module>$"):  # fmt: skip
        PythonBackend(BackendOptions(name="imports", version="1")).load(path)


def test_raised_outside_the_folder_is_told_as_before(tmp_path: Path) -> None:
    try:
        int("x")
    except ValueError as exc:
        assert raised(exc, tmp_path) == repr(exc)
