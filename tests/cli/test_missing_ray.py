"""``--executor ray`` without the ``ray`` package: one line naming the extra, no traceback.

Runs wherever ray is installed or not: the child process makes ``import ray`` fail
(``sys.modules["ray"] = None``), as if it were not installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

WITHOUT_RAY = (
    "import sys; sys.modules['ray'] = None; sys.argv = ['sordino', *sys.argv[1:]]; "
    "from sordino.cli.main import main; main()"
)


def test_executor_ray_without_ray_names_the_extra(tmp_path: Path) -> None:
    args = ["start", "--executor", "ray", "--http-port", "0", "--data-dir", str(tmp_path)]
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "pip install 'sordino[ray]'" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") <= 3, result.stderr
