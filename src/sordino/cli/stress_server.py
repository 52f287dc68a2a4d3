"""The server ``sordino stress-test --model FILE`` starts for its run, and the run's failures.

:func:`own_server` runs ``sordino start --model FILE`` on a free loopback port for as
long as the run lasts, on the default data directory (so that its journal, with the
run's event marks, outlives the run) or on a temporary one when a server holds that.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

__all__ = ["Failure", "is_model_file", "own_server"]

_LISTENING = re.compile(r"listening on (http://\S+)")


class Failure(Exception):
    """A clear message for the person running the command."""


def _default_data_dir_is_free() -> bool:
    """Whether no server holds the journal of the default data directory now."""
    from sordino.config import ServerConfig, TelemetryConfig
    from sordino.telemetry.journal import in_use

    journal = ServerConfig().data_dir.expanduser() / TelemetryConfig().journal_file
    return not in_use(journal)


@contextmanager
def own_server(spec: str, config: Path | None, timeout_s: float = 120.0) -> Iterator[str]:
    """Run ``sordino start --model SPEC`` on a free loopback port while the block runs.

    It runs on the default data directory (or the one ``config`` names), so that its
    journal, with the run's event marks, is there for ``sordino postmortem`` after it;
    on a temporary one when a server holds the default one.
    """
    with tempfile.TemporaryDirectory(prefix="sordino-stress-") as temporary:
        data_dir = ["--data-dir", temporary]
        if _default_data_dir_is_free():
            data_dir = []
        else:
            click.echo(
                "note: a server holds the default data directory: this run's server keeps "
                "a temporary journal, so the run is not marked as an event",
                err=True,
            )
        cmd = [
            sys.executable,
            "-m",
            "sordino",
            "start",
            "--model",
            spec,
            "--host",
            "127.0.0.1",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            *data_dir,
        ]
        if config is not None:
            cmd += ["--config", str(config)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        process = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        lines: queue.Queue[str | None] = queue.Queue()
        seen: list[str] = []

        def pump() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        try:
            url = None
            while url is None:
                try:
                    line = lines.get(timeout=timeout_s)
                except queue.Empty:
                    late = f"the server for {spec} did not start in {timeout_s:g} s"
                    raise Failure(late) from None
                if line is None:
                    raise Failure(
                        f"the server for {spec} did not start:\n" + "".join(seen[-10:]).rstrip()
                    )
                seen.append(line)
                match = _LISTENING.search(line)
                if match:
                    url = match.group(1)
            click.echo(f"started a server for {spec} at {url}", err=True)
            yield url
        finally:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def is_model_file(spec: str) -> bool:
    """Whether ``--model`` names a model file (``PATH`` or ``NAME=PATH``), not a served model."""
    path = Path(spec.partition("=")[2] or spec).expanduser()
    return path.exists() or path.suffix == ".onnx" or os.sep in spec
