"""Telemetry while every file descriptor is taken (EMFILE): it goes on, and catches up.

A flood of connections can take every descriptor the process may open. The resource
sampler reads /proc and the journal writes SQLite; neither may stop the per-second
ticker or lose the journal for good.

Each scenario runs in a child process: taking every descriptor of the test process
itself would starve whatever else runs in it (servers of other tests, their threads).
"""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sordino.events import Event
from sordino.telemetry.journal import Journal
from sordino.telemetry.resources import ResourceSampler
from tests.telemetry.test_journal import _resources, _row


@contextmanager
def no_free_descriptors() -> Iterator[None]:
    """Open descriptors until the next one fails with EMFILE (under a lowered soft limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
    held: list[int] = []
    try:
        while True:
            try:
                held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                break
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _sampler_scenario() -> None:
    sampler = ResourceSampler(gpus=False)
    before = sampler.sample()
    with no_free_descriptors():
        during = sampler.sample()
    assert during.rss_bytes == before.rss_bytes
    assert sampler.sample().rss_bytes > 10 << 20  # read afresh once descriptors are free


def _journal_scenario(directory: Path) -> None:
    journal = Journal(directory / "j.sqlite3", flush_interval_s=0.05)
    journal.open()
    try:
        journal.write_rows([_row(100)], _resources(100))
        assert journal.flush()
        with no_free_descriptors():
            journal.write_rows([_row(101)], _resources(101))
            journal.write_event(Event("e", "s", "during EMFILE", {}, time=101.0))
            assert journal.flush()
        journal.write_rows([_row(102)], _resources(102))
        assert journal.flush()
        stats = journal.statistics()
        assert stats.rows_written >= 2 and stats.pending == 0
    finally:
        journal.close()


def _in_child(call: str) -> None:
    code = f"from pathlib import Path\nimport tests.telemetry.test_descriptors as t\nt.{call}\n"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-4000:]


def test_the_sampler_repeats_its_last_figures_when_proc_cannot_be_read() -> None:
    _in_child("_sampler_scenario()")


def test_the_journal_survives_running_out_of_descriptors(tmp_path: Path) -> None:
    _in_child(f"_journal_scenario(Path({str(tmp_path)!r}))")
