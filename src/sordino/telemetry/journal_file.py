"""The journal's file: its tables, opening it, and the lock that keeps it one server's.

:func:`connect` opens (a writer: creates) the SQLite file; a database something else
made, with tables of the journal's names, is refused as :class:`NotAJournal` rather
than written into. :func:`damaged` tells SQLite's "not a database" and "malformed"
apart from a full disk or a read-only file: the writer sets a damaged journal aside
(:meth:`Journal._set_aside <sordino.telemetry.journal.Journal>`).
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from pathlib import Path
from typing import IO

from sordino.telemetry.journal_reader import lacking_text, missing_columns

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "JournalInUse",
    "JournalUnwritable",
    "NotAJournal",
    "connect",
    "damaged",
    "in_use",
    "lock",
    "lock_path",
]

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS series (
    t INTEGER NOT NULL, model TEXT NOT NULL, version TEXT NOT NULL,
    requests INTEGER NOT NULL, errors INTEGER NOT NULL, errors_by_reason TEXT NOT NULL,
    p50_ms REAL, p99_ms REAL, queue_ms REAL, compute_ms REAL,
    batches INTEGER NOT NULL, batch_size REAL, queue_depth INTEGER NOT NULL,
    busy REAL NOT NULL, slo_met INTEGER NOT NULL, fragmentation REAL, temperature_c REAL,
    rejected_by_reason TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (t, model, version)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS resources (
    t INTEGER PRIMARY KEY, rss_bytes INTEGER NOT NULL, cpu_percent REAL NOT NULL,
    pool_reserved_bytes INTEGER, pool_in_use_bytes INTEGER, fragmentation REAL,
    cpu_temp_c REAL, gpu_memory_used_bytes INTEGER, gpu_temp_c REAL, gpu_power_w REAL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, t REAL NOT NULL, kind TEXT NOT NULL,
    subject TEXT NOT NULL, cause TEXT NOT NULL, payload TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_time ON events (t);
CREATE INDEX IF NOT EXISTS events_by_kind ON events (kind, t);
"""
SCHEMA_VERSION = "1"


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """Open the journal at ``path`` (WAL mode; a writer also creates the tables)."""
    if readonly:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        conn.execute("PRAGMA query_only = ON")
        return conn
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), timeout=10, check_same_thread=False)
    try:
        return _prepared(conn)
    except BaseException:
        conn.close()
        raise


def _prepared(conn: sqlite3.Connection) -> sqlite3.Connection:
    """``conn`` in WAL mode with the journal's tables (a journal's older tables migrated).

    A database that has tables but not the journal's is refused before anything is
    written into it (:class:`NotAJournal`): it is some other program's file.
    """
    if conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchone() is not None:
        lacking = missing_columns(conn)
        if lacking:
            raise NotAJournal(lacking_text(lacking))
    conn.execute("PRAGMA journal_mode = WAL")
    # NORMAL in WAL mode: a commit survives a process crash; only power loss may undo
    # the last transactions, and the file is never corrupt either way.
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.executescript(SCHEMA)
    columns = {row[1] for row in conn.execute("PRAGMA table_info(series)")}
    if "rejected_by_reason" not in columns:  # a journal written before the column existed
        conn.execute("ALTER TABLE series ADD COLUMN rejected_by_reason TEXT NOT NULL DEFAULT '{}'")
    conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (SCHEMA_VERSION,))
    conn.commit()
    return conn


class JournalInUse(OSError):
    """Another server writes this journal (its series and events would mix with ours)."""


class JournalUnwritable(OSError):
    """The journal's file or folder cannot be made or written (full disk, read-only)."""


class NotAJournal(sqlite3.DatabaseError):
    """The journal's file is a database something else made (its message: what it lacks)."""


_DAMAGED = ("SQLITE_NOTADB", "SQLITE_CORRUPT")
"""SQLite's names for a file that is not a database, or one whose pages are damaged."""


def damaged(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's: the file is not a database, or its pages are damaged."""
    return getattr(exc, "sqlite_errorname", None) in _DAMAGED


def lock_path(path: Path) -> Path:
    """The lock file next to the journal at ``path``."""
    return path.with_name(path.name + ".lock")


def lock(path: Path) -> IO[str]:
    """Hold an exclusive lock on the journal's lock file until the file is closed.

    ``flock`` locks belong to the open file: another process, or another journal in
    this one, fails to take it; the lock goes when the holder closes the file or exits,
    however it exits, so a stale lock file never blocks a later start.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    target = lock_path(path)
    handle = open(target, "a+", encoding="utf-8")  # noqa: SIM115 - held until close()
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip()
        handle.close()
        who = f"pid {holder}" if holder.isdigit() else "another process"
        raise JournalInUse(
            f"the journal {path} is in use by another sordino server ({who}); give this "
            "server its own --data-dir (or telemetry.journal: false)"
        ) from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
    except OSError:
        handle.close()
        raise
    return handle


def in_use(path: Path) -> bool:
    """Whether a server holds the journal at ``path`` now (takes and drops its lock)."""
    target = lock_path(path)
    if not target.is_file():
        return False
    with open(target, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False
