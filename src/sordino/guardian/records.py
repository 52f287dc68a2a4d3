"""The guardian's diagnostic records: one when an action is applied, its verdict, a revert.

Each record is an event of kind :data:`EVENT_KIND` (``guardian``) whose ``phase`` says
which (:data:`ACTED`, :data:`VERDICT`, :data:`REVERTED`); the verdict and revert carry
the ``action_id`` of the action's first record, so readers merge them (the postmortem
counts the action once). Every record goes to the alert channels too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sordino.events import EventSink
from sordino.guardian.alerts import AlertSender
from sordino.guardian.metrics import Measure, describe_value
from sordino.guardian.triggers import RunningAction, TriggerState

__all__ = ["ACTED", "EVENT_KIND", "REVERTED", "VERDICT", "ActionRecorder", "span"]

log = logging.getLogger("sordino.guardian")

EVENT_KIND = "guardian"
# ``phase`` of a guardian record: the action as applied, its verdict, a later revert.
ACTED, VERDICT, REVERTED = "acted", "verdict", "reverted"


class ActionRecorder:
    """Writes the guardian's records to ``events`` (and ``alerts``), counting them."""

    def __init__(
        self, events: EventSink, wall: Callable[[], float], alerts: AlertSender | None
    ) -> None:
        self._events = events
        self._wall = wall
        self._alerts = alerts
        self.count = 0
        """Records written so far."""

    def condition(self, trigger: TriggerState, m: Measure | None) -> str:
        """The trigger's condition as ``m`` measured it, in words (a record's opening)."""
        config, threshold = trigger.config, trigger.threshold
        model = (m.model if m else None) or config.model
        subject = f"{config.metric} of {model}" if model else config.metric
        value = describe_value(config.metric, m.value if m else None, change=bool(threshold.change))
        limit = describe_value(config.metric, threshold.value, change=bool(threshold.change))
        if threshold.change:
            verb = "dropped" if threshold.change == "drop" else "rose"
            return (
                f"{subject} {verb} {value} in {span(config.window_s)} "
                f"(threshold {threshold.change} > {limit})"
            )
        return f"{subject} was {value} over {span(config.window_s)} (threshold {limit})"

    def acted(self, trigger: TriggerState, running: RunningAction) -> None:
        """Record the action (and alert) the moment it is applied; its verdict follows."""
        assert running.applied is not None
        explanation = (
            f"{self.condition(trigger, running.before)}; {running.applied.did}; "
            f"verdict after the {span(trigger.config.verify_s)} verify window"
        )
        self.emit(
            trigger,
            running,
            action=str(running.action.spec),
            observed=list(running.before.samples),
            value=running.before.value,
            verify="pending",
            rolled_back=None,
            reverted=False,
            explanation=explanation,
            phase=ACTED,
        )

    def verdict(
        self,
        trigger: TriggerState,
        running: RunningAction,
        after: Measure,
        rolled_back: bool,
        extra: str,
    ) -> None:
        """Record the verdict of ``running``, ``after`` its verify window."""
        assert running.applied is not None
        later = max(0.0, self._wall() - running.applied_wall)
        metric = trigger.config.metric
        after_text = describe_value(metric, after.value, change=bool(trigger.threshold.change))
        explanation = (
            f"{self.condition(trigger, running.before)}; {running.applied.did}; "
            f"{metric.replace('_', ' ')} {after_text} {later:.0f} s later{extra}"
        )
        if rolled_back:
            explanation += "; the change made things worse and was rolled back"
        self.emit(
            trigger,
            running,
            action=str(running.action.spec),
            observed=list(running.before.samples),
            value=running.before.value,
            verify=running.verdict or "not cleared",
            rolled_back=rolled_back,
            reverted=False,
            explanation=explanation,
            after=after.value,
            observed_after=list(after.samples),
            phase=VERDICT,
        )

    def emit(
        self,
        trigger: TriggerState,
        running: RunningAction,
        *,
        action: str,
        observed: list[float],
        value: float | None,
        verify: str,
        rolled_back: bool | None,
        reverted: bool,
        explanation: str,
        phase: str,
        **extra: Any,
    ) -> None:
        config = trigger.config
        model = running.before.model or config.model
        payload: dict[str, Any] = {
            "trigger": config.name,
            "metric": config.metric,
            "model": model,
            "threshold": str(config.threshold),
            "window_s": config.window_s,
            "observed": observed,
            "value": value,
            "action": action,
            "parameters": running.applied.parameters if running.applied else {},
            "detected": running.detected,
            "started": running.started_wall,
            "ended": self._wall(),
            "verify": verify,
            "rolled_back": rolled_back,
            "reverted": reverted,
            "explanation": explanation,
            "phase": phase,
            "action_id": running.action_id,
            **extra,
        }
        subject = f"{config.metric}/{model}" if model else config.metric
        self._events.emit(EVENT_KIND, subject, explanation, **payload)
        self.count += 1
        if self._alerts is not None:
            try:
                self._alerts.send(payload)
            except Exception:
                log.exception("queueing a guardian alert failed")


def span(seconds: float) -> str:
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:.0f} m"
    return f"{seconds:g} s"
