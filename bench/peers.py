"""The reference servers of ``bench_triton``: NVIDIA Triton (Python backend) and Mosec.

Each peer lives in its own virtual environment under ``bench/.peers/`` (git-ignored),
created on first use with the pinned packages, so nothing of the peers reaches the
project's environment. The servers run as plain child processes on free loopback
ports, and every way their set-up can fail ends in :class:`PeerError` with one line
saying what failed (the benchmark prints it and exits 2).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PEERS = Path(__file__).parent / ".peers"
TRITON_PACKAGES = ("nvidia-pytriton==0.7.0", "onnxruntime", "numpy<2")
MOSEC_PACKAGES = ("mosec", "onnxruntime", "numpy")
ORT_THREADS = 2  # the peers' intra-op threads, as in bench_workloads


class PeerError(RuntimeError):
    """A peer could not be installed or started; the message says what and where."""


@dataclass(frozen=True)
class Batching:
    """One Triton model: its name, dynamic-batching settings and whether its ONNX Runtime
    session's intra-op threads spin while waiting for work (``True``: ONNX Runtime's
    default, which burns a core between batches on a busy 2-core machine)."""

    name: str
    max_batch: int = 32
    preferred: int = 32
    delay_us: int = 10_000
    spinning: bool = True


def triton_config(
    model: Batching, onnx_path: Path, input_name: str, output_name: str, width: int
) -> str:
    """The ``config.pbtxt`` of a Python-backend model serving the W1 MLP on the CPU."""
    return (
        f'name: "{model.name}"\n'
        'backend: "python"\n'
        f"max_batch_size: {model.max_batch}\n"
        f'input [ {{ name: "{input_name}" data_type: TYPE_FP32 dims: [ {width} ] }} ]\n'
        f'output [ {{ name: "{output_name}" data_type: TYPE_FP32 dims: [ {width} ] }} ]\n'
        "dynamic_batching {\n"
        f"  preferred_batch_size: [ {model.preferred} ]\n"
        f"  max_queue_delay_microseconds: {model.delay_us}\n"
        "}\n"
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        f'parameters: {{ key: "onnx_path" value: {{ string_value: "{onnx_path}" }} }}\n'
        'parameters: { key: "allow_spinning" value: { string_value: '
        f'"{int(model.spinning)}" }} }}\n'
    )


TRITON_MODEL_PY = f'''\
"""W1 in Triton's Python backend: one ONNX Runtime session, the batch run at once."""

import json

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        path = config["parameters"]["onnx_path"]["string_value"]
        self.input = config["input"][0]["name"]
        self.output = config["output"][0]["name"]
        options = ort.SessionOptions()
        options.intra_op_num_threads = {ORT_THREADS}
        spinning = config["parameters"].get("allow_spinning", {{}}).get("string_value", "1")
        options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, self.input).as_numpy() for r in requests]
        y = self.session.run(None, {{self.input: np.concatenate(arrays)}})[0]
        responses, start = [], 0
        for a in arrays:
            part = y[start : start + len(a)]
            start += len(a)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(self.output, part)]))
        return responses
'''


def write_triton_repository(
    directory: Path,
    models: list[Batching],
    onnx_path: Path,
    input_name: str = "x",
    output_name: str = "y",
    width: int = 256,
) -> Path:
    """Write a Triton model repository with one Python-backend copy of W1 per entry."""
    for model in models:
        version = directory / model.name / "1"
        version.mkdir(parents=True, exist_ok=True)
        (version / "model.py").write_text(TRITON_MODEL_PY)
        config = triton_config(model, onnx_path, input_name, output_name, width)
        (directory / model.name / "config.pbtxt").write_text(config)
    return directory


MOSEC_SERVER_PY = f'''\
"""W1 behind Mosec: raw float32 rows in and out, dynamic batching up to 32."""

import os

import numpy as np
import onnxruntime as ort
from mosec import Server, Worker


class W1(Worker):
    def __init__(self):
        super().__init__()
        options = ort.SessionOptions()
        options.intra_op_num_threads = {ORT_THREADS}
        self.session = ort.InferenceSession(
            os.environ["W1_MODEL"], options, providers=["CPUExecutionProvider"]
        )

    def deserialize(self, data):
        return np.frombuffer(data, dtype=np.float32)

    def serialize(self, data):
        return data.tobytes()

    def forward(self, data):
        return list(self.session.run(None, {{"x": np.stack(data)}})[0])


if __name__ == "__main__":
    server = Server()
    server.append_worker(W1, num=1, max_batch_size=32, max_wait_time=10)
    server.run()
'''


def ensure_venv(name: str, packages: tuple[str, ...], probe: str) -> Path:
    """The side environment ``bench/.peers/NAME`` with ``packages``; return its python.

    ``probe`` is a statement that must run in it (an import) for the environment to count
    as installed; an environment that fails it is installed again.
    """
    venv = PEERS / name
    python = venv / "bin" / "python"
    if python.exists() and _runs(python, probe):
        return python
    PEERS.mkdir(parents=True, exist_ok=True)
    log = PEERS / f"{name}-install.log"
    with log.open("w") as out:
        steps = [[sys.executable, "-m", "venv", "--clear", str(venv)],
                 [str(python), "-m", "pip", "install", "--quiet", *packages]]  # fmt: skip
        for step in steps:
            if subprocess.run(step, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise PeerError(f"installing {name} ({' '.join(packages)}) failed; see {log}")
    if not _runs(python, probe):
        raise PeerError(f"{name} installed but `{probe}` fails in {venv}; see {log}")
    return python


def _runs(python: Path, statement: str) -> bool:
    done = subprocess.run([str(python), "-c", statement], capture_output=True)
    return done.returncode == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Server:
    """A running peer: where it listens and its process (the root of its tree)."""

    name: str
    http: str
    grpc: str | None
    metrics: str | None
    pid: int


def _wait_ready(
    proc: subprocess.Popen[bytes], url: str, what: str, log: Path, timeout: float = 90.0
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise PeerError(f"{what} exited with {proc.returncode} at start: {tail[0]} ({log})")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise PeerError(f"{what} was not ready within {timeout:.0f} s; see {log}")


@contextmanager
def _process(
    cmd: list[str], env: dict[str, str], log: Path, cwd: Path
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)  # fmt: skip
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def triton_layout(python: Path) -> tuple[Path, Path, Path]:
    """(tritonserver, the Python backend stub for ``python``'s version, the bundled libs)."""
    found = subprocess.run(
        [str(python), "-c", "import pytriton, sys; print(pytriton.__path__[0]);"
         "print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
        capture_output=True, text=True,
    )  # fmt: skip
    if found.returncode != 0:
        raise PeerError(f"pytriton does not import in {python}: {found.stderr.strip()[-200:]}")
    package, version = found.stdout.split()
    dist = Path(package) / "tritonserver"
    binary, stub = dist / "bin" / "tritonserver", dist / "python_backend_stubs" / version
    libs = Path(package).parent / "nvidia_pytriton.libs"
    for path in (binary, stub / "triton_python_backend_stub", libs):
        if not path.exists():
            raise PeerError(f"the nvidia-pytriton wheel has no {path}")
    return binary, stub / "triton_python_backend_stub", libs


@contextmanager
def triton_server(python: Path, onnx_path: Path, models: list[Batching]) -> Iterator[Server]:
    """``tritonserver`` from the pytriton wheel on a fresh repository of ``models``."""
    with tempfile.TemporaryDirectory(prefix="bench-triton-models-") as scratch:
        repository = write_triton_repository(Path(scratch) / "models", models, onnx_path)
        with triton_on(python, repository) as server:
            yield server


@contextmanager
def triton_on(python: Path, repository: Path, args: Sequence[str] = ()) -> Iterator[Server]:
    """``tritonserver`` from the pytriton wheel serving the model repository ``repository``
    (``args``: more of its flags, ``--model-control-mode=explicit`` say)."""
    binary, stub, libs = triton_layout(python)
    with tempfile.TemporaryDirectory(prefix="bench-triton-") as scratch:
        root = Path(scratch)
        backends = root / "backends"
        shutil.copytree(binary.parent.parent / "backends", backends)
        shutil.copy(stub, backends / "python" / "triton_python_backend_stub")
        # The stub embeds libpython: take the one of the interpreter whose standard
        # library it loads (the side venv's base), and that venv's numpy via PATH.
        libdir = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"],
            capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        env = {**os.environ,
               "LD_LIBRARY_PATH": ":".join(p for p in (str(libs), libdir,
                                                         os.environ.get("LD_LIBRARY_PATH"))
                                           if p),
               "PATH": f"{python.parent}:{os.environ['PATH']}"}  # fmt: skip
        env.pop("PYTHONPATH", None)
        http, grpc, metrics = free_port(), free_port(), free_port()
        cmd = [str(binary), f"--model-repository={repository}",
               f"--backend-directory={backends}",
               f"--cache-directory={binary.parent.parent / 'caches'}",
               f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}",
               "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
               "--allow-gpu-metrics=false", "--allow-cpu-metrics=false",
               "--strict-readiness=true", "--log-verbose=0", *args]  # fmt: skip
        log = PEERS / "triton-server.log"
        with _process(cmd, env, log, root) as proc:
            _wait_ready(proc, f"http://127.0.0.1:{http}/v2/health/ready", "tritonserver", log)
            yield Server("triton", f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc}",
                         f"http://127.0.0.1:{metrics}/metrics", proc.pid)  # fmt: skip


@contextmanager
def mosec_server(python: Path, onnx_path: Path) -> Iterator[Server]:
    """A Mosec server with one W1 worker (dynamic batching up to 32, 10 ms wait)."""
    with tempfile.TemporaryDirectory(prefix="bench-mosec-") as scratch:
        root = Path(scratch)
        (root / "server.py").write_text(MOSEC_SERVER_PY)
        port = free_port()
        env = {**os.environ, "W1_MODEL": str(onnx_path)}
        env.pop("PYTHONPATH", None)
        cmd = [str(python), "server.py", "--address", "127.0.0.1", "--port", str(port)]
        log = PEERS / "mosec-server.log"
        with _process(cmd, env, log, root) as proc:
            _wait_ready(proc, f"http://127.0.0.1:{port}/", "mosec", log)
            url = f"http://127.0.0.1:{port}"
            yield Server("mosec", url, None, f"{url}/metrics", proc.pid)


PERF_ANALYZER_WHEEL = "tritonclient==2.41.0"  # the last wheels that carried bin/perf_analyzer


def ensure_perf_analyzer(triton_python: Path) -> tuple[Path, Path]:
    """perf_analyzer (C++) from the tritonclient 2.41.0 wheel; return (binary, its libs).

    The binary needs ``libb64.so.0d`` and ``libcudart.so.12``; the nvidia-pytriton
    wheel carries both under hashed names, so two links in a private folder do.
    """
    import zipfile

    home = PEERS / "perf_analyzer"
    binary, libs = home / "perf_analyzer", home / "libs"
    if not binary.exists():
        home.mkdir(parents=True, exist_ok=True)
        log = PEERS / "perf_analyzer-install.log"
        with log.open("w") as out:
            got = subprocess.run(
                [str(triton_python), "-m", "pip", "download", "--no-deps", "-d", str(home),
                 PERF_ANALYZER_WHEEL], stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        wheels = sorted(home.glob("tritonclient-2.41.0-*.whl"))
        if got.returncode != 0 or not wheels:
            raise PeerError(f"downloading {PERF_ANALYZER_WHEEL} failed; see {log}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next((n for n in wheel.namelist() if n.endswith("bin/perf_analyzer")), None)
            if member is None:
                raise PeerError(f"{wheels[0].name} has no bin/perf_analyzer")
            binary.write_bytes(wheel.read(member))
        binary.chmod(0o755)
    _, _, bundled = triton_layout(triton_python)
    libs.mkdir(exist_ok=True)
    for link, pattern in (("libb64.so.0d", "libb64-*.so.0d"), ("libcudart.so.12", "libcudart-*")):
        found = sorted(bundled.glob(pattern))
        if not found:
            raise PeerError(f"{bundled} has no {pattern} for perf_analyzer")
        (libs / link).unlink(missing_ok=True)
        (libs / link).symlink_to(found[0])
    return binary, libs
