"""``sordino start`` as a user runs it: a real process, real signals, real files."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from importlib import resources
from pathlib import Path

import httpx
import psutil
import pytest

from tests.cli.conftest import DIGITS, ONE_MODEL, sordino_start

BUILTIN = Path(str(resources.files("sordino.models.builtin")))
PIXELS = {"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [2.0] * 64}


def test_start_serves_builtins_and_stops_on_sigterm(tmp_path: Path) -> None:
    with sordino_start([], tmp_path) as server:
        loaded = [line for line in server.lines if line.startswith("loaded ")]
        assert len(loaded) == 5
        # The batch cap (scheduler max_batch) and the request limit (max_batch_size) differ.
        digits = next(line for line in loaded if "digits-classifier" in line)
        assert "batch ≤32, ≤64 items per request, mode " in digits
        r = httpx.post(f"{server.url}/v2/models/digits-classifier/infer", json={"inputs": [PIXELS]})
        assert r.status_code == 200
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == 0
    assert (tmp_path / "data").is_dir()


def test_start_stops_on_ctrl_c(tmp_path: Path) -> None:
    with sordino_start(ONE_MODEL, tmp_path) as server:
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(timeout=60) == 0


def test_ctrl_c_to_the_process_group_stops_workers_quietly(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches the workers too; only the server decides they stop."""
    with sordino_start([], tmp_path, new_session=True) as server:
        os.killpg(server.process.pid, signal.SIGINT)
        assert server.process.wait(timeout=60) == 0
    output = "\n".join(server.lines)
    assert "stopped" in output
    assert "restarting" not in output and "killed by" not in output


def test_sigterm_during_load_answers_every_request(tmp_path: Path) -> None:
    with sordino_start(DIGITS, tmp_path) as server:
        statuses: list[int] = []
        failures: list[str] = []

        def client() -> None:
            with httpx.Client(timeout=30) as c:
                for _ in range(40):
                    try:
                        r = c.post(f"{server.url}/v2/models/digits-classifier/infer",
                                   json={"inputs": [PIXELS]})  # fmt: skip
                    except httpx.ConnectError:
                        return  # the server stopped listening: nothing was accepted
                    except httpx.HTTPError as exc:  # a request accepted and then dropped
                        failures.append(repr(exc))
                        return
                    statuses.append(r.status_code)
                    if r.status_code != 200:
                        assert r.json()["error"]

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        while len(statuses) < 20:
            threading.Event().wait(0.01)
        server.process.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=60)
        assert server.process.wait(timeout=60) == 0
    assert not failures
    assert set(statuses) <= {200, 503}


def test_model_flag_with_name(tmp_path: Path) -> None:
    model = tmp_path / "adder.onnx"
    shutil.copy(BUILTIN / "simple.onnx", model)
    with sordino_start(["--model", f"calc={model}", "--model", str(model)], tmp_path) as server:
        index = {m: httpx.get(f"{server.url}/v2/models/{m}").status_code for m in ("calc", "adder")}
        assert index == {"calc": 200, "adder": 200}
        assert httpx.get(f"{server.url}/v2/models/digits-classifier").status_code == 404


def test_model_repository_with_versions_and_config(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for version in ("1", "2"):
        (repo / "digits" / version).mkdir(parents=True)
        shutil.copy(BUILTIN / "digits-classifier.onnx", repo / "digits" / version / "model.onnx")
    (repo / "digits" / "config.yaml").write_text(
        "max_batch_size: 8\nversion_policy: {all: {}}\ndynamic_batching:\n"
        "  max_queue_delay_microseconds: 2000\n"
    )
    (repo / "text").mkdir()
    shutil.copy(BUILTIN / "text-normalizer.onnx", repo / "text" / "model.onnx")
    with sordino_start(["--model-repository", str(repo)], tmp_path) as server:
        meta = httpx.get(f"{server.url}/v2/models/digits").json()
        assert meta["versions"] == ["1", "2"]
        config = httpx.get(f"{server.url}/v2/models/digits/versions/1/config").json()
        assert config["max_batch_size"] == 8
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
        r = httpx.post(f"{server.url}/v2/models/digits/versions/2/infer", json={"inputs": [PIXELS]})
        assert r.json()["model_version"] == "2"
        assert httpx.get(f"{server.url}/v2/models/text/ready").status_code == 200


def test_config_file_sets_mode_and_priorities(tmp_path: Path) -> None:
    config = tmp_path / "runtime_config.yaml"
    config.write_text(
        "scheduler:\n"
        '  mode: "manual"\n'
        "  strategies:\n"
        '    - name: "dynamic_batching"\n'
        "      max_batch: 4\n"
        "      timeout_ms: 5\n"
        '    - name: "stream_priority"\n'
        "      rules:\n"
        '        - tag: "premium_user" → priority: "high"\n'
    )
    with sordino_start(["--config", str(config), *DIGITS], tmp_path) as server:
        cfg = httpx.get(f"{server.url}/v2/models/digits-classifier/config").json()
        assert cfg["parameters"]["sordino_mode"]["string_value"] == "manual"
        assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 5000
        body = {"inputs": [PIXELS], "parameters": {"tag": "premium_user"}}
        r = httpx.post(f"{server.url}/v2/models/digits-classifier/infer", json=body)
        assert r.status_code == 200


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("scheduler:\n  strategy: []\n", "did you mean 'strategies'"),
        ("scheduler:\n  strategies:\n    - {name: dynamic_batching, min_batch: 8, max_batch: 2}\n",
         "min_batch"),
        ("server:\n  max_request_size: lots\n", "max_request_size"),
    ],
)  # fmt: skip
def test_bad_config_stops_startup_with_clear_error(
    tmp_path: Path, content: str, needle: str
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(content)
    result = subprocess.run(
        [sys.executable, "-m", "sordino", "start", "--config", str(config), "--http-port", "0",
         "--grpc-port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert needle in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_model_file_is_clear(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sordino", "start", "--model", str(tmp_path / "nope.onnx"),
         "--http-port", "0", "--grpc-port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "does not exist" in result.stderr


def test_port_in_use_is_clear(tmp_path: Path) -> None:
    with sordino_start(ONE_MODEL, tmp_path) as server:
        port = server.url.rsplit(":", 1)[1]
        result = subprocess.run(
            [sys.executable, "-m", "sordino", "start", "--http-port", port, "--grpc-port", "0",
             "--data-dir", str(tmp_path / "d2")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == 2
    assert "cannot listen" in result.stderr


def _popen(args: list[str], *, new_session: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sordino", "start", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=new_session,
    )  # fmt: skip


def _read_until(process: subprocess.Popen[str], needle: str, lines: list[str]) -> None:
    """Read output lines into ``lines`` until one contains ``needle`` (fail at the end)."""
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line.rstrip("\n"))
        if needle in line:
            return
    raise AssertionError(f"sordino start ended before {needle!r}:\n" + "\n".join(lines))


def _worker_side(pid: int) -> set[int]:
    """The processes ``pid`` started for its models: the forkserver (multiprocessing's,
    which imports for the workers) and the workers it forked, or ``spawn_main`` children
    where there is no forkserver; not its resource tracker."""
    found = set()
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # it ended meanwhile
            command = " ".join(child.cmdline())
            if "multiprocessing.forkserver" in command or "spawn_main" in command:
                found.add(child.pid)
    return found


def test_ctrl_c_during_start_up_says_interrupted_and_exits_130(tmp_path: Path) -> None:
    """Ctrl-C to the whole process group while models load: one line, status 130."""
    process = _popen(
        ["--http-port", "0", "--grpc-port", "0", "--data-dir", str(tmp_path)], new_session=True
    )
    lines: list[str] = []
    try:
        # The models' workers start together; Ctrl-C comes as soon as the forkserver
        # exists, in its interpreter's start-up and imports, before any model is served.
        _read_until(process, "journal at", lines)
        deadline = time.monotonic() + 60
        while not _worker_side(process.pid):
            if time.monotonic() > deadline:
                raise AssertionError("no model's worker was started within 60 s")
            threading.Event().wait(0.005)
        os.killpg(process.pid, signal.SIGINT)
        rest, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    output = "\n".join(lines) + "\n" + rest
    assert process.returncode == 130, output
    assert rest.splitlines()[-1] == "interrupted", output
    assert "listening on" not in output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output
    assert "could not start" not in output and "SIGINT" not in output
    for _ in range(200):  # the workers went with the server
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        threading.Event().wait(0.05)
    else:
        raise AssertionError("a worker outlived the interrupted start-up")


def test_http_port_0_alone_takes_a_free_grpc_port_too(tmp_path: Path) -> None:
    """A second server needs no --grpc-port: 8001 may be taken (here it is, by us or another)."""
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 8001))
        holder.listen()
    except OSError:
        pass  # 8001 is taken already, which is the case under test
    simple = BUILTIN / "simple.onnx"
    process = _popen(["--http-port", "0", "--model", str(simple), "--data-dir", str(tmp_path)])
    lines: list[str] = []
    try:
        _read_until(process, "grpc://", lines)
        port = int(re.search(r"grpc://127\.0\.0\.1:(\d+)", lines[-1]).group(1))  # type: ignore[union-attr]
        assert port not in (0, 8001)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        holder.close()
        if process.poll() is None:
            process.kill()


def test_a_taken_grpc_port_is_named_before_any_model_loads(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "sordino", "start", "--http-port", "0", "--grpc-port",
             str(port), "--data-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: cannot listen for gRPC on 127.0.0.1:{port}: Address already in use; pick "
        "another port with --grpc-port (0 picks a free one)"
    )
    assert "loaded" not in result.stdout and "Failed to add port" not in result.stderr


def test_a_second_server_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    """Two servers writing one journal would mix their series in diagnose."""
    with sordino_start(ONE_MODEL, tmp_path) as first:
        result = subprocess.run(
            [sys.executable, "-m", "sordino", "start", "--http-port", "0", "--grpc-port", "0",
             "--data-dir", str(tmp_path / "data")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert httpx.get(f"{first.url}/v2/health/ready").status_code == 200
    assert result.returncode == 2
    assert "in use by another sordino server" in result.stderr
    assert "--data-dir" in result.stderr and "Traceback" not in result.stderr
    assert "loaded" not in result.stdout


@pytest.mark.parametrize("where", ["data dir", "journal"])
def test_a_data_dir_that_cannot_be_written_says_what_to_do(tmp_path: Path, where: str) -> None:
    """A data dir that cannot be made, or a journal that cannot be written in it (a full
    disk, a read-only mount) answered "error: [Errno 28] No space left on device" and
    nothing else. Here a file stands where the folder would go (what a root test can make
    fail for real)."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder", encoding="utf-8")
    data_dir = tmp_path / "data"
    if where == "data dir":
        data_dir = blocker / "data"
    else:  # the journal's lock file cannot be opened: a folder has its name
        (data_dir / "journal.sqlite3.lock").mkdir(parents=True)
    result = subprocess.run(
        [sys.executable, "-m", "sordino", "start", "--http-port", "0", "--data-dir",
         str(data_dir)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "loaded" not in result.stdout
    if where == "data dir":
        assert result.stderr.strip() == (
            f"error: the data dir {data_dir} cannot be made (Not a directory): give "
            "--data-dir (server.data_dir) a folder this user can write"
        )
    else:
        assert result.stderr.strip() == (
            f"error: the journal {data_dir / 'journal.sqlite3'} cannot be written (Is a "
            "directory): free room on its disk, give --data-dir a writable folder, or run "
            "without a journal (telemetry.journal: false)"
        )


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_tls_urls_say_so_for_both_ports(tmp_path: Path) -> None:
    """Issue 27: with TLS the HTTP URL read https:// but the gRPC one plain grpc://."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    config = tmp_path / "tls.yaml"
    config.write_text(f"server:\n  tls: {{cert: {cert}, key: {key}}}\n", encoding="utf-8")
    process = _popen(
        ["--config", str(config), "--http-port", "0", "--grpc-port", "0",
         "--model", str(BUILTIN / "simple.onnx"), "--data-dir", str(tmp_path / "data")]
    )  # fmt: skip
    lines: list[str] = []
    try:
        _read_until(process, "(KServe v2 gRPC", lines)
        assert re.search(r"listening on https://\S+ \(KServe v2 HTTP", "\n".join(lines))
        assert re.search(r"listening on grpcs://127\.0\.0\.1:\d+ \(KServe v2 gRPC", lines[-1])
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()


def test_an_address_this_machine_does_not_have_is_named_as_the_host_not_the_port(
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sordino", "start", "--host", "192.0.2.1", "--insecure",
         "--http-port", "0", "--data-dir", str(tmp_path / "d")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert (
        "error: cannot listen on 192.0.2.1:0: Cannot assign requested address (this machine "
        "has no address 192.0.2.1); give --host one of its own addresses: 127.0.0.1 for "
        "this machine only, 0.0.0.0 for all of them"
    ) in result.stderr
    assert "another port" not in result.stderr and "Traceback" not in result.stderr
