"""``sordino start`` after a hard crash, and under a low open-file limit."""

from __future__ import annotations

import os
import re
import resource
import signal
import sqlite3
from pathlib import Path

import httpx

from tests.cli.conftest import ONE_MODEL, sordino_start


def test_a_restart_removes_the_segment_a_killed_server_left(tmp_path: Path) -> None:
    """SIGKILL to the whole group leaves the arena in /dev/shm; the next start removes it."""
    records = tmp_path / "data" / "shm"
    with sordino_start(ONE_MODEL, tmp_path, new_session=True) as first:
        (record,) = records.iterdir()
        os.killpg(first.process.pid, signal.SIGKILL)
        first.process.wait(timeout=30)
    segment = Path("/dev/shm", record.name)
    assert segment.exists(), "SIGKILL runs no clean-up: the segment is left"
    with sordino_start(ONE_MODEL, tmp_path) as second:
        assert not segment.exists()
        assert httpx.get(f"{second.url}/v2/health/ready").status_code == 200
        (current,) = records.iterdir()  # the new server's own, and only that
        assert current.name != record.name
        second.process.send_signal(signal.SIGTERM)
        assert second.process.wait(timeout=60) == 0
    output = "\n".join(second.lines)
    assert re.search(
        rf"removed shared-memory segment {record.name} \(\d+ MiB\) left by pid "
        rf"{first.process.pid}, which is gone",
        output,
    ), output
    with sqlite3.connect(tmp_path / "data" / "journal.sqlite3") as journal:
        rows = journal.execute(
            "SELECT subject, cause FROM events WHERE kind = 'stale_segment_removed'"
        ).fetchall()
    assert rows == [(record.name, f"left by pid {first.process.pid}, which is gone")]
    assert list(records.iterdir()) == []  # a clean stop removes its own record


LOW_OPEN_FILE_LIMIT = """
import resource
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
"""


def test_start_raises_the_soft_open_file_limit_to_the_hard_one(tmp_path: Path) -> None:
    """A shell's 1,024 (here 256) soft limit would cap the connections the server can hold."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with sordino_start(ONE_MODEL, tmp_path, prelude=LOW_OPEN_FILE_LIMIT) as server:
        limits = Path(f"/proc/{server.process.pid}/limits").read_text()
    (line,) = [row for row in limits.splitlines() if row.startswith("Max open files")]
    soft = line.split()[3]
    expected = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    assert soft == expected or int(soft) >= 65536
