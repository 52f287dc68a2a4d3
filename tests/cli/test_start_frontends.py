"""``sordino start --frontends 2``: port 0, two front-end processes read every connection
(the engine none), ready as soon as start says so, SIGTERM and Ctrl-C end them all cleanly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
from click.testing import CliRunner

from sordino.cli.start import start
from tests.cli.conftest import DIGITS, serving_grpc


def test_a_bad_frontends_flag_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(start, ["--frontends", "0", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "frontends" in result.output and "Traceback" not in result.output


def _frontends(pid: int) -> list[psutil.Process]:
    return [
        child
        for child in psutil.Process(pid).children()
        if "sordino.server.frontend_main" in " ".join(child.cmdline())
    ]


def test_start_with_two_front_ends_serves_and_stops_cleanly(tmp_path: Path) -> None:
    frontends: list[psutil.Process] = []
    with serving_grpc(["--frontends", "2", *DIGITS], tmp_path) as (process, lines):
        url = re.search(r"http://127\.0\.0\.1:(\d+)", "".join(lines))
        assert url, "".join(lines)
        # Said ready: every front end listens already, the engine on neither port.
        with urllib.request.urlopen(f"{url.group(0)}/v2/health/ready", timeout=30) as ready:
            assert ready.status == 200
        frontends = _frontends(process.pid)
        assert len(frontends) == 2
        pids = ", ".join(str(f.pid) for f in frontends)
        assert f"front ends: 2 processes (pids {pids})" in "".join(lines)
        port = int(url.group(1))
        engine = psutil.Process(process.pid).net_connections(kind="tcp")
        assert not [c for c in engine if c.laddr.port == port and c.status == "LISTEN"]
        body = json.dumps(
            {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [1] * 64}]}
        ).encode()
        for _ in range(20):  # new connections each: the kernel spreads them over both
            request = urllib.request.Request(
                f"{url.group(0)}/v2/models/digits-classifier/infer", data=body, method="POST"
            )
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200
            with urllib.request.urlopen(f"{url.group(0)}/v2/health/ready", timeout=30) as ready_:
                assert ready_.status == 200
    output = "".join(lines)
    assert process.returncode == 0, output
    assert "Traceback" not in output and "stopped" in output
    for frontend in frontends:
        assert not frontend.is_running() or frontend.status() == psutil.STATUS_ZOMBIE


def _start_two_front_ends(tmp_path: Path, *, own_group: bool = False) -> subprocess.Popen[str]:
    """``sordino start --frontends 2`` on digits, read until it says it listens (its
    output stays on ``stdout``); ``own_group``: in a session of its own, as a terminal's
    foreground job is."""
    command = [sys.executable, "-m", "sordino", "start", "--http-port", "0", "--grpc-port", "0",
               "--frontends", "2", "--data-dir", str(tmp_path), *DIGITS]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=own_group,
    )  # fmt: skip
    assert process.stdout is not None
    for line in process.stdout:
        if "grpc://" in line:
            break
    return process


def test_front_ends_end_with_their_engine(tmp_path: Path) -> None:
    process = _start_two_front_ends(tmp_path)
    try:
        frontends = _frontends(process.pid)
        assert len(frontends) == 2
        process.kill()  # no stop, no drain: the front ends see the link close
        process.wait(30)
        for frontend in frontends:
            frontend.wait(30)  # not its parent: psutil.TimeoutExpired if it lingers
            assert not frontend.is_running()
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)


def test_ctrl_c_at_a_terminal_stops_the_engine_and_its_front_ends_in_order(
    tmp_path: Path,
) -> None:
    """Ctrl-C signals the terminal's whole foreground group: the front ends, in a group
    of their own, are stopped by the engine (none is restarted), with no traceback."""
    process = _start_two_front_ends(tmp_path, own_group=True)
    try:
        assert process.stdout is not None
        frontends = _frontends(process.pid)
        os.killpg(process.pid, signal.SIGINT)
        output = process.stdout.read()
        assert process.wait(60) == 0, output
        assert "Traceback" not in output and "stopped" in output
        assert "starting another" not in output, output
        for frontend in frontends:
            frontend.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
