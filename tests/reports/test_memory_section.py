"""The diagnose report's memory section: fragmentation, pool use and defrag runs."""

from __future__ import annotations

from sordino.reports.diagnose import diagnose
from sordino.reports.render import memory_lines, render_html
from sordino.telemetry.journal_reader import JournalEvent, JournalWindow
from sordino.telemetry.series import ResourceRow


def _row(t: int, fragmentation: float) -> ResourceRow:
    return ResourceRow(t, 100 << 20, 10.0, 64 << 20, 16 << 20, fragmentation,
                       None, None, None, None)  # fmt: skip


def _defrag(t: float, moved: int, pause_s: float, reason: str) -> JournalEvent:
    payload = {"bytes_moved": moved, "pause_s": pause_s, "reason": reason,
               "fragmentation_before": 0.4, "fragmentation_after": 0.1}  # fmt: skip
    return JournalEvent(t, "memory", "defrag", "moved", payload)


def test_memory_section_sums_the_defrag_runs() -> None:
    window = JournalWindow(
        1000.0, 1010.0, [], [_row(1000 + i, 0.1 * (i % 4)) for i in range(10)],
        [_defrag(1003.0, 4 << 20, 0.004, "interval"), _defrag(1007.0, 2 << 20, 0.012, "manual")],
    )  # fmt: skip
    diagnosis = diagnose(window)
    lines = memory_lines(diagnosis)
    assert lines[0].startswith("shared-memory fragmentation (worst pool): mean 13.0%, max 30.0%")
    assert "pools in use: mean 25%" in lines[1]
    assert lines[2] == (
        "2 defragmentation runs (interval, manual): 6.0 MiB moved, pause max 12.0 ms, "
        "fragmentation 40.0% -> 10.0% on average"
    )
    html = render_html(diagnosis, [])
    assert "<h2>Memory</h2>" in html and "2 defragmentation runs" in html


def test_memory_section_without_runs_says_so() -> None:
    window = JournalWindow(1000.0, 1002.0, [], [_row(1000, 0.0)], [])
    assert memory_lines(diagnose(window))[-1] == "no defragmentation ran in this window"


def test_memory_section_lists_the_resizes() -> None:
    resize = JournalEvent(
        1001.0, "memory", "resize", "arena",
        {"bytes_before": 16 << 20, "bytes_after": 48 << 20, "pause_s": 0.003, "reason": "grow"},
    )  # fmt: skip
    window = JournalWindow(1000.0, 1002.0, [], [_row(1000, 0.0)], [resize])
    assert memory_lines(diagnose(window))[-1] == (
        "1 arena resizes, pause max 3.0 ms; last: 16 -> 48 MiB (grow)"
    )
