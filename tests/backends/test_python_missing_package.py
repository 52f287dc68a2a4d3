"""A Python model that imports a package the server's environment lacks (a PyTorch
model on a plain install): the load fails with what to do about it, said once however
many instances gave the same error."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from sordino.config import RuntimeConfig
from sordino.errors import ModelLoadError
from sordino.models.repository import scan_repository
from sordino.testing import serve_in_thread

CONFIG = """
name: "needs_a_package"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
"""


def test_a_missing_package_is_named_with_where_to_install_it(tmp_path: Path) -> None:
    """Before: "cpu: …ModuleNotFoundError(…); cpu: …ModuleNotFoundError(…)", the same line
    for each instance and nothing on what to do."""
    (tmp_path / "needs_a_package" / "1").mkdir(parents=True)
    (tmp_path / "needs_a_package" / "1" / "model.py").write_text(
        "import sordino_absent_package.nn\n\nclass TritonPythonModel:\n    pass\n"
    )
    (tmp_path / "needs_a_package" / "config.pbtxt").write_text(CONFIG)
    with (
        pytest.raises(ModelLoadError) as raised,
        serve_in_thread(RuntimeConfig(), scan_repository(tmp_path)),
    ):
        pass
    message = str(raised.value)
    assert "No module named 'sordino_absent_package'" in message
    where = f"into the Python environment sordino runs from ({sys.executable} -m pip install"
    assert f"install 'sordino_absent_package' {where}" in message
    assert "EXECUTION_ENV_PATH" in message
    assert message.count("No module named") == 1
    assert re.search(r"\(2 instances\)$", message)
