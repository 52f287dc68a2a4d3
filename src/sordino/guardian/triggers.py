"""A trigger's state between evaluations, and the life of one action it applied.

:class:`TriggerState` is what the loop (``loop.py``) keeps per trigger: its next
action, cooldown, the last measure, and its actions applying, verifying or held;
:class:`RunningAction` one applied action from its start to its record (and revert).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sordino.config.self_healing import ActionSpec, TriggerConfig
from sordino.config.threshold import Threshold
from sordino.guardian.actions import Action, Applied, Verdict
from sordino.guardian.metrics import Measure

__all__ = ["RunningAction", "TriggerState"]


@dataclass(slots=True)
class RunningAction:
    """One applied action of a trigger, from its start to its record (and revert)."""

    action: Action
    started_wall: float
    started: float
    before: Measure
    p99_before: float | None
    qps_before: float | None = None
    detected: float | None = None
    applied: Applied | None = None
    applied_wall: float = 0.0
    verify_at: float = 0.0
    verdict: Verdict | None = None
    action_id: str = ""


@dataclass(slots=True)
class TriggerState:
    config: TriggerConfig
    threshold: Threshold
    specs: tuple[ActionSpec, ...]
    step: int = 0
    last_fired: float | None = None
    since_s: int | None = None
    holding_since: float | None = None
    clear_since: float | None = None
    measure: Measure | None = None
    shown: Measure | None = None
    holds: bool = False
    applying: RunningAction | None = None
    verifying: list[RunningAction] = field(default_factory=list)
    held: list[RunningAction] = field(default_factory=list)
    fired: int = 0

    @property
    def width(self) -> int:
        return max(1, round(self.config.window_s)) * (2 if self.threshold.change else 1)

    def running(self) -> list[RunningAction]:
        return ([self.applying] if self.applying else []) + self.verifying + self.held
