"""``sordino start`` in a terminal that goes away (an SSH session dropped, a closed tab),
or printing to a pipe whose reader goes away (``sordino start | head``).

The kernel hangs the terminal up and sends SIGHUP to the server. Its default ended the
process on the spot: requests in flight lost, and the arena's segment left in
``/dev/shm`` with its pages reserved (the resource tracker that would have removed it
shares the terminal and died with it). A hang-up now stops the server as SIGTERM does;
under ``nohup`` (SIGHUP ignored) it keeps serving. A pipe whose reader is gone failed
the next line the server printed: start-up ended ("error: [Errno 32] Broken pipe"), or
the stop did, with exit status 1; the server now serves on and prints nothing more.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import socket
import subprocess
import sys
import termios
import time
from pathlib import Path

import httpx
import pytest

from sordino.control.client import AdminClient
from tests.cli.conftest import DIGITS, ONE_MODEL, sordino_start
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm")

TOKEN = "hangup-test-token"


def _segments(pid: int) -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith(f"sordino-{pid}-")}


def _in_a_terminal() -> None:  # the child: a session of its own whose terminal is the pty
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_a_terminal_that_hangs_up_stops_the_server_gracefully(tmp_path: Path) -> None:
    master, slave = os.openpty()
    command = [sys.executable, "-m", "sordino", "start", *ONE_MODEL, "--http-port", "0",
               "--grpc-port", "0", "--data-dir", str(tmp_path / "data")]  # fmt: skip
    process = subprocess.Popen(
        command, stdin=slave, stdout=slave, stderr=slave, preexec_fn=_in_a_terminal
    )
    os.close(slave)
    try:
        printed = b""
        deadline = time.monotonic() + 90
        while b"grpc://" not in printed:  # read in this thread: a read held open elsewhere
            assert time.monotonic() < deadline, printed.decode(errors="replace")
            if select.select([master], [], [], 0.5)[0]:  # would keep the terminal alive
                printed += os.read(master, 65536)
        match = re.search(rb"listening on (http://\S+)", printed)
        assert match is not None, printed
        url = match.group(1).decode()
        assert httpx.get(url + "/v2/health/ready").status_code == 200
        segments = _segments(process.pid)
        assert segments, "the arena is a segment named after the server's pid"
        os.close(master)  # the terminal goes away: the kernel sends SIGHUP
        master = -1
        assert process.wait(timeout=60) == 0  # before: -1 (ended by SIGHUP)
        assert not segments & _segments(process.pid)  # before: the arena stayed behind
    finally:
        if master >= 0:
            os.close(master)
        if process.poll() is None:
            process.kill()
            process.wait(30)


def test_under_nohup_a_hang_up_changes_nothing(tmp_path: Path) -> None:
    ignore_hangups = "import signal\nsignal.signal(signal.SIGHUP, signal.SIG_IGN)"  # as nohup
    with sordino_start(ONE_MODEL, tmp_path, prelude=ignore_hangups) as running:
        running.process.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert running.process.poll() is None
        assert httpx.get(running.url + "/v2/health/ready").status_code == 200
        running.process.send_signal(signal.SIGTERM)
        assert running.process.wait(timeout=60) == 0
    assert "Traceback" not in "\n".join(running.lines)


def test_a_pipe_whose_reader_goes_away_leaves_the_server_serving(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "sordino", "start", *ONE_MODEL, "--http-port", str(port),
               "--grpc-port", "0", "--data-dir", str(tmp_path / "data")]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith(b"journal at")
        process.stdout.close()  # as `| head -1` does: the "loaded" line finds no reader
        url = f"http://127.0.0.1:{port}/v2/health/ready"

        def ready() -> bool:
            assert process.poll() is None, "the server ended"  # before: exit 2
            try:
                return httpx.get(url, timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, "the server to serve", timeout=90)
        # Ready answers as HTTP starts listening, a loop turn or so before start-up ends;
        # a SIGTERM in between is a stop during start-up (exit 143), not this test's.
        time.sleep(1.0)
        segments = _segments(process.pid)
        process.send_signal(signal.SIGTERM)  # "shutting down" and "stopped" go nowhere
        assert process.wait(timeout=60) == 0
        assert not segments & _segments(process.pid)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)


_PRINTING_MODEL = """
import logging
import sys

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        print("execute", len(requests))  # Triton's examples print
        print("to stderr", file=sys.stderr, flush=True)
        logging.getLogger("model").warning("a log line")
        sys.stdout.flush()
        return [
            pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "IN")])
            for r in requests
        ]
"""
_PRINTING_CONFIG = """
name: "printing"
backend: "python"
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 2 ] } ]
output [ { name: "IN", data_type: TYPE_FP32, dims: [ 2 ] } ]
"""


def test_a_python_model_that_prints_serves_on_after_the_pipe_closes(tmp_path: Path) -> None:
    """The workers hold copies of the server's streams: a model's print, to a pipe whose
    reader is gone, failed every request ("execute raised BrokenPipeError")."""
    (tmp_path / "repo" / "printing" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "printing" / "config.pbtxt").write_text(_PRINTING_CONFIG)
    (tmp_path / "repo" / "printing" / "1" / "model.py").write_text(_PRINTING_MODEL)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "sordino", "start", "--no-builtin", "--model-repository",
               str(tmp_path / "repo"), "--http-port", str(port), "--grpc-port", "0",
               "--data-dir", str(tmp_path / "data")]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert process.stdout is not None
        printed = b""
        while b"grpc://" not in printed:  # the model is loaded: its worker holds the pipe
            line = process.stdout.readline()
            assert line, printed.decode(errors="replace")
            printed += line
        process.stdout.close()  # the reader goes away
        infer = f"http://127.0.0.1:{port}/v2/models/printing/infer"
        body = {"inputs": [{"name": "IN", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}
        for _ in range(3):
            answer = httpx.post(infer, json=body, timeout=30)
            assert answer.status_code == 200, answer.text  # before: 500, BrokenPipeError
            assert answer.json()["outputs"][0]["data"] == [1, 2]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)


def test_a_reader_that_does_not_read_does_not_stop_the_server(tmp_path: Path) -> None:
    """``sordino start | less`` left at its first page, a terminal paused with Ctrl-S, a
    log driver that blocks: the pipe fills. Before, the ~450th error line (a model
    failing every request logs each) blocked the event loop in its write: the server
    answered nothing more, health checks included, until the reader read."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "sordino", "start", *DIGITS, "--http-port", str(port),
               "--grpc-port", "0", "--data-dir", str(tmp_path / "data")]  # fmt: skip
    env = {**os.environ, "SORDINO_ADMIN_TOKEN": TOKEN}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        assert process.stdout is not None
        while b"listening on http" not in process.stdout.readline():  # then never read
            assert process.poll() is None, "the server ended"
        AdminClient(url, TOKEN).inject("worker:digits-classifier", "error")
        body = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64],
                            "data": [1.0] * 64}]}  # fmt: skip
        with httpx.Client(base_url=url, timeout=30) as client:
            for _ in range(1_500):  # ~200 KB of error lines into a 64 KiB pipe
                assert (
                    client.post("/v2/models/digits-classifier/infer", json=body).status_code == 500
                )
            assert client.get("/v2/health/ready").status_code == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0  # (what still waits is given 2 s, then let go)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
