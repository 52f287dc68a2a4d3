"""A postmortem's actions on the server: the guardian's, and people's (interventions).

:func:`guardian_actions` joins each guardian action's record to its later verdict
(:class:`GuardianAction`); :func:`interventions` lists chaos faults, admin calls and
reconfigurations (:class:`Intervention`); event marks only name the period.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sordino.telemetry.journal_reader import JournalEvent

__all__ = ["GuardianAction", "Intervention", "guardian_actions", "interventions"]

# Event marks name the period (a person, or `sordino stress-test`, wrote them) but change
# nothing in the server: they are not interventions.
_INTERVENTION_KINDS = ("fault_injected", "fault_cleared", "admin_call")


@dataclass(frozen=True, slots=True)
class GuardianAction:
    t: float
    trigger: str
    action: str
    started: float | None
    ended: float | None
    verify: str
    outcome: str  # "succeeded", "rolled back" or "unknown"
    explanation: str


@dataclass(frozen=True, slots=True)
class Intervention:
    t: float
    kind: str
    subject: str
    detail: str


def guardian_actions(events: Iterable[JournalEvent]) -> list[GuardianAction]:
    """One entry per action: a verdict record completes the record its action wrote
    when it acted (same ``action_id``); one whose action record is not in the window (or
    a journal from before records were split) counts as the action itself."""
    out: list[GuardianAction] = []
    acted: dict[str, int] = {}
    for e in events:
        if e.kind != "guardian":
            continue
        p = e.payload
        rolled = p.get("rolled_back")
        if p.get("verify") == "pending":
            outcome = "pending"
        else:
            outcome = "rolled back" if rolled else ("succeeded" if rolled is False else "unknown")
        action_id = p.get("action_id")
        first = acted.get(str(action_id)) if p.get("phase") == "verdict" else None
        entry = GuardianAction(
            t=e.t if first is None else out[first].t,
            trigger=str(p.get("trigger", e.cause or "?")),
            action=str(p.get("action", e.subject)),
            started=_number(p.get("started")),
            ended=_number(p.get("ended")),
            verify=str(p.get("verify", "")),
            outcome=outcome,
            explanation=str(p.get("explanation", "")),
        )
        if first is not None:
            out[first] = entry
            continue
        if p.get("phase") == "acted" and action_id is not None:
            acted[str(action_id)] = len(out)
        out.append(entry)
    return out


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def interventions(events: Iterable[JournalEvent]) -> list[Intervention]:
    out = []
    for e in events:
        if e.kind not in _INTERVENTION_KINDS and not e.kind.startswith("reconfig"):
            continue
        p = e.payload
        if e.kind == "fault_injected":
            extra = f" +{p['latency_s'] * 1000:.0f} ms" if p.get("latency_s") else ""
            duration = f" for {p['duration_s']:g} s" if p.get("duration_s") else ""
            detail = f"{p.get('fault')} fault{extra} at rate {p.get('rate')}{duration} ({e.cause})"
        elif e.kind == "fault_cleared":
            detail = f"{p.get('fault')} fault {p.get('id')} cleared ({e.cause})"
        elif e.kind == "admin_call":
            detail = f"{p.get('action')} ({e.cause}): {p.get('outcome')}"
        else:
            detail = e.cause or ", ".join(f"{k}={v}" for k, v in p.items())
        out.append(Intervention(e.t, e.kind, e.subject, detail))
    return out
