"""diagnose suggests increase_memory_pool when the journal shows the arena short of space."""

from __future__ import annotations

from sordino.reports.diagnose import diagnose
from sordino.telemetry.journal_reader import JournalWindow
from sordino.telemetry.series import ResourceRow, SecondRow

MIB = 1 << 20


def _pool(t: int, in_use: int, reserved: int = 512 * MIB) -> ResourceRow:
    return ResourceRow(t, 900 * MIB, 50.0, reserved, in_use, 0.1, None, None, None, None)


def _second(t: int, refused: int = 0, failed: int = 0) -> SecondRow:
    errors = {"out_of_memory": failed} if failed else {}
    return SecondRow(t, "sdxl", "1", 20, failed, errors, 40.0, 80.0, 5.0, 30.0, 4, 5.0, 2,
                     0.5, 20 - failed, rejected_by_reason={"out_of_memory": refused} if refused
                     else {})  # fmt: skip


def _pressure(window: JournalWindow) -> list[str]:
    return [r for r in diagnose(window).recommendations if r.startswith("increase_memory_pool")]


def test_a_pool_near_full_and_refusals_for_memory_suggest_a_bigger_pool() -> None:
    seconds = range(1000, 1060)
    window = JournalWindow(
        1000.0, 1060.0,
        [_second(t, refused=3 if t % 10 == 0 else 0, failed=1 if t == 1030 else 0)
         for t in seconds],
        [_pool(t, 500 * MIB if t >= 1020 else 200 * MIB) for t in seconds],
        [],
    )  # fmt: skip
    (advice,) = _pressure(window)
    assert "at least 90% full for 40 s (at most 500 of 512 MiB in use)" in advice
    assert "19 requests failed or were refused for memory (out_of_memory)" in advice
    assert "`sordino reconfigure --memory-pool-size 1GB`" in advice


def test_refusals_alone_are_enough_and_a_roomy_pool_is_left_alone() -> None:
    seconds = range(1000, 1030)
    refused = JournalWindow(
        1000.0, 1030.0, [_second(t, refused=t == 1005) for t in seconds],
        [_pool(t, 100 * MIB, reserved=96 * MIB * 2) for t in seconds], [],
    )  # fmt: skip
    (advice,) = _pressure(refused)
    assert "1 requests failed or were refused" in advice and "full for" not in advice
    assert "--memory-pool-size 384MB" in advice
    roomy = JournalWindow(
        1000.0, 1030.0, [_second(t) for t in seconds], [_pool(t, 300 * MIB) for t in seconds], []
    )
    assert _pressure(roomy) == []
    # A few near-full seconds are a peak, not pressure.
    peak = JournalWindow(
        1000.0, 1030.0, [_second(t) for t in seconds],
        [_pool(t, 500 * MIB if t < 1005 else 100 * MIB) for t in seconds], [],
    )  # fmt: skip
    assert _pressure(peak) == []
