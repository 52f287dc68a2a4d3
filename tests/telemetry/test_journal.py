"""The SQLite journal: rows and events round-trip, retention, and surviving kill -9."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from sordino.events import Event
from sordino.telemetry.journal import SCHEMA, Journal, JournalInUse
from sordino.telemetry.journal_reader import JournalReader, MissingJournal
from sordino.telemetry.series import ResourceRow, SecondRow
from tests.waiting import wait_for


def _row(t: int, requests: int = 10, model: str = "m") -> SecondRow:
    return SecondRow(
        t=t, model=model, version="1", requests=requests, errors=1,
        errors_by_reason={"queue_timeout": 1}, p50_ms=1.0, p99_ms=2.0, queue_ms=0.1,
        compute_ms=0.5, batches=3, batch_size=3.3, queue_depth=2, busy=0.4, slo_met=9,
    )  # fmt: skip


def _resources(t: int) -> ResourceRow:
    return ResourceRow(t, 100 << 20, 12.5, None, None, None, None, None, None, None)


def test_rows_and_events_round_trip(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    journal.open()
    journal.write_rows([_row(100), _row(100, model="n")], _resources(100))
    journal.write_rows([_row(101)], None)
    journal.write_event(Event("fault_injected", "worker:m", "chaos API", {"id": "f1"}, time=100.5))
    assert journal.flush()
    stats = journal.statistics()
    assert (stats.rows_written, stats.events_written, stats.pending) == (3, 1, 0)
    journal.close()
    with JournalReader(tmp_path / "j.sqlite3") as reader:
        window = reader.window(0, 200)
        assert reader.span() == (100.0, 101.0)
    assert window.series[0] == _row(100)
    assert window.models == ["m", "n"]
    assert window.resources == [_resources(100)]
    (event,) = window.events
    assert (event.kind, event.subject, event.payload) == (
        "fault_injected",
        "worker:m",
        {"id": "f1"},
    )


def test_the_file_is_in_wal_mode(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    journal.open()
    journal.close()
    mode = sqlite3.connect(tmp_path / "j.sqlite3").execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_retention_prunes_old_rows(tmp_path: Path) -> None:
    now = [10_000.0]
    # A short flush interval wakes the idle writer thread often enough to prune soon.
    journal = Journal(
        tmp_path / "j.sqlite3",
        retention_s=100,
        flush_interval_s=0.05,
        prune_every_s=0.05,
        wall=lambda: now[0],
    )
    journal.open()
    journal.write_rows([_row(9_850), _row(9_990)], None)
    journal.write_event(Event("old", "x", time=9_800.0))
    assert journal.flush()
    wait_for(lambda: journal.statistics().pruned_rows >= 2, "the old row and event to be pruned")
    journal.close()
    with JournalReader(tmp_path / "j.sqlite3") as reader:
        window = reader.window(0, 20_000)
    assert [r.t for r in window.series] == [9_990]
    assert window.events == []


def test_a_missing_journal_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(MissingJournal, match=r"no journal at .*nowhere\.sqlite3"):
        JournalReader(tmp_path / "nowhere.sqlite3")


def _digits(client: httpx.Client) -> None:
    body = {
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]
    }
    response = client.post("/v2/models/digits-classifier/infer", json=body)
    assert response.status_code == 200


@pytest.mark.timeout(120)
def test_journal_survives_kill_9_and_matches_the_traffic(tmp_path: Path) -> None:
    """SIGKILL the real server mid-traffic: the file is intact and loses at most ~1 s."""
    process = subprocess.Popen(
        [sys.executable, "-m", "sordino", "start", "--data-dir", str(tmp_path),
         "--http-port", "0", "--grpc-port", "0", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        url = None
        assert process.stdout is not None
        for line in process.stdout:
            match = re.search(r"listening on (http://\S+)", line)
            if match:
                url = match.group(1)
                break
        assert url, "the server did not start"
        threading.Thread(target=process.stdout.read, daemon=True).start()
        sent: list[float] = []  # finish time of every answered request
        with httpx.Client(base_url=url, timeout=10) as client:
            start = time.time()
            while time.time() - start < 4.0:
                _digits(client)
                sent.append(time.time())
                time.sleep(0.01)
        kill_at = time.time()
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    path = tmp_path / "journal.sqlite3"
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    with JournalReader(path) as reader:
        window = reader.window(0, kill_at + 10)
    rows = window.rows_of("digits-classifier")
    journaled = sum(r.requests for r in rows)
    # Every request that finished more than ~2 s before the kill is in the journal ...
    assert journaled >= sum(1 for t in sent if t < kill_at - 2.2)
    # ... and nothing is invented.
    assert journaled <= len(sent)
    assert rows[-1].t >= int(kill_at) - 3
    # Per second, the journal matches what was sent in that second.
    per_second: dict[int, int] = {}
    for t in sent:
        per_second[int(t)] = per_second.get(int(t), 0) + 1
    for row in rows:
        if row.t in per_second and row.t < int(kill_at) - 2:
            assert abs(row.requests - per_second[row.t]) <= 2, row
    assert {e.kind for e in window.events} >= {"server_started", "model_loaded"}


def test_a_second_writer_of_one_journal_is_refused(tmp_path: Path) -> None:
    """Two servers on one data dir would mix their series: the second is refused."""
    first = Journal(tmp_path / "j.sqlite3")
    first.open()
    try:
        with pytest.raises(JournalInUse, match=rf"pid {os.getpid()}.*--data-dir"):
            Journal(tmp_path / "j.sqlite3").open()
    finally:
        first.close()
    again = Journal(tmp_path / "j.sqlite3")  # the lock went with the first one's close
    again.open()
    again.close()


def test_refusals_round_trip_and_an_older_journal_still_reads(tmp_path: Path) -> None:
    """Rows carry the requests refused before acceptance; a journal written before that
    column existed reads with none, and a server writing to it adds the column."""
    import dataclasses

    path = tmp_path / "old.sqlite3"
    now = int(time.time())  # recent: a writer prunes rows past its retention
    conn = sqlite3.connect(path)
    old_schema = SCHEMA.replace("    rejected_by_reason TEXT NOT NULL DEFAULT '{}',\n", "")
    assert old_schema != SCHEMA
    conn.executescript(old_schema)
    conn.execute(
        "INSERT INTO series VALUES (?, 'm', '1', 10, 1, ?, 1.0, 2.0, 0.1, 0.5, 3, 3.3, 2, 0.4,"
        " 9, NULL, NULL)",
        (now - 2, '{"queue_timeout": 1}'),
    )
    conn.commit()
    conn.close()
    with JournalReader(path) as reader:
        assert reader.window(0, now).series == [_row(now - 2)]
    journal = Journal(path)
    journal.open()
    rejected = {"invalid_request": 7, "shed": 2}
    refused = dataclasses.replace(_row(now - 1), rejected_by_reason=rejected)
    journal.write_rows([refused], None)
    assert journal.flush()
    journal.close()
    with JournalReader(path) as reader:
        rows = reader.window(0, now).series
    assert rows == [_row(now - 2), refused]
    assert (rows[1].client_errors, rows[1].refused, rows[1].received) == (7, 2, 19)


def test_a_full_disk_is_said_once_and_its_end_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A journal that cannot be written (here SQLite's own limit on the file's pages; a
    full disk gives the same "database or disk is full") is one error line, not a
    traceback every second, and the line when it is written again counts what was lost."""
    journal = Journal(tmp_path / "j.sqlite3")
    journal.open()
    journal.write_rows([_row(100)], None)
    assert journal.flush()
    conn = journal._conn
    assert conn is not None
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    big = {"text": "x" * 20_000}
    with caplog.at_level("DEBUG", logger="sordino.journal"):
        for i in range(5):
            journal.write_event(Event("fault_injected", "worker:m", "chaos", big, time=101 + i))
            assert journal.flush()
        stats = journal.statistics()
        assert (stats.failures, stats.items_lost, stats.events_written) == (5, 5, 0)
        conn.execute("PRAGMA max_page_count = 1073741823")
        journal.write_event(Event("fault_injected", "worker:m", "chaos", big, time=110))
        assert journal.flush()
    journal.close()
    loud = [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")]
    assert [r.levelname for r in loud] == ["ERROR", "WARNING"]
    assert "cannot be written (database or disk is full)" in loud[0].getMessage()
    assert "free room on its disk or give --data-dir a writable folder" in loud[0].getMessage()
    assert loud[0].exc_info is None  # no traceback for what the operator fixes
    assert "is written again; 5 items" in loud[1].getMessage()
    assert journal.statistics().events_written == 1
