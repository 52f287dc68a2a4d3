"""A Python model that starts processes of its own — a ``multiprocessing`` pool (fork,
spawn or forkserver), as a data loader's workers or a preprocessing pool do. Triton's
stub allows it; a sordino worker was a daemonic process, which multiprocessing refuses
children ("daemonic processes are not allowed to have children"), so such a model
could not load. Its processes end with the worker: stopped (the model's ``finalize``,
or multiprocessing's exit hook), or killed (they are killed with it)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient

from sordino.backends.python import backend
from sordino.backends.python.model_dir import import_model
from sordino.config import RuntimeConfig, load_config
from sordino.models.repository import scan_repository
from sordino.testing import RunningServer, serve_in_thread
from tests.waiting import wait_for

MODEL = """
import multiprocessing
import subprocess
import sys
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def square(x):
    return x * x


class TritonPythonModel:
    def initialize(self, args):
        self.pools = [
            multiprocessing.get_context(method).Pool(1)
            for method in ("fork", "spawn", "forkserver")
        ]
        # processes of its own, ended by terminate() (SIGTERM)
        self.sleepers = [
            multiprocessing.get_context(method).Process(
                target=time.sleep, args=(600,), daemon=True
            )
            for method in ("fork", "spawn", "forkserver")
        ]
        for sleeper in self.sleepers:
            sleeper.start()
        # a helper program, which, unlike a pool's processes, does not notice its
        # parent's end by itself
        self.helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            answers = [pool.map(square, x.ravel().tolist()) for pool in self.pools]
            assert answers[0] == answers[1] == answers[2], answers
            y = np.array(answers[0], np.float32).reshape(x.shape)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return responses

FINALIZE
"""

FINALIZE = """
    def finalize(self):
        for pool in self.pools:
            pool.terminate()
        for sleeper in self.sleepers:
            sleeper.terminate()
            sleeper.join()
        self.helper.kill()
"""

CONFIG = """
name: "pools"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def _repository(root: Path, finalize: bool) -> Path:
    (root / "pools" / "1").mkdir(parents=True)
    model = MODEL.replace("FINALIZE", FINALIZE if finalize else "")
    (root / "pools" / "1" / "model.py").write_text(model)
    (root / "pools" / "config.pbtxt").write_text(CONFIG)
    return root


def _answer(server: RunningServer) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    x = httpclient.InferInput("X", [1, 2], "FP32")
    x.set_data_from_numpy(np.array([[3, 4]], np.float32))
    try:
        return client.infer("pools", [x]).as_numpy("Y")
    finally:
        client.close()


def _pid(server: RunningServer) -> int | None:
    stats = server.runtime.executor.statistics()
    return next(w.pid for w in stats.workers if w.model == "pools")


def _worker(server: RunningServer) -> psutil.Process:
    pid = _pid(server)
    assert pid is not None
    return psutil.Process(pid)


def _gone(processes: list[psutil.Process]) -> bool:
    return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes)


def test_a_models_pools_serve_and_end_when_it_stops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With and without a finalize that ends them, the model's processes end with the
    server, and the worker on its own. terminate() sends SIGTERM, which they must not
    inherit ignored from the worker (the worker would wait for them until the server
    killed it); without a finalize, multiprocessing's exit hook terminates the pools
    and the daemonic processes, and what is left of the worker's process group (the
    helper) is killed once the worker has exited."""
    caplog.set_level(logging.WARNING, logger="sordino.workers")
    for finalize in (True, False):
        root = _repository(tmp_path / str(finalize), finalize)
        with serve_in_thread(RuntimeConfig(), scan_repository(root)) as server:
            np.testing.assert_array_equal(_answer(server), [[9, 16]])
            started = _worker(server).children(recursive=True)
            assert len(started) >= 7  # a pool's, a sleeper's per method, forkserver, helper
        wait_for(lambda started=started: _gone(started), "the model's processes to end")
        assert "did not end within" not in caplog.text, finalize


def test_a_killed_workers_pools_are_killed_with_it(tmp_path: Path) -> None:
    """Killed by the server (a hung worker that stopped sending heartbeats), or from outside
    (a crash, the kernel's OOM killer): the pools' processes go with the worker, and its
    replacement starts its own. A worker leads a process group of its own, which its
    model's processes join: a dead worker's children are handed to init, where nothing
    would find them."""
    config = load_config(None, {"workers.heartbeat_timeout": 1})
    with serve_in_thread(config, scan_repository(_repository(tmp_path, True))) as server:
        np.testing.assert_array_equal(_answer(server), [[9, 16]])
        for kill in ("from outside", "by the server"):
            worker = _worker(server)
            started = worker.children(recursive=True)
            assert started and all(os.getpgid(p.pid) == worker.pid for p in started)
            if kill == "from outside":
                worker.kill()
            else:  # stopped: its heartbeats stop, and the server kills it
                os.kill(worker.pid, signal.SIGSTOP)
            wait_for(lambda w=worker: _pid(server) not in (None, w.pid), "the worker's restart")
            wait_for(lambda s=started: _gone(s), f"the processes of a worker killed {kill} to end")
            np.testing.assert_array_equal(_answer(server), [[9, 16]])


def test_a_pool_finds_the_models_module_ahead_of_another_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another model's folder may be on ``sys.path`` before this one's (a Python model
    the server runs in its own process, ``isolation: thread``, puts its folder there, and
    a forkserver started afterwards passes it on to every worker): a spawned process
    must still import this model's ``1.model``, not the other's. In a full run of the
    suite, a worker's spawn pool found another test's model ("Can't get attribute
    'square' on <module '1.model' from '…/bls_sync_thread/1/model.py'>")."""
    decoy = tmp_path / "other_model"
    (decoy / "1").mkdir(parents=True)
    (decoy / "1" / "model.py").write_text("# another model, without square\n")
    ours = _repository(tmp_path / "ours", finalize=False) / "pools" / "1" / "model.py"
    monkeypatch.setattr(sys, "path", [*sys.path, str(decoy)])
    saved = {name: sys.modules.pop(name) for name in ("1", "1.model") if name in sys.modules}
    try:
        backend._utils()  # what a worker has: triton_python_backend_utils importable
        module = import_model("_sordino_test_pools", "pools", ours, "model pools")
        assert module.__name__ == "1.model"
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            assert pool.map_async(module.square, [3]).get(timeout=60) == [9]
    finally:
        for name in ("1", "1.model"):
            sys.modules.pop(name, None)
        sys.modules.update(saved)
