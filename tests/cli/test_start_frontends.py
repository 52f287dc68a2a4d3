"""``sordino start --frontends 2``: port 0, both processes serve, SIGTERM ends both cleanly."""

from __future__ import annotations

import json
import os
import re
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


def test_start_with_two_front_ends_serves_and_stops_cleanly(tmp_path: Path) -> None:
    frontends: list[psutil.Process] = []
    with serving_grpc(["--frontends", "2", *DIGITS], tmp_path) as (process, lines):
        url = re.search(r"http://127\.0\.0\.1:\d+", "".join(lines))
        assert url, "".join(lines)
        frontends = [
            child
            for child in psutil.Process(process.pid).children()
            if "sordino.server.frontend_main" in " ".join(child.cmdline())
        ]
        assert len(frontends) == 1
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


def test_a_front_end_ends_with_its_engine(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "sordino", "start", "--http-port", "0", "--grpc-port", "0",
               "--frontends", "2", "--data-dir", str(tmp_path), *DIGITS]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if "grpc://" in line:
                break
        (frontend,) = [
            child
            for child in psutil.Process(process.pid).children()
            if "sordino.server.frontend_main" in " ".join(child.cmdline())
        ]
        process.kill()  # no stop, no drain: the front end sees the link close
        process.wait(30)
        frontend.wait(30)  # not its parent: psutil.TimeoutExpired if it lingers
        assert not frontend.is_running()
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)
