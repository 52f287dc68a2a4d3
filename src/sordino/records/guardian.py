"""What the guardian reports: each trigger against its threshold, the action budget, alerts."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "GuardianStatistics",
    "TriggerStatistics",
]


@dataclass(frozen=True, slots=True)
class TriggerStatistics:
    """One guardian trigger now: its metric's value against its threshold, its state."""

    name: str
    metric: str
    model: str | None
    threshold: str
    window_s: float
    value: float | None
    value_text: str
    holds: bool
    actions: tuple[str, ...]
    next_action: str
    cooldown_left_s: float
    active: tuple[str, ...]
    """Actions applied and not yet verified, or holding a change until the condition
    has stayed clear for the cooldown."""
    fired: int


@dataclass(frozen=True, slots=True)
class GuardianStatistics:
    """The guardian: its triggers, the hourly action budget, the records it left."""

    enabled: bool
    interval_s: float
    triggers: tuple[TriggerStatistics, ...]
    budget_per_hour: int
    actions_last_hour: int
    records: int
    alert_channels: tuple[str, ...]
    alerts_sent: int
    alerts_failed: int
    """Failed delivery attempts (each retry counts) and alerts dropped from a full queue."""
