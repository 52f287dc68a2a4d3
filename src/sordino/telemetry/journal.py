"""The journal: per-second series and events in SQLite (WAL mode) under ``data_dir``.

Writes never happen on the request path or the event loop. Producers put rows and
events on a queue (``write_rows``, ``write_event``: never blocking); one writer
thread drains the queue and commits everything it found in one transaction, at
least every ``flush_interval``. SQLite in WAL mode commits atomically, so killing
the process (even with SIGKILL) loses at most what was not yet committed, about a
second, and never leaves a corrupt file. Rows older than ``retention_s`` are pruned
by the same thread in the background.

One server writes a journal: :meth:`Journal.open` takes an exclusive ``flock`` on
``<journal>.lock`` beside it, held until :meth:`Journal.close` or the process ends, so
a second server on the same ``--data-dir`` is refused instead of mixing its series
into the first one's. Readers (``sordino diagnose``) take no lock.

Other processes may add events of the kinds in ``MARKS`` (``sordino event mark``
inserts them straight into the file): the writer thread reads those back after each
commit and puts them on :attr:`Journal.written_elsewhere`, so the running server shows
them among its recent events too.
"""

from __future__ import annotations

import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from sordino.events import Event
from sordino.telemetry.journal_file import (
    SCHEMA,
    JournalInUse,
    JournalUnwritable,
    NotAJournal,
    connect,
    damaged,
    in_use,
    lock,
    lock_path,
)
from sordino.telemetry.series import ResourceRow, SecondRow

MARK_KIND = "event_mark"
"""The events ``sordino event mark`` writes into the journal from its own process."""
MARKS = (MARK_KIND,)
"""Kinds only other processes write (never the server): read back as they land."""

__all__ = [
    "MARK_KIND",
    "SCHEMA",
    "Journal",
    "JournalInUse",
    "JournalStatistics",
    "connect",
    "encode_payload",
    "in_use",
    "lock_path",
    "write_mark",
]

log = logging.getLogger("sordino.journal")


_SERIES_SQL = f"INSERT OR REPLACE INTO series VALUES ({', '.join('?' * 18)})"
_RESOURCES_SQL = f"INSERT OR REPLACE INTO resources VALUES ({', '.join('?' * 10)})"
_EVENTS_SQL = "INSERT INTO events (t, kind, subject, cause, payload) VALUES (?, ?, ?, ?, ?)"
_STOP = object()


def encode_payload(payload: dict[str, Any]) -> str:
    """Events' payloads as JSON; values JSON cannot hold are written as their ``str``."""
    return orjson.dumps(payload, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


def write_mark(path: Path, name: str, edge: str, *, t: float, cause: str, note: str = "") -> None:
    """Insert a ``MARK_KIND`` event (the ``edge``, start or end, of period ``name``) at ``path``.

    Written from this process straight into the file, while the server's writer runs or
    after it stopped (WAL mode: each waits up to 10 s for the other's transaction); the
    server reads it back (:attr:`Journal.written_elsewhere`). Raises
    :class:`FileNotFoundError` when there is no journal at ``path`` (a mark never creates
    one) and :class:`sqlite3.Error` when the file cannot take it.
    """
    if not path.is_file():
        raise FileNotFoundError(f"no journal at {path}")
    payload = {"edge": edge, "note": note} if note else {"edge": edge}
    conn = sqlite3.connect(str(path), timeout=10)
    try:
        with conn:
            conn.execute(_EVENTS_SQL, (t, MARK_KIND, name, cause, encode_payload(payload)))
    finally:
        conn.close()


def _series_values(row: SecondRow) -> tuple[Any, ...]:
    values = list(astuple(row))
    values[5] = orjson.dumps(row.errors_by_reason).decode()
    values[17] = orjson.dumps(row.rejected_by_reason).decode()
    return tuple(values)


@dataclass(frozen=True, slots=True)
class JournalStatistics:
    """What the writer has done; ``pending`` items wait in its queue."""

    path: str
    rows_written: int
    events_written: int
    commits: int
    pending: int
    pruned_rows: int
    failures: int
    items_lost: int
    """Queued items (a second's series, an event) whose transaction failed."""
    last_commit: float | None


class Journal:
    """Writes the series and events of one server to its SQLite journal."""

    def __init__(
        self,
        path: Path,
        *,
        retention_s: float = 7 * 86400.0,
        flush_interval_s: float = 1.0,
        prune_every_s: float | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self._retention = retention_s
        self._flush_interval = flush_interval_s
        self._prune_every = prune_every_s or min(600.0, max(retention_s / 10, 1.0))
        self._wall = wall
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self._rows = self._events = self._commits = self._pruned = self._failures = 0
        self._lost = self._lost_before = 0  # items whose write failed, and before this run
        self._failing_since: float | None = None  # wall time of a run of failures' first
        self._last_commit: float | None = None
        self._idle = threading.Condition()
        self._submitted = self._done = 0
        self._lock: IO[str] | None = None
        self.written_elsewhere: queue.SimpleQueue[Event] = queue.SimpleQueue()
        """Events another process added to the file (``MARKS``), oldest first."""
        self._seen = 0

    # -- lifecycle -------------------------------------------------------------------

    def open(self) -> None:
        """Lock the journal, create the file and tables, start the writer.

        Raises :class:`JournalInUse` when another server (any process) writes this
        journal, :class:`JournalUnwritable` when the file cannot be created or written.
        """
        try:
            self._lock = lock(self.path)
            try:
                self._conn = connect(self.path)
                self._seen = self._conn.execute("SELECT MAX(id) FROM events").fetchone()[0] or 0
            except sqlite3.DatabaseError as exc:
                if not damaged(exc) or not self._set_aside(exc):
                    raise
            self._prune()
        except JournalInUse:
            raise
        except (OSError, sqlite3.Error) as exc:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._unlock()
            raise JournalUnwritable(self._unwritable(exc)) from exc
        except BaseException:
            self._unlock()
            raise
        self._thread = threading.Thread(target=self._run, name="sordino-journal", daemon=True)
        self._thread.start()

    def _unwritable(self, exc: OSError | sqlite3.Error) -> str:
        """Why the journal cannot be opened, and what to do about it."""
        without = "or run without a journal (telemetry.journal: false)"
        if isinstance(exc, NotAJournal):
            return (
                f"the journal {self.path} is not a sordino journal (it has no {exc}): move "
                f"it away, give --data-dir another folder, {without}"
            )
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return (
            f"the journal {self.path} cannot be written ({reason}): free room on its disk, "
            f"give --data-dir a writable folder, {without}"
        )

    def close(self, timeout: float = 10.0) -> None:
        """Commit what is queued, then stop the writer, close the file and unlock it."""
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join(timeout)
        self._thread = None
        self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the descriptor releases the lock
            self._lock = None

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far is committed; False on timeout."""
        with self._idle:
            target = self._submitted
            return self._idle.wait_for(lambda: self._done >= target, timeout)

    # -- producers (any thread, never blocking) -------------------------------------

    def write_rows(self, rows: list[SecondRow], resources: ResourceRow | None) -> None:
        """Queue one closed second's rows (a :class:`SeriesRecorder` listener)."""
        if rows or resources is not None:
            self._put(("rows", rows, resources))

    def write_event(self, event: Event) -> None:
        """Queue one event (an :class:`EventSink` subscriber)."""
        self._put(("event", event))

    def _put(self, item: Any) -> None:
        with self._idle:
            self._submitted += 1
        self._queue.put(item)

    # -- the writer thread -----------------------------------------------------------

    def _run(self) -> None:
        assert self._conn is not None
        next_prune = time.monotonic() + self._prune_every
        stop = False
        while not stop:
            try:
                first = self._queue.get(timeout=self._flush_interval)
            except queue.Empty:
                first = None
            batch = [] if first is None else [first]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(item is _STOP for item in batch)
            items = [item for item in batch if item is not _STOP]
            if items:
                self._commit(items)
            self._read_elsewhere()
            if time.monotonic() >= next_prune:
                self._prune()
                next_prune = time.monotonic() + self._prune_every
        self._conn.close()
        self._conn = None

    def _commit(self, items: list[Any]) -> None:
        assert self._conn is not None
        series: list[tuple[Any, ...]] = []
        resources: list[tuple[Any, ...]] = []
        events: list[tuple[Any, ...]] = []
        for item in items:
            if item[0] == "rows":
                series += [_series_values(row) for row in item[1]]
                if item[2] is not None:
                    resources.append(astuple(item[2]))
            else:
                e: Event = item[1]
                events.append((e.time, e.kind, e.subject, e.cause, encode_payload(e.payload)))
        try:
            with self._conn:  # one transaction: all of it lands, or none
                self._conn.executemany(_SERIES_SQL, series)
                self._conn.executemany(_RESOURCES_SQL, resources)
                self._conn.executemany(_EVENTS_SQL, events)
        except sqlite3.Error as exc:
            self._failures += 1
            self._failed("write", exc)
            self._lost += len(items)
        else:
            if self._failing_since is not None:
                log.warning(
                    "the journal %s is written again; %d items (series seconds and events) "
                    "were lost in the %.0f s it could not be",
                    self.path,
                    self._lost - self._lost_before,
                    self._wall() - self._failing_since,
                )
                self._failing_since = None
            self._rows += len(series)
            self._events += len(events)
            self._commits += 1
            self._last_commit = self._wall()
        with self._idle:
            self._done += len(items)
            self._idle.notify_all()

    def _read_elsewhere(self) -> None:
        """Queue the ``MARKS`` events other processes committed since the last look."""
        assert self._conn is not None
        try:
            rows = self._conn.execute(
                f"SELECT id, t, kind, subject, cause, payload FROM events "
                f"WHERE id > ? AND kind IN ({', '.join('?' * len(MARKS))}) ORDER BY id",
                (self._seen, *MARKS),
            ).fetchall()
        except sqlite3.Error as exc:
            if damaged(exc):
                self._failed("reading", exc)
            else:
                log.exception("reading the events written by other processes failed")
            return
        for row_id, t, kind, subject, cause, payload in rows:
            self._seen = max(self._seen, row_id)
            try:
                decoded = orjson.loads(payload)
            except orjson.JSONDecodeError:
                decoded = {}
            data = decoded if isinstance(decoded, dict) else {}
            self.written_elsewhere.put(Event(kind, subject, cause, data, time=float(t)))

    def _prune(self) -> None:
        assert self._conn is not None
        cutoff = self._wall() - self._retention
        try:
            with self._conn:
                pruned = 0
                for table in ("series", "resources", "events"):
                    pruned += self._conn.execute(
                        f"DELETE FROM {table} WHERE t < ?", (cutoff,)
                    ).rowcount
            self._pruned += pruned
        except sqlite3.Error as exc:
            self._failures += 1
            self._failed("pruning", exc)

    def _failed(self, what: str, exc: sqlite3.Error) -> None:
        """Say once that the journal cannot be written, not at every second it cannot.

        A full disk, a read-only or vanished file (``OperationalError``) is the operator's
        to fix: one line that says what is lost and where to look; another error is a
        defect, so its first comes with the traceback. The server serves on either way.
        """
        if damaged(exc) and self._failing_since is None and self._set_aside(exc):
            return  # (tried once a run of failures: one that cannot be set aside says so once)
        if self._failing_since is not None:
            log.debug("journal %s failed again: %s", what, exc)
            return
        self._failing_since = self._wall()
        self._lost_before = self._lost
        if isinstance(exc, sqlite3.OperationalError) or damaged(exc):
            log.error(
                "the journal %s cannot be written (%s): its series and events are lost "
                "until it can be (sordino_journal_write_failures_total counts the "
                "tries); free room on its disk or give --data-dir a writable folder",
                self.path,
                exc,
            )
        else:
            log.exception("journal %s failed; series and events are lost until it works", what)

    def _set_aside(self, exc: sqlite3.Error) -> bool:
        """Keep a damaged journal as ``<file>.damaged-<time>`` (its ``-wal`` and ``-shm``
        beside it) and write a new one in its place, so that the series go on; False,
        the file left where it is, when it cannot be moved or the new one made."""
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self._wall()))
        aside = f"{self.path}.damaged-{stamp}"
        if self._conn is not None:
            self._conn.close()
        try:
            for part in ("", "-wal", "-shm"):
                if os.path.exists(f"{self.path}{part}"):
                    os.replace(f"{self.path}{part}", f"{aside}{part}")
            self._conn = connect(self.path)
        except (OSError, sqlite3.Error) as failed:
            self._conn = sqlite3.connect(str(self.path), timeout=10, check_same_thread=False)
            log.error(
                "the journal %s is damaged (%s) and cannot be set aside: %s", self.path, exc, failed
            )
            return False
        self._seen = 0
        log.error(
            "the journal %s was damaged (%s): it is kept as %s (`sqlite3 FILE .recover` "
            "saves what it holds) and a new journal is written in its place",
            self.path,
            exc,
            aside,
        )
        return True

    def statistics(self) -> JournalStatistics:
        with self._idle:
            pending = self._submitted - self._done
        return JournalStatistics(
            path=str(self.path),
            rows_written=self._rows,
            events_written=self._events,
            commits=self._commits,
            pending=pending,
            pruned_rows=self._pruned,
            failures=self._failures,
            last_commit=self._last_commit,
            items_lost=self._lost,
        )
