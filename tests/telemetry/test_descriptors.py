"""Telemetry while every file descriptor is taken (EMFILE): it goes on, and catches up.

A flood of connections can take every descriptor the process may open. The resource
sampler reads /proc and the journal writes SQLite; neither may stop the per-second
ticker or lose the journal for good.
"""

from __future__ import annotations

import errno
import os
import resource
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


def test_the_sampler_repeats_its_last_figures_when_proc_cannot_be_read() -> None:
    sampler = ResourceSampler(gpus=False)
    before = sampler.sample()
    with no_free_descriptors():
        during = sampler.sample()
    assert during.rss_bytes == before.rss_bytes
    assert sampler.sample().rss_bytes > 10 << 20  # read afresh once descriptors are free


def test_the_journal_survives_running_out_of_descriptors(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3", flush_interval_s=0.05)
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
