"""An alert channel that cannot deliver is refused when the guardian starts, not found
at its first alert (retried, then dropped with a warning in the log)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sordino.clock import MonotonicClock
from sordino.errors import ConfigError
from sordino.guardian.alerts import AlertSender
from sordino.testing.clock import VirtualClock


def test_a_file_channel_in_a_folder_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"the folder .*/missing does not exist; create it"):
        AlertSender([f"file:{tmp_path / 'missing' / 'alerts.jsonl'}"], clock=VirtualClock())


def test_a_file_channel_naming_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a folder; name a file"):
        AlertSender([f"file:{tmp_path}"], clock=VirtualClock())


async def test_a_file_channel_in_a_folder_that_exists_appends_each_record(
    tmp_path: Path,
) -> None:
    target = tmp_path / "alerts.jsonl"
    sender = AlertSender([f"file:{target}"], clock=MonotonicClock())
    await sender.start()
    try:
        sender.send({"explanation": "one"})
        sender.send({"explanation": "two"})
        for _ in range(200):
            if sender.counts()[0] == 2:
                break
            await asyncio.sleep(0.05)
    finally:
        await sender.stop()
    rows = [json.loads(line) for line in target.read_text(encoding="utf-8").splitlines()]
    assert [row["explanation"] for row in rows] == ["one", "two"]
