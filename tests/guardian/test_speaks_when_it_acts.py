"""The guardian speaks when it acts: its record is journaled and its alert delivered at
the action, the verdict follows when the verify window closes (virtual time, a real
webhook receiver on loopback, a real journal)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from sordino.config.self_healing import SelfHealingConfig
from sordino.events import EventSink
from sordino.guardian import AlertSender, Guardian
from sordino.reports.postmortem import postmortem
from sordino.telemetry.journal import Journal
from sordino.telemetry.journal_reader import JournalReader
from sordino.testing import VirtualClock
from sordino.testing.guardian import RecordingActions, ScriptedSeries
from tests.webhook import Receiver, receiving

VERIFY_S = 20.0


async def _arrivals(receiver: Receiver, count: int) -> None:
    """Wait (real time, up to 10 s; the virtual clock stands still) for ``count`` alerts."""
    deadline = time.monotonic() + 10.0
    while len(receiver.arrived) < count:
        assert time.monotonic() < deadline, f"only {len(receiver.arrived)} of {count} alerts came"
        await asyncio.sleep(0.02)


def _journaled(path: Path) -> list[dict[str, Any]]:
    with JournalReader(path) as reader:
        return [e.payload for e in reader.latest_events("guardian", time.time() + 1)]


def _actions(path: Path) -> list[tuple[str, str]]:
    with JournalReader(path) as reader:
        window = reader.window(time.time() - 600, time.time() + 1)
    report = postmortem(window, name="peak", source=str(path))
    return [(a.action, a.verify) for a in report.guardian]


async def test_the_alert_and_the_record_come_at_the_action_the_verdict_after(
    tmp_path: Path,
) -> None:
    """restart_worker on 20 % errors: the webhook has the alert within 3 s of the action
    (long before the 20 s verify window closes), the journal has the record and the
    postmortem counts the action; the verdict arrives after the window, and the
    postmortem still counts one action, now cleared."""
    config = SelfHealingConfig.model_validate(
        {
            "enabled": True,
            "triggers": [
                {
                    "metric": "error_rate",
                    "threshold": "5%",
                    "window": "2s",
                    "verify_window": f"{VERIFY_S:g}s",
                    "action": "restart_worker",
                }
            ],
        }
    )
    clock = VirtualClock(start=0.0)
    series = ScriptedSeries()
    events = EventSink()
    journal = Journal(tmp_path / "journal.db")
    journal.open()
    events.subscribe(journal.write_event)
    actions = RecordingActions(clock.now, reversible=False)
    t = 0
    with receiving(clock.now) as hook:
        alerts = AlertSender([f"webhook:{hook.url}"], clock=clock)
        guardian = Guardian(
            config,
            series=series,
            make_action=actions,
            events=events,
            clock=clock,
            wall=clock.now,
            alerts=alerts,
        )

        async def second(errors: int) -> None:
            nonlocal t
            series.add(t, requests=100, errors=errors)
            t += 1
            for _ in range(2):
                await clock.advance(0.5)
                guardian.evaluate()
                await clock.settle()

        await alerts.start()
        try:
            while not actions.applied:
                await second(errors=20)
            ((acted_at, name),) = actions.applied
            assert name == "restart_worker"
            await _arrivals(hook, 1)
            ((arrived, alert),) = hook.arrived
            assert arrived - acted_at <= 3.0 and arrived < acted_at + VERIFY_S
            assert alert["phase"] == "acted" and alert["verify"] == "pending"
            assert "error_rate of m was 20 % over 2 s" in alert["explanation"]
            assert journal.flush()
            (record,) = _journaled(tmp_path / "journal.db")
            assert record["phase"] == "acted" and record["action"] == "restart_worker"
            assert _actions(tmp_path / "journal.db") == [("restart_worker", "pending")]

            while clock.now() < acted_at + VERIFY_S + 2 and len(hook.arrived) < 2:
                await second(errors=0)
            await _arrivals(hook, 2)
            verdict_at, verdict = hook.arrived[1]
            assert verdict_at >= acted_at + VERIFY_S
            assert verdict["phase"] == "verdict" and verdict["verify"] == "cleared"
            assert verdict["action_id"] == alert["action_id"]
            assert journal.flush()
            assert [r["phase"] for r in _journaled(tmp_path / "journal.db")] == [
                "acted",
                "verdict",
            ]
            assert _actions(tmp_path / "journal.db") == [("restart_worker", "cleared")]
        finally:
            await alerts.stop()
            journal.close()
