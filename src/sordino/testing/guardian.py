"""Doubles for testing the guardian on virtual time, without a server.

- :class:`ScriptedSeries`: the per-second rows the guardian reads, set by the test
  (``add(t, model, requests=..., errors=...)``), with the telemetry hub's interface;
- :class:`RecordingActions`: an action factory whose actions record when they were
  applied and reverted, with a scripted effect on the series;
- :class:`FakeDefragmenter` and :class:`FakeStepDegrader`: what the memory manager and
  the diffusion models provide (``Runtime.memory``, ``Runtime.step_degrader``), so the
  ``trigger_defrag`` and ``degrade_steps`` actions are tested on their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from sordino.config.self_healing import ActionSpec
from sordino.guardian.actions import Action, Applied
from sordino.inference import ModelKey
from sordino.telemetry.series import ResourceRow, SecondRow, SeriesStatistics

__all__ = [
    "DefragRecord",
    "FakeDefragmenter",
    "FakeStepDegrader",
    "RecordingActions",
    "ScriptedSeries",
    "row",
]


def row(t: int, model: str = "m", **values: Any) -> SecondRow:
    """A per-second row of ``model`` with every figure zero unless given."""
    base = SecondRow(
        t=t,
        model=model,
        version="1",
        requests=0,
        errors=0,
        errors_by_reason={},
        p50_ms=None,
        p99_ms=None,
        queue_ms=None,
        compute_ms=None,
        batches=0,
        batch_size=None,
        queue_depth=0,
        busy=0.0,
        slo_met=0,
    )
    return replace(base, **values)


class ScriptedSeries:
    """Rows a test sets second by second; ``last_closed`` is the newest second added."""

    def __init__(self) -> None:
        self.rows: dict[ModelKey, list[SecondRow]] = {}
        self.resources: list[ResourceRow] = []
        self.last_closed: int | None = None

    def add(self, t: int, model: str = "m", **values: Any) -> None:
        self.rows.setdefault(ModelKey(model, "1"), []).append(row(t, model, **values))
        self.last_closed = t if self.last_closed is None else max(self.last_closed, t)

    def recent(self, seconds: int | None = None) -> dict[ModelKey, list[SecondRow]]:
        return {k: list(v[-seconds:] if seconds else v) for k, v in self.rows.items()}

    def recent_resources(self, seconds: int | None = None) -> list[ResourceRow]:
        return list(self.resources)

    def statistics(self) -> SeriesStatistics:
        return SeriesStatistics(len(self.rows), 0, 0, self.last_closed)


@dataclass
class RecordingActions:
    """Makes actions that record their applies and reverts (times from ``now``)."""

    now: Callable[[], float]
    reversible: bool = True
    on_apply: Callable[[ActionSpec], None] | None = None
    applied: list[tuple[float, str]] = field(default_factory=list)
    reverted: list[tuple[float, str]] = field(default_factory=list)

    def __call__(self, spec: ActionSpec, model: str | None) -> Action:
        recorder = self

        class Recorded(Action):
            reversible = recorder.reversible

            async def apply(self, reason: str) -> Applied:
                recorder.applied.append((recorder.now(), str(self.spec)))
                if recorder.on_apply is not None:
                    recorder.on_apply(self.spec)
                return Applied(f"did {self.spec}", {"reason": reason})

            async def revert(self) -> str | None:
                recorder.reverted.append((recorder.now(), str(self.spec)))
                return f"undid {self.spec}"

        return Recorded(spec, model, None)  # type: ignore[arg-type]


@dataclass(frozen=True)
class DefragRecord:
    """What a compaction reports (the memory manager's record has these fields)."""

    bytes_moved: int
    fragmentation_before: float
    fragmentation_after: float
    pause_s: float


class FakeDefragmenter:
    """A memory manager whose fragmentation a test sets and compaction brings down."""

    def __init__(self, fragmentation: float, after: float = 0.05) -> None:
        self.fragmentation = fragmentation
        self.after = after
        self.reasons: list[str] = []

    async def defragment(self, reason: str) -> DefragRecord:
        self.reasons.append(reason)
        before, self.fragmentation = self.fragmentation, self.after
        return DefragRecord(8 << 20, before, self.after, 0.004)


class FakeStepDegrader:
    """Records the step factors it was given (None: full steps)."""

    def __init__(self) -> None:
        self.factors: list[float | None] = []

    def set_step_factor(self, factor: float | None) -> None:
        self.factors.append(factor)
