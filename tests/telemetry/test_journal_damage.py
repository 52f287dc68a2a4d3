"""A journal file that is another program's database, or a sordino journal whose pages
are damaged: the server refuses the first without touching it, sets the second aside and
goes on journaling; the report commands say which it is instead of a traceback."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from sordino.telemetry.journal import Journal, JournalUnwritable
from sordino.telemetry.journal_reader import JournalReader, MissingJournal
from tests.telemetry.test_journal import _resources, _row


def _foreign(path: Path) -> bytes:
    """A database with tables of the journal's names that something else made."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE series (x)")
    conn.execute("CREATE TABLE events (y)")
    conn.commit()
    conn.close()
    return path.read_bytes()


def _damaged(path: Path) -> None:
    """A journal with rows, then the b-tree header of every page after the first made
    invalid (the file's header stays whole: SQLite opens it and finds the damage when it
    reads a table). Not random bytes: those may land where no read looks."""
    journal = Journal(path)
    journal.open()
    journal.write_rows([_row(t) for t in range(100, 400)], _resources(100))
    assert journal.flush()
    journal.close()
    size = path.stat().st_size
    assert size > 3 * 4096
    with path.open("r+b") as handle:
        for offset in range(4096, size, 4096):
            handle.seek(offset)
            handle.write(b"\xff" * 12)


def test_another_programs_database_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    """Before: "cannot be written (no such column: t): free room on its disk" for the
    server, and a traceback (``OperationalError``) from ``sordino diagnose``."""
    path = tmp_path / "journal.sqlite3"
    before = _foreign(path)
    with pytest.raises(JournalUnwritable) as caught:
        Journal(path).open()
    assert str(caught.value) == (
        f"the journal {path} is not a sordino journal (it has no series.t, series.model, "
        "series.version, series.requests …): move it away, give --data-dir another folder, "
        "or run without a journal (telemetry.journal: false)"
    )
    assert path.read_bytes() == before
    with pytest.raises(MissingJournal, match=r"is not a sordino journal \(it has no series\.t"):
        JournalReader(path)


def test_a_damaged_journal_is_set_aside_and_a_new_one_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "journal.sqlite3"
    _damaged(path)
    with JournalReader(path) as reader, pytest.raises(MissingJournal) as caught:
        reader.window(0, 1000)
    assert "cannot be read (database disk image is malformed): it is damaged" in str(caught.value)
    journal = Journal(path)
    with caplog.at_level(logging.ERROR, logger="sordino.journal"):
        journal.open()
        journal.write_rows([_row(500)], None)
        assert journal.flush()
        journal.close()
    (aside,) = tmp_path.glob("journal.sqlite3.damaged-*")
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"the journal {path} was damaged (database disk image is malformed)")
    assert f"it is kept as {aside}" in said
    assert journal.statistics().rows_written == 1
    with JournalReader(path) as reader:
        assert reader.window(0, 1000).series == [_row(500)]


@pytest.mark.parametrize("kind", ["foreign", "damaged"])
def test_the_report_commands_say_what_the_journal_is(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "journal.sqlite3"
    if kind == "foreign":
        _foreign(path)
    else:
        _damaged(path)
    for command in (
        ["diagnose", "--output", str(tmp_path / "d.html")],
        ["postmortem", "--from", "1970-01-01 00:00", "--output", str(tmp_path / "p.html")],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "sordino", *command, "--data-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 1, done
        assert "Traceback" not in done.stderr
        last = done.stderr.strip().splitlines()[-1]
        if kind == "foreign":
            assert last.startswith(f"error: {path} is not a sordino journal (it has no series.t")
        else:
            assert last.startswith(f"error: the journal {path} cannot be read (database disk")
