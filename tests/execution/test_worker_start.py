"""How a worker process starts: forked from multiprocessing's forkserver, which imported
what every worker needs once and nothing that runs a thread, with the server's
environment as it is at the worker's start (``execution/worker_spawn.py``).

A test that needs its forkserver started at a given moment runs in a fresh interpreter
(the suite's own processes have had one since their first worker).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sordino.execution.worker_spawn import PRELOAD, WORKER_CONTEXT
from sordino.models.repository import scan_repository
from sordino.testing import serve_in_thread

MODEL = """
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        print("probe: to the server's stderr", file=sys.stderr, flush=True)
        seen = {
            "probe": os.environ.get("SORDINO_TEST_PROBE", "<absent>"),
            "gone": os.environ.get("SORDINO_TEST_GONE", "<absent>"),
            "parent": open(f"/proc/{os.getppid()}/cmdline", "rb").read().decode(),
        }
        answer = np.array([repr(seen).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", answer)]) for _ in requests]
"""

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "Y", data_type: TYPE_STRING, dims: [ 1 ] } ]
"""

SCRIPT = """
import ast, json, multiprocessing.forkserver, os, sys
from pathlib import Path
import httpx
from sordino.models.repository import scan_repository
from sordino.testing import serve_in_thread

os.environ["SORDINO_TEST_GONE"] = "set when the forkserver started"
multiprocessing.forkserver.ensure_running()  # as an earlier server's first worker would
del os.environ["SORDINO_TEST_GONE"]
os.environ["SORDINO_TEST_PROBE"] = "set after it started"
stderr = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT)
os.dup2(stderr, 2)  # the server's stderr redirected since the forkserver started
body = {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [0]}]}
with serve_in_thread(None, scan_repository(Path(sys.argv[1]))) as server:
    answer = httpx.post(f"{server.url}/v2/models/probe/infer", json=body, timeout=60)
    answer.raise_for_status()
print(json.dumps(ast.literal_eval(answer.json()["outputs"][0]["data"][0])))
"""

forkserver_only = pytest.mark.skipif(
    WORKER_CONTEXT.get_start_method() != "forkserver", reason="this platform has no forkserver"
)


def _repository(root: Path, name: str, model: str, config: str = CONFIG) -> None:
    """``root/name``: ``config.pbtxt`` and ``1/model.py``."""
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    (root / name / "1" / "model.py").write_text(model)


def _run(script: str, *args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    found: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return found


@forkserver_only
def test_a_worker_is_forked_with_the_servers_environment_as_at_its_start(tmp_path: Path) -> None:
    """A variable set after the forkserver started reaches the worker; one removed since
    does not; what the model prints goes where the server's stderr goes now: the worker
    has what a spawned process would, not the forkserver's."""
    _repository(tmp_path, "probe", MODEL)
    stderr = tmp_path / "stderr"
    seen = _run(SCRIPT, str(tmp_path), str(stderr))
    assert seen["probe"] == "set after it started"
    assert seen["gone"] == "<absent>"
    assert "multiprocessing.forkserver" in str(seen["parent"])  # forked, not spawned
    assert "probe: to the server's stderr" in stderr.read_text()


def test_the_forkserver_preloads_no_model_runtime_and_starts_no_thread() -> None:
    """Forking is safe only from a process whose threads hold no lock: the preloaded
    modules start no Python thread and import no model runtime (ONNX Runtime starts a
    thread at import; each worker imports it after the fork)."""
    script = f"""
        import json, sys, threading
        for name in {PRELOAD!r}:
            __import__(name)
        runtimes = [m for m in ("onnxruntime", "torch", "tensorflow", "grpc") if m in sys.modules]
        print(json.dumps({{"threads": threading.active_count(), "runtimes": runtimes}}))
    """
    seen = _run(script)
    assert seen == {"threads": 1, "runtimes": []}


DRAWS = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(args["model_repository"], "draws"), "a") as draws:
            draws.write(f"{np.random.randint(2**62)}\\n")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
"""


DRAWING = """
import sys
from pathlib import Path
from sordino.execution.worker_spawn import PRELOAD, WORKER_CONTEXT
from sordino.models.repository import scan_repository
from sordino.testing import serve_in_thread

# numpy 1.x imports numpy.random with numpy (2.x on first use): the forkserver then has
# one global random state that every worker forked from it would share.
WORKER_CONTEXT.set_forkserver_preload([*PRELOAD, "numpy.random"])
with serve_in_thread(None, scan_repository(Path(sys.argv[1]))):
    pass
print("{}")
"""


@forkserver_only
def test_each_worker_draws_its_own_numpy_random_numbers(tmp_path: Path) -> None:
    """Forked from one forkserver that has numpy.random, a model's instances would share
    numpy's global random state; each worker draws it afresh, as a spawned one did."""
    instances = "instance_group [ { count: 3, kind: KIND_CPU } ]\n"
    _repository(tmp_path, "draws", DRAWS, CONFIG + instances)
    _run(DRAWING, str(tmp_path))
    draws = (tmp_path / "draws" / "draws").read_text().split()
    assert len(draws) == 3 and len(set(draws)) == 3, draws


ENDING = """
import atexit
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "ending")
        atexit.register(self._write, "atexit")

    def _write(self, what):
        with open(self.log, "a") as log:
            log.write(what + "\\n")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]

    def finalize(self):
        self._write("finalize")
"""


def test_a_models_atexit_handlers_run_when_its_worker_stops(tmp_path: Path) -> None:
    """A spawned worker ran them at interpreter exit; a forked one is ended with
    ``os._exit`` by multiprocessing, so the worker runs them itself, after ``finalize``."""
    _repository(tmp_path, "ending", ENDING)
    with serve_in_thread(None, scan_repository(tmp_path)):
        pass
    assert (tmp_path / "ending" / "ending").read_text().split() == ["finalize", "atexit"]
