"""The README replay (``tools/newcomer.sh``) as a job that runs beside the rest of the suite.

The replay takes minutes of wall time but little CPU: most of it is waiting (servers
starting, ``sordino monitor`` watching for seconds, a profile's window, pip). Run in
turn, those minutes were a quarter of the suite; so ``tests/conftest.py`` starts the job
as soon as a session has collected
``tests/test_newcomer.py::test_the_readme_replays_on_a_fresh_copy``, and the test, which
comes near the end of the suite, waits for its result. What the replay does and checks
does not change; only when it starts.

The job runs at the tests' CPU priority: under ``nice`` it starved on a busy machine (its
first ``pip install`` made no progress in two minutes beside a load of 15), while the tests
are built to pass on a loaded machine, which the job's few busy minutes make it. Its
ports are outside the kernel's ephemeral range (``tools/newcomer.py``), so no port
another test is given can be one of the replay's.
Its output goes to a file, not a pipe nobody reads while the suite runs. The session's end
stops a job still running (``-x``, Ctrl-C, a test run without it): SIGINT, as Ctrl-C in its
terminal, which stops its servers and removes its copy; SIGKILL if that does not end it.

Under pytest-xdist (``PYTEST_XDIST_WORKER`` set) the test starts the job itself: there,
the worker it runs on is its own parallel lane.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
TEST_ID = "tests/test_newcomer.py::test_the_readme_replays_on_a_fresh_copy"
TIMEOUT_S = 1400.0  # from its start: two virtual environments and every example


@dataclass
class Job:
    """One running replay: its process group and the file its output goes to."""

    process: subprocess.Popen[bytes]
    log: IO[bytes]
    started: float


_job: Job | None = None


def command(skip: list[str]) -> list[str]:
    """``bash tools/newcomer.sh --skip LINE...``."""
    argv = ["bash", str(ROOT / "tools" / "newcomer.sh")]
    for line in skip:
        argv += ["--skip", line]
    return argv


def start(skip: list[str]) -> None:
    """Start the replay unless it already runs (or ran) in this process."""
    global _job
    if _job is not None:
        return
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by result() or stop())
    process = subprocess.Popen(
        command(skip), cwd=ROOT, env=os.environ.copy(), stdin=subprocess.DEVNULL,
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    _job = Job(process, log, time.monotonic())


def result(skip: list[str]) -> tuple[int, str]:
    """Wait for the replay (starting it if it was not), return its exit status and output.

    A replay still running :data:`TIMEOUT_S` after its start is stopped and reported
    as such (exit status -1).
    """
    start(skip)
    assert _job is not None
    left = TIMEOUT_S - (time.monotonic() - _job.started)
    try:
        code = _job.process.wait(timeout=max(left, 1.0))
        note = ""
    except subprocess.TimeoutExpired:
        _interrupt(_job)
        code, note = -1, f"\n(the replay did not end within {TIMEOUT_S:.0f} s; stopped)"
    _job.log.seek(0)
    output = _job.log.read().decode("utf-8", errors="replace") + note
    _job.log.close()
    return code, output


def stop() -> None:
    """Stop a replay that still runs (the session ends without waiting for it)."""
    if _job is not None and _job.process.poll() is None:
        _interrupt(_job)
    if _job is not None:
        _job.log.close()


def _interrupt(job: Job) -> None:
    """Ctrl-C to the replay's group (it stops its servers, removes its copy); then SIGKILL."""
    for sig, wait_s in ((signal.SIGINT, 60.0), (signal.SIGKILL, 30.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            job.process.wait(timeout=wait_s)
            return
