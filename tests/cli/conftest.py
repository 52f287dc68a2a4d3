"""Run ``sordino start`` as a real process and find the URL it prints."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import pytest

URL = re.compile(r"listening on (http://\S+)")

_BUILTIN = Path(str(resources.files("sordino.models.builtin")))
ONE_MODEL = ["--model", str(_BUILTIN / "simple.onnx")]
"""``sordino start`` arguments serving one small built-in model (one worker) instead of
all five: for tests about the server's process, ports or data dir, not its models."""
DIGITS = ["--model", str(_BUILTIN / "digits-classifier.onnx")]
"""Only ``digits-classifier`` (from its file: no labels or ``models.yaml`` settings)."""


@dataclass
class ServerProcess:
    process: subprocess.Popen[str]
    url: str
    lines: list[str] = field(default_factory=list)


def _pump(stream: object, sink: queue.Queue[str | None], lines: list[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.append(line.rstrip("\n"))
        sink.put(line)
    sink.put(None)


@contextmanager
def sordino_start(
    args: list[str],
    tmp_path: Path,
    timeout: float = 90.0,
    *,
    new_session: bool = False,
    prelude: str = "",
) -> Iterator[ServerProcess]:
    """Start ``sordino start ARGS --http-port 0`` and yield once it prints its URL.

    ``prelude`` (Python source) runs in the child before ``sordino`` does (to lower a
    limit, say): a ``python -c`` that ends by exec'ing the server, so that nothing runs
    between fork and exec (a ``preexec_fn`` there is unsafe in this threaded process).
    """
    cmd = [sys.executable, "-m", "sordino", "start", "--http-port", "0", "--grpc-port", "0",
           "--data-dir", str(tmp_path / "data"), *args]  # fmt: skip
    if prelude:
        cmd = [sys.executable, "-c", f"{prelude}\nimport os\nos.execv({cmd[0]!r}, {cmd!r})"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=new_session,
    )  # fmt: skip
    lines: list[str] = []
    sink: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(process.stdout, sink, lines), daemon=True).start()
    url = None
    try:
        while url is None:
            line = sink.get(timeout=timeout)
            if line is None:
                try:
                    code: int | str | None = process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    code = "none yet (its output was closed)"
                raise AssertionError(
                    f"sordino start exited early (exit status {code}):\n" + "\n".join(lines)
                )
            match = URL.search(line)
            if match:
                url = match.group(1)
        yield ServerProcess(process, url, lines)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


@contextmanager
def serving_grpc(
    args: list[str], data_dir: Path
) -> Iterator[tuple[subprocess.Popen[str], list[str]]]:
    """Start ``sordino start --http-port 0 --grpc-port 0 --data-dir DATA_DIR ARGS`` and yield
    the process and its output lines (newlines kept, still filled as it prints) once it has
    printed its gRPC URL: within 90 s, else an assertion showing the output. On leaving,
    SIGTERM it and wait for it (60 s) and for the last of its output (10 s)."""
    command = [sys.executable, "-m", "sordino", "start", "--http-port", "0", "--grpc-port", "0",
               "--data-dir", str(data_dir), *args]  # fmt: skip
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "grpc://" in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(90), "".join(lines)
        yield process, lines
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        reader.join(10)


@pytest.fixture
def start(tmp_path: Path):  # type: ignore[no-untyped-def]
    return lambda args: sordino_start(args, tmp_path)
