"""``--exit-on-error`` and ``--strict-readiness`` (Triton's): a model that cannot load
at start, and the server's readiness while it is left out.

Before, any model that failed at start ended start-up (exit 2), whatever the operator
wanted: one broken model in a repository took the whole service down at its next
restart. Triton's ``--exit-on-error=false`` leaves it out, UNAVAILABLE with its error,
and serves the others; its ``--strict-readiness`` (default) then keeps
``/v2/health/ready`` false until it loads.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx

from tests.cli.conftest import sordino_start

_EXAMPLES = Path(__file__).parents[1] / "fixtures" / "triton_python_examples"
_BROKEN = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("the weights file is missing")

    def execute(self, requests):
        return []
"""
_ADD_SUB_BODY = {
    "inputs": [
        {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 1, 1, 1]},
    ]
}


def _repository(tmp_path: Path) -> Path:
    """``add_sub``, and ``broken``: add_sub's configuration with a model.py that raises."""
    root = tmp_path / "repo"
    shutil.copytree(_EXAMPLES / "add_sub", root / "add_sub")
    (root / "broken" / "1").mkdir(parents=True)
    config = (root / "add_sub" / "config.pbtxt").read_text()
    (root / "broken" / "config.pbtxt").write_text(config.replace('"add_sub"', '"broken"'))
    (root / "broken" / "1" / "model.py").write_text(_BROKEN)
    return root


def test_a_broken_model_ends_start_up_by_default(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "sordino", "start", "--no-builtin", "--model-repository",
               str(_repository(tmp_path)), "--http-port", "0", "--grpc-port", "0",
               "--data-dir", str(tmp_path / "data")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "the weights file is missing" in done.stderr


def test_with_exit_on_error_false_the_others_serve_and_ready_waits(tmp_path: Path) -> None:
    root = _repository(tmp_path)
    args = ["--no-builtin", "--model-repository", str(root), "--exit-on-error=false",
            "--model-control-mode", "explicit", "--load-model", "*"]  # fmt: skip
    with sordino_start(args, tmp_path) as running, httpx.Client(base_url=running.url) as client:
        answer = client.post("/v2/models/add_sub/infer", json=_ADD_SUB_BODY)
        assert answer.status_code == 200, answer.text
        assert client.get("/v2/models/add_sub/ready").status_code == 200
        index = {e["name"]: e for e in client.post("/v2/repository/index").json()}
        assert index["add_sub"]["state"] == "READY"
        assert index["broken"]["state"] == "UNAVAILABLE"
        assert "the weights file is missing" in index["broken"]["reason"]
        # Triton's strict readiness (the default): not ready while a model is left out.
        assert client.get("/v2/health/ready").status_code == 503
        health = client.get("/health")
        assert health.status_code == 503 and "broken" in health.json()["left_out"]
        # Mended and loaded: ready.
        (root / "broken" / "1" / "model.py").write_text(
            (root / "add_sub" / "1" / "model.py").read_text()
        )
        loaded = client.post("/v2/repository/models/broken/load", timeout=120)
        assert loaded.status_code == 200, loaded.text
        assert client.get("/v2/health/ready").status_code == 200
        assert client.post("/v2/models/broken/infer", json=_ADD_SUB_BODY).status_code == 200
    assert any("serving the others" in line for line in running.lines), running.lines
    assert not any("Traceback" in line for line in running.lines)


def test_without_strict_readiness_ready_comes_once_start_up_ends(tmp_path: Path) -> None:
    args = ["--no-builtin", "--model-repository", str(_repository(tmp_path)),
            "--exit-on-error", "false", "--strict-readiness", "false"]  # fmt: skip
    with sordino_start(args, tmp_path) as running:
        assert httpx.get(running.url + "/v2/health/ready").status_code == 200
        index = httpx.post(running.url + "/v2/repository/index").json()
        assert {e["name"]: e["state"] for e in index} == {
            "add_sub": "READY",
            "broken": "UNAVAILABLE",
        }


def _unreadable(root: Path) -> None:
    """Make ``broken``'s configuration one that does not parse (a '}' missing)."""
    (root / "broken" / "config.pbtxt").write_text(
        'backend: "python"\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ]\n'
    )


def test_a_configuration_that_does_not_parse_is_left_out_too(tmp_path: Path) -> None:
    """With --exit-on-error false, a model whose config.pbtxt does not parse is
    UNAVAILABLE with the parser's words while the others serve, as one whose load
    failed is (it ended start-up whatever the flag: the repository was read whole
    before any load)."""
    root = _repository(tmp_path)
    _unreadable(root)
    args = ["--no-builtin", "--model-repository", str(root), "--exit-on-error", "false"]
    with sordino_start(args, tmp_path) as running, httpx.Client(base_url=running.url) as client:
        assert client.post("/v2/models/add_sub/infer", json=_ADD_SUB_BODY).status_code == 200
        index = {e["name"]: e for e in client.post("/v2/repository/index").json()}
        assert index["broken"]["state"] == "UNAVAILABLE"
        assert index["broken"]["reason"].endswith("config.pbtxt: line 2: missing '}'")
        assert client.get("/v2/health/ready").status_code == 503  # strict readiness
    assert not any("Traceback" in line for line in running.lines)


def test_explicit_mode_reads_only_the_models_it_loads(tmp_path: Path) -> None:
    """Explicit model control, --load-model add_sub: a repository model not named whose
    configuration does not parse is said in one line and left out (start-up ended
    there, as if it had been asked for); its load says why. Named, it ends start-up."""
    root = _repository(tmp_path)
    _unreadable(root)
    base = ["--no-builtin", "--model-repository", str(root), "--model-control-mode", "explicit"]
    started = sordino_start([*base, "--load-model", "add_sub"], tmp_path)
    with started as running, httpx.Client(base_url=running.url) as client:
        assert client.get("/v2/health/ready").status_code == 200
        assert client.post("/v2/models/add_sub/infer", json=_ADD_SUB_BODY).status_code == 200
        refused = client.post("/v2/repository/models/broken/load")
        assert refused.status_code == 400
        assert refused.json()["error"].endswith("config.pbtxt: line 2: missing '}'")
    said = [line for line in running.lines if "model broken cannot be loaded as it is" in line]
    assert len(said) == 1 and "`sordino models load broken`" in said[0], running.lines
    command = [sys.executable, "-m", "sordino", "start", *base, "--load-model", "broken",
               "--http-port", "0", "--grpc-port", "0",
               "--data-dir", str(tmp_path / "d2")]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: --load-model broken: ")
    assert "Traceback" not in done.stderr
