"""The postmortem's resource utilisation and time to repair, on a journal of known rows.

The journal is written with the server's own writer (:class:`Journal`): 40 seconds of
one model, a chaos fault followed by three seconds of failures, a later stretch of
failures no event explains, and a failure at the very end, so every figure is known.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.events import Event
from sordino.reports.postmortem import Postmortem, postmortem
from sordino.reports.postmortem_incidents import QUIET_S
from sordino.telemetry.journal import Journal
from sordino.telemetry.journal_reader import JournalReader
from sordino.telemetry.series import ResourceRow, SecondRow

T0 = 1_000_000
MIB = 2**20
# Failed requests a client saw, per second: (errors of accepted requests, refusals).
FAILURES = {7: (4, 0), 8: (4, 2), 9: (4, 0), 20: (1, 0), 23: (1, 0), 37: (1, 0)}


def _row(s: int) -> SecondRow:
    errors, refused = FAILURES.get(s, (0, 0))
    rejected = {"shed": refused} if refused else {}
    if s == 9:
        rejected["bad_tensor"] = 3  # the client's mistake: never a failure
    return SecondRow(
        T0 + s, "m", "1", 10, errors, {"unavailable": errors} if errors else {},
        5.0, 9.0, None, None, 2, 5.0, 0, 0.25 if s < 20 else 0.75, 10 - errors,
        rejected_by_reason=rejected,
    )  # fmt: skip


def _resources(s: int) -> ResourceRow:
    cpu = 150.0 if s == 10 else 50.0
    in_use = 48 * MIB if s == 30 else 16 * MIB
    return ResourceRow(T0 + s, 256 * MIB, cpu, 64 * MIB, in_use, None, None, None, None, None)


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    path = tmp_path / "data" / "journal.sqlite3"
    writer = Journal(path, wall=lambda: T0 + 60.0)
    writer.open()
    for s in range(40):
        writer.write_rows([_row(s)], _resources(s))
    writer.write_event(
        Event("fault_injected", "worker:m", "drill", {"id": "f1", "fault": "crash"}, T0 + 5.5)
    )
    acted = {"phase": "acted", "action_id": "a1", "trigger": "error_rate", "action": "restart"}
    writer.write_event(Event("guardian", "m", "errors", acted, T0 + 8.2))
    verdict = {**acted, "phase": "verdict", "verify": "passed", "rolled_back": False}
    writer.write_event(Event("guardian", "m", "errors", verdict, T0 + 25.0))
    assert writer.flush()
    writer.close()
    return path


def _postmortem(path: Path) -> Postmortem:
    with JournalReader(path) as reader:
        window = reader.window(T0, T0 + 40)
    return postmortem(window, name="drill", source=str(path))


def test_utilisation_mean_and_peak_per_resource(journal: Path) -> None:
    use = {u.resource: u for u in _postmortem(journal).resource_use}
    cpu = use["server CPU (% of one core)"]
    assert (cpu.mean, cpu.peak, cpu.peak_at, cpu.seconds) == (52.5, 150.0, T0 + 10, 40)
    memory = use["server resident memory"]
    assert (memory.mean, memory.peak, memory.unit) == (256.0, 256.0, "MiB")
    arena = use["arena in use (share of reserved)"]
    assert (arena.mean, arena.peak, arena.peak_at) == (26.25, 75.0, T0 + 30)
    busy = use["m: instances busy"]
    assert (busy.mean, busy.peak, busy.peak_at) == (50.0, 75.0, T0 + 20)
    assert "arena fragmentation" not in use and "GPU memory used" not in use  # not recorded


def test_time_to_repair_per_incident(journal: Path) -> None:
    assert QUIET_S == 5
    pm = _postmortem(journal)
    first, second, last = pm.incidents
    # The fault at +5.5 s opens it; the last failing second ends at +10 s.
    assert (first.start, first.repaired, first.time_to_repair) == (T0 + 5.5, T0 + 10, 4.5)
    assert (first.failed, first.seconds_with_errors) == (14, 3)  # 4+4+2+4; 4xx not counted
    assert first.cause == "chaos crash fault on worker:m; guardian restart (error_rate)"
    # +20 and +23 are one incident (only two clean seconds between them); the guardian's
    # verdict at +25 is not a new fault.
    assert (second.start, second.repaired, second.time_to_repair) == (T0 + 20, T0 + 24, 4.0)
    assert (second.failed, second.cause) == (2, "no journaled fault explains it")
    # +37 ends at +38, but the period ends before 5 clean seconds were seen.
    assert (last.start, last.repaired, last.time_to_repair) == (T0 + 37, None, None)
    targets = {row.what: row for row in pm.targets}
    repair = targets["time to repair (mean / median / worst of 3 incident(s))"]
    assert repair.actual == "4.2 / 4.2 / 4.5 s, 1 not repaired in the period"
    assert (repair.target, repair.verdict) == ("< 10 s", "missed")
    busy = targets["resource utilisation (instances busy: mean / peak second)"]
    assert busy.actual == "50.0% / 75.0%"


def test_postmortem_report_shows_both(journal: Path, tmp_path: Path) -> None:
    out = tmp_path / "pm.html"
    result = CliRunner().invoke(
        cli,
        ["postmortem", "--from", str(T0), "--to", str(T0 + 40), "--data-dir",
         str(journal.parent), "--output", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "time to repair (mean / median / worst of 3 incident(s))" in result.output
    page = out.read_text()
    assert "<h2>Incidents and time to repair</h2>" in page
    assert "<td>server CPU (% of one core)</td><td>52.5%</td><td>150.0%</td>" in page
    assert "<td>4.5 s</td><td>14</td>" in page
    assert "not repaired in the period" in page
